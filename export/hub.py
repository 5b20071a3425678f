"""Download a catalogue model's released files into a staging directory, resumably, and check them.

Hugging Face goes through huggingface_hub's own calls: `get_hf_file_metadata` (a HEAD that follows the
hub's redirects and reads X-Repo-Commit, X-Linked-Etag, X-Linked-Size) and `http_get` (GET with a Range
header to resume, a progress bar, its own size check). The endpoint is $HF_ENDPOINT (mirrors), the token
$HF_TOKEN or `hf auth login`'s, proxies $HTTPS_PROXY / $HTTP_PROXY, all as huggingface_hub reads them.

Each file grows in STAGING/NAME.<etag id>.part, opened for appending, so an interrupted download (Ctrl-C,
a dropped connection, a full disk) continues where it stopped on the next run, and a changed upstream
file (a new etag) never continues an old one. A finished file is checked (size; sha256 against the
catalogue, else against the hub's LFS sha256 when it sends one) and only then renamed to STAGING/NAME.

ModelScope goes through its own client (`pip install -e '.[modelscope]'`; MODELSCOPE_ENDPOINT for a
mirror), which keeps and resumes its own partial downloads; the same size and sha256 checks follow.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import shutil
from pathlib import Path
from typing import Iterator
from urllib.parse import urlsplit

from pipeline.catalog import HubFile, HubSource

SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
PART_SUFFIX = ".part"
COMMIT_FILE = ".commit"
HASH_CHUNK = 1 << 20


class HubError(RuntimeError):
    """A download that cannot go on; the message is one line saying what to do."""


def hf_endpoint() -> str:
    """The endpoint huggingface_hub would use, read now (its constants are read once at import)."""
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def fetch_files(source: HubSource, files: tuple[HubFile, ...], staging: Path) -> dict:
    """Download each of `files` from `source` into `staging` (kept across runs). Returns provenance for
    the manifest: hub, repo, revision asked for, commit served, and each file's sha256."""
    staging.mkdir(parents=True, exist_ok=True)
    fetch = _fetch_hf if source.hub == "hf" else _fetch_modelscope
    served = staging / COMMIT_FILE  # the commit the hub said it served, kept for files of earlier runs
    for file in files:
        if commit := fetch(source, file, staging):
            served.write_text(commit, encoding="utf-8")
    commit = served.read_text(encoding="utf-8") if served.is_file() else None
    # Every file against the catalogue once more: one kept from an earlier run was checked by that run's
    # catalogue, which may have pinned less (or a partial download was finished by hand).
    sha256 = {f.name: check_file(staging / f.name, f, f.size, f.sha256, str(staging)) for f in files}
    return {"kind": "hub", "hub": source.hub, "repo": source.repo, "revision": source.revision, "commit": commit,
            "sha256": sha256}


def check_file(path: Path, file: HubFile, expected_size: int | None, expected_sha256: str | None, where: str) -> str:
    """Size and sha256 of a finished download; returns its sha256. A mismatch deletes it (it cannot be
    resumed into shape) and raises HubError."""
    size = path.stat().st_size
    problem, actual = None, ""
    if expected_size is not None and size != expected_size:
        problem = f"{size} bytes, expected {expected_size}"
    else:
        actual = sha256_of(path)
        if expected_sha256 is not None and actual != expected_sha256:
            problem = f"sha256 {actual}, expected {expected_sha256}"
    if problem:
        path.unlink()
        raise HubError(f"{where} {file.name}: {problem} (a corrupted download, or the source serves another "
                       "file); deleted it, run the same command again to download it afresh")
    return actual


def _fetch_hf(source: HubSource, file: HubFile, staging: Path) -> str | None:
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.utils import build_hf_headers

    target = staging / file.name
    if target.is_file():
        return None  # finished and checked on an earlier run
    endpoint = hf_endpoint()
    where = f"{endpoint}/{source.repo}"
    url = hf_hub_url(source.repo, file.name, revision=source.revision, endpoint=endpoint)
    with _hub_errors(where, file.name, source.revision):
        meta = get_hf_file_metadata(url, endpoint=endpoint)
    hub_sha256 = meta.etag if meta.etag and SHA256_RE.match(meta.etag) else None  # LFS files only
    if file.size is not None and meta.size is not None and meta.size != file.size:
        raise HubError(f"{where} {file.name}: the hub reports {meta.size} bytes, the catalogue {file.size}: not the "
                       "release this version knows (changed upstream, or a mirror serving another file)")
    if file.sha256 and hub_sha256 and hub_sha256 != file.sha256:
        raise HubError(f"{where} {file.name}: the hub reports sha256 {hub_sha256}, the catalogue {file.sha256}: "
                       "not the release this version knows (changed upstream, or a mirror serving another file)")
    size = file.size if file.size is not None else meta.size
    part = staging / f"{file.name}.{hashlib.sha1((meta.etag or '').encode()).hexdigest()[:12]}{PART_SUFFIX}"
    for stale in staging.glob(f"{file.name}.*{PART_SUFFIX}"):
        if stale != part:  # an older upstream version of this file: never continue it
            stale.unlink()
    done = part.stat().st_size if part.exists() else 0
    if size is not None and done > size:
        part.unlink()
        done = 0
    if size is not None:
        _check_free_space(staging, size - done)
    headers = build_hf_headers()
    if urlsplit(meta.location).netloc != urlsplit(url).netloc:
        headers.pop("authorization", None)  # a CDN's signed URL: the token stays with the hub
    with _hub_errors(where, file.name, source.revision), _disk_errors(staging, part):
        _http_get(meta.location, part, done, headers, size, file.name)
    check_file(part, file, size, file.sha256 or hub_sha256, where)
    os.replace(part, target)
    return meta.commit_hash


def _http_get(url: str, part: Path, done: int, headers: dict, size: int | None, name: str) -> None:
    from huggingface_hub.file_download import http_get

    with open(part, "ab") as f:
        try:
            http_get(url, f, resume_size=done, headers=headers, expected_size=size, displayed_filename=name)
        except OSError as exc:
            if "Consistency check failed" not in str(exc):
                raise
            got = f.tell()
            if size is not None and got > size:  # more than announced: nothing in it can be trusted
                f.truncate(0)
                raise HubError(f"{name}: the server sent {got} bytes, {size} were announced; the partial file was "
                               "emptied, run the same command again to download it afresh") from None
            raise HubError(f"{name}: the download stopped at {got} of {size} bytes (connection cut short, or a "
                           "server sending less than it announced); run the same command again to resume") from None


def _fetch_modelscope(source: HubSource, file: HubFile, staging: Path) -> str | None:
    target = staging / file.name
    if target.is_file():
        return None
    try:
        from modelscope.hub.file_download import model_file_download
    except ModuleNotFoundError:
        raise HubError("--source modelscope needs ModelScope's client: pip install -e '.[modelscope]'") from None
    download = staging / "modelscope"
    if file.size is not None:
        _check_free_space(staging, file.size)
    try:
        with _disk_errors(staging, download / file.name):
            path = Path(model_file_download(source.repo, file.name, revision=source.revision, local_dir=str(download)))
    except (HubError, KeyboardInterrupt):
        raise
    except Exception as exc:  # noqa: BLE001  (modelscope's errors share no base class)
        first_line = (str(exc).strip().splitlines() or [""])[0]  # its messages go on with the request and response
        raise HubError(f"ModelScope {source.repo} {file.name}: {type(exc).__name__}: {first_line}") from None
    check_file(path, file, file.size, file.sha256, f"ModelScope {source.repo}")
    os.replace(path, target)
    return None


@contextlib.contextmanager
def _hub_errors(where: str, name: str, revision: str) -> Iterator[None]:
    """Turns huggingface_hub's and the network's exceptions into one-line HubErrors."""
    from huggingface_hub.errors import (HfHubHTTPError, RemoteEntryNotFoundError, RepositoryNotFoundError,
                                        RevisionNotFoundError)

    try:
        yield
    except RemoteEntryNotFoundError:
        raise HubError(f"{where}: no file {name} at revision {revision} (404)") from None
    except RevisionNotFoundError:
        raise HubError(f"{where}: no revision {revision} (404)") from None
    except RepositoryNotFoundError as exc:
        raise HubError(f"{where}: no such repository, or it needs a token (HF_TOKEN) that was not given "
                       f"({_status(exc)})") from None
    except HfHubHTTPError as exc:
        raise HubError(f"{where} {name}: the hub answered {_status(exc)}; try again later (a second run "
                       "resumes), or use another source (--source, HF_ENDPOINT for a mirror)") from None
    except Exception as exc:
        if not _is_network_error(exc):
            raise
        raise HubError(f"cannot reach {where} ({type(exc).__name__}: {exc or 'no answer'}): offline? Set "
                       "HF_ENDPOINT for a mirror or HTTPS_PROXY for a proxy, or try --source modelscope") from None


def _status(exc) -> str:
    response = getattr(exc, "response", None)
    if response is None:
        return "an HTTP error"
    return f"HTTP {response.status_code} {getattr(response, 'reason_phrase', '')}".rstrip()


def _is_network_error(exc: BaseException) -> bool:
    """A transport failure of whichever HTTP library this huggingface_hub uses (httpx2, httpx, requests)."""
    libraries = {cls.__module__.split(".")[0] for cls in type(exc).__mro__}
    return bool(libraries & {"httpx2", "httpx", "requests", "urllib3"}) or isinstance(exc, ConnectionError)


@contextlib.contextmanager
def _disk_errors(directory: Path, path: Path) -> Iterator[None]:
    """ENOSPC while writing becomes one line naming the directory and its free space; the partial file
    stays, to be resumed once there is room."""
    try:
        yield
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
        raise HubError(f"disk full while writing {path} ({_free(directory)} free): free some space or set "
                       "UNIPAD_HOME to a larger disk, then run the same command again to resume") from None


def _check_free_space(directory: Path, needed: int) -> None:
    free = shutil.disk_usage(directory).free
    if needed > free:
        raise HubError(f"not enough disk space in {directory}: {needed / 1e6:.0f} MB to download, {free / 1e6:.0f} MB "
                       "free (set UNIPAD_HOME to a larger disk)")


def _free(directory: Path) -> str:
    try:
        return f"{shutil.disk_usage(directory).free / 1e6:.0f} MB"
    except OSError:
        return "unknown"
