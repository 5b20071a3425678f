"""A loopback Hugging Face hub for download tests: the part of the hub's HTTP layout huggingface_hub's
file download uses (huggingface_hub/file_download.py: get_hf_file_metadata, http_get).

    HEAD/GET /{repo}/resolve/{revision}/{file}
        a plain git file: 200, X-Repo-Commit, ETag (the git blob id), Content-Length, the body on GET
        an LFS file: 302 to a "CDN" on another origin (http://localhost:PORT/cdn/...; the hub itself is
        http://127.0.0.1:PORT), with X-Repo-Commit, X-Linked-Etag (the sha256), X-Linked-Size
    GET /cdn/{sha256}  the LFS body; honours `Range: bytes=N-` with 206 and Content-Range
    unknown repo, revision or file: 404 with X-Error-Code as the hub sends it

and the part of ModelScope's that its client's file download uses (modelscope_hub 1.x), on the same port
for MODELSCOPE_ENDPOINT:

    GET /api/v1/models/{repo}/repo?Revision={revision}&FilePath={file}   the body, Range honoured
    anything else (e.g. its /api/v1/repos/internalAccelerationInfo probe): 404

Faults, per file name (`mirror.faults[name] = ...`): "500" (every request for it), "short" (the body stops
early with a matching Content-Length: the client sees fewer bytes than X-Linked-Size), "corrupt" (same
size, other bytes, the honest sha256 in the headers), "stall" (half the body, then wait for `release`);
`announced_sizes[name]` makes X-Linked-Size claim another size.
`requests` records (method, path, Range header) of every request; `errors` the tracebacks of handler
failures other than the client hanging up (the hub fixture of test_pull.py asserts there are none).
The server prints nothing: the tests read the pulling process's stderr, and this server runs in it.
"""
from __future__ import annotations

import hashlib
import sys
import threading
import traceback
from urllib.parse import parse_qs
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

COMMIT = "0123456789abcdef0123456789abcdef01234567"
MODELSCOPE_PREFIX = "/api/v1/models/"


@dataclass(frozen=True)
class MirrorFile:
    data: bytes
    lfs: bool

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def git_blob_id(self) -> str:
        return hashlib.sha1(b"blob %d\0" % len(self.data) + self.data).hexdigest()


class HubMirror:
    """`with HubMirror({"org/repo": {"model.pt": MirrorFile(...)}}) as hub:` serves on hub.endpoint."""

    def __init__(self, repos: dict[str, dict[str, MirrorFile]], revisions: tuple[str, ...] = ("main",)) -> None:
        self.repos, self.revisions = repos, set(revisions) | {COMMIT}
        self.faults: dict[str, str] = {}
        self.announced_sizes: dict[str, int] = {}  # X-Linked-Size to claim instead of the real size
        self.requests: list[tuple[str, str, str | None]] = []
        self.errors: list[str] = []
        self.stalled = threading.Event()  # set when a "stall" response has sent its first half
        self.release = threading.Event()
        self._server = _QuietServer(("127.0.0.1", 0), _handler(self))
        self._server.errors = self.errors
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> "HubMirror":
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.release.set()
        self._server.shutdown()
        self._server.server_close()

    def find(self, repo: str, revision: str, name: str) -> MirrorFile | None:
        if revision not in self.revisions:
            return None
        return self.repos.get(repo, {}).get(name)

    def by_sha256(self, sha256: str) -> tuple[str, MirrorFile] | None:
        for files in self.repos.values():
            for name, file in files.items():
                if file.sha256 == sha256:
                    return name, file
        return None


class _QuietServer(ThreadingHTTPServer):
    """socketserver prints a handler's exception to stderr, which is the stderr the tests read for the
    product's own error line. A client closing its connection early (ModelScope's client after a 404, or
    a killed download) is its right, not a fault of this server: ignored. Anything else is recorded."""

    errors: list[str]

    def handle_error(self, request, client_address) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):  # reset, broken pipe, aborted
            return
        self.errors.append(traceback.format_exc())


def _handler(hub: HubMirror) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # quiet test output
            pass

        def do_HEAD(self) -> None:
            self.answer(body=False)

        def do_GET(self) -> None:
            self.answer(body=True)

        def answer(self, body: bool) -> None:
            hub.requests.append((self.command, self.path, self.headers.get("Range")))
            path, _, query = self.path.partition("?")
            if path.startswith(MODELSCOPE_PREFIX) and path.endswith("/repo"):  # ModelScope's layout
                repo = path[len(MODELSCOPE_PREFIX):-len("/repo")]
                params = parse_qs(query)
                name, revision = params.get("FilePath", [""])[0], params.get("Revision", [""])[0]
                file = hub.find(repo, revision, name)
                if file is None:
                    return self.plain(404, None)
                return self.send_file(name, file, body=body)
            if path.startswith("/cdn/"):
                found = hub.by_sha256(path[len("/cdn/"):])
                if found is None:
                    return self.plain(404, "EntryNotFound")
                return self.send_file(*found, body=body)
            parts = path.lstrip("/").split("/")
            if len(parts) < 5 or parts[2] != "resolve":
                return self.plain(404, "RepoNotFound")
            repo, revision, name = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
            if repo not in hub.repos:
                return self.plain(404, "RepoNotFound")
            file = hub.find(repo, revision, name)
            if hub.faults.get(name) == "500":
                return self.plain(500, None)
            if file is None:
                return self.plain(404, "EntryNotFound" if revision in hub.revisions else "RevisionNotFound")
            if file.lfs:
                self.send_response(302)
                self.send_header("Location", f"http://localhost:{hub.port}/cdn/{file.sha256}")
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("ETag", f'"{file.git_blob_id}"')
                self.send_header("X-Linked-Etag", f'"{file.sha256}"')
                self.send_header("X-Linked-Size", str(hub.announced_sizes.get(name, len(file.data))))
                self.send_header("Content-Length", "0")
                self.end_headers()
                return None
            return self.send_file(name, file, body=body, etag=file.git_blob_id)

        def send_file(self, name: str, file: MirrorFile, body: bool, etag: str | None = None) -> None:
            fault = hub.faults.get(name)
            if fault == "500":
                return self.plain(500, None)
            data = file.data
            if fault == "corrupt":
                data = bytes(b ^ 0xFF for b in data[:64]) + data[64:]
            if fault == "short":
                data = data[: len(data) * 3 // 4]
            start = 0
            ranged = self.headers.get("Range", "")
            if ranged.startswith("bytes=") and ranged.endswith("-"):
                start = int(ranged[len("bytes="):-1])
            self.send_response(206 if start else 200)
            if start:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.send_header("Content-Length", str(len(data) - start))
            self.send_header("X-Repo-Commit", COMMIT)
            self.send_header("ETag", f'"{etag or file.sha256}"')
            self.end_headers()
            if not body:
                return None
            payload = data[start:]
            if fault == "stall":
                half = len(payload) // 2
                self.wfile.write(payload[:half])
                self.wfile.flush()
                hub.stalled.set()
                hub.release.wait(60)
                self.close_connection = True
                return None
            self.wfile.write(payload)
            return None

        def plain(self, status: int, error_code: str | None) -> None:
            message = b"error"
            self.send_response(status)
            if error_code:
                self.send_header("X-Error-Code", error_code)
            self.send_header("Content-Length", str(len(message)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(message)

    return Handler
