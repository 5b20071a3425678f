"""Plain HTTP on the WebSocket port: health, readiness, metrics and the browser page.

`process_request` is websockets' hook that runs before the opening handshake: it answers HTTP paths
itself and leaves a door's path to its handshake check (server/doors.py), which returns None for a request
that then becomes a WebSocket. `handle_body_request` and `select_subprotocol` route by the same table.
"""
from __future__ import annotations

import email.utils
import hmac
import http
import json
import logging
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence
from urllib.parse import parse_qs, urlsplit

from websockets.asyncio.server import ServerConnection
from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from .access import FORWARDED_FOR, forwarded_client
from .doors import door_for, load, post_door
from .model_info import MODEL_CARD_PATH, MODEL_PATH, model_card, model_info
from .protocol import STREAM_PATH

if TYPE_CHECKING:
    from .server import Server

STATIC_DIR = Path(__file__).resolve().parent.parent / "clients" / "static"
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
}
# A wildcard listening address names no host a browser can open (some refuse 0.0.0.0): this machine's instead.
LOOPBACK_FOR_WILDCARD = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}
log = logging.getLogger(__name__)
_STATIC_NAME = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]*$")  # one path component, no traversal


def response(status: int, body: bytes | str, content_type: str = "text/plain; charset=utf-8") -> Response:
    """A complete HTTP response (websockets closes the TCP connection after it)."""
    if isinstance(body, str):
        body = body.encode()
    status = http.HTTPStatus(status)
    headers = Headers([
        ("Date", email.utils.formatdate(usegmt=True)),
        ("Connection", "close"),
        ("Content-Length", str(len(body))),
        ("Content-Type", content_type),
        ("Cache-Control", "no-store"),
    ])
    return Response(status.value, status.phrase, headers, body)


def json_response(status: int, data: dict[str, Any]) -> Response:
    return response(status, json.dumps(data) + "\n", "application/json")


def listening_urls(host: str, port: int, tls: bool) -> tuple[str, str]:
    """The stream's ws:// address (where it listens) and the browser page's http:// address (where to open
    it on this machine), for the startup log; an IPv6 address goes in brackets."""

    def url_host(name: str) -> str:
        return f"[{name}]" if ":" in name else name

    stream = f"{'wss' if tls else 'ws'}://{url_host(host)}:{port}{STREAM_PATH}"
    page = f"{'https' if tls else 'http'}://{url_host(LOOPBACK_FOR_WILDCARD.get(host, host))}:{port}/"
    return stream, page


def request_token(request: Request) -> str | None:
    """The token a client sent with the handshake: `Authorization: Bearer …` or `?token=…`."""
    auth = request.headers.get("Authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    values = parse_qs(urlsplit(request.path).query).get("token")
    return values[0] if values else None


def token_matches(expected: str, given: str | None) -> bool:
    return given is not None and hmac.compare_digest(expected.encode(), given.encode())


def static_file(path: str) -> Response:
    """`/` is index.html; `/static/<name>` a file of clients/static with a known type; anything else 404."""
    name = "index.html" if path == "/" else path[len("/static/"):] if path.startswith("/static/") else None
    file = STATIC_DIR / name if name and _STATIC_NAME.match(name) else None
    content_type = CONTENT_TYPES.get(file.suffix) if file is not None else None
    if file is None or content_type is None or not file.is_file():
        return response(404, f"not found: {path}\n")
    return response(200, file.read_bytes(), content_type)


def client_address(ws: ServerConnection) -> str:
    """The client's IP address (no port), for per-address limits and logs: the TCP peer's, or behind a
    trusted proxy the one it forwarded (`note_client_address`, at the request)."""
    forwarded = getattr(ws, "forwarded_client", None)
    if forwarded is not None:
        return forwarded
    address = ws.remote_address
    return str(address[0]) if address else "unknown"


def note_client_address(app: Server, connection: ServerConnection, headers: Headers) -> None:
    """With --forwarded-allow-ips, remember the client a trusted proxy names (server/access.py)."""
    if app.trusted_proxies:
        peer = connection.remote_address
        connection.forwarded_client = forwarded_client(  # type: ignore[attr-defined]
            str(peer[0]) if peer else "unknown", headers.get_all(FORWARDED_FOR), app.trusted_proxies)


def token_refusal(app: Server, connection: ServerConnection, given: str | None, what: str,
                  missing_ok: bool = False) -> tuple[int, float] | None:
    """The --token policy's verdict on `given` (None: none was sent), one place for every door: (429,
    seconds to wait) while the client's address is in its cooldown, (401, 0) for a wrong or missing token
    (recorded against the address, server/access.py), None to go on. Each door words the refusal in its
    own protocol; `what` names the request in the log line (never the token itself)."""
    address = client_address(connection)
    wait = app.auth_failures.blocked(address)
    if wait:  # too many failed token checks from this address: no more guesses for a while
        app.metrics.sessions_refused.labels("auth_cooldown").inc()
        return 429, wait
    if (given is not None or not missing_ok) and not token_matches(app.config.token, given):
        app.auth_failures.record(address)
        app.metrics.sessions_refused.labels("unauthorized").inc()
        log.warning("refused %s from %s: %s token (HTTP 401)", what, address, "wrong" if given else "no")
        return 401, 0.0
    return None


def check_handshake_token(app: Server, connection: ServerConnection, request: Request, what: str) -> Response | None:
    """The token policy of a stream handshake (`what`: "a stream", for the log): an HTTP error response
    for an address in its cooldown or a wrong token, else None (the handshake goes on). A handshake
    without a token is allowed (browsers cannot set headers): the first message may carry it."""
    if app.config.token is None:
        return None
    given = request_token(request)
    refused = token_refusal(app, connection, given, what, missing_ok=True)
    if refused is not None and refused[0] == 429:
        answer = response(429, f"too many failed authentications; retry in {refused[1]:.0f} s\n")
        answer.headers["Retry-After"] = str(max(1, round(refused[1])))
        return answer
    if refused is not None:
        return response(401, "unauthorized: wrong token\n")
    connection.authenticated = given is not None  # type: ignore[attr-defined]
    return None


def process_request(app: Server, connection: ServerConnection, request: Request) -> Response | None:
    """Route one handshake request: answer HTTP, or return None to accept the WebSocket."""
    note_client_address(app, connection, request.headers)
    path = urlsplit(request.path).path
    if path == MODEL_PATH:  # before the doors: every other path under /v1/ is a door's (OpenAI's at the least)
        return json_response(200, model_info(app.model, app.punctuation_name))
    if path == MODEL_CARD_PATH:
        card = model_card(app.model)
        return response(200, card) if card is not None else response(404, f"{app.model_name} has no model card\n")
    door = door_for(path, "handshake")
    if door is not None:
        return load(door.handshake)(app, connection, request)
    answer = probe_response(app, path)
    if answer is not None:
        return answer
    if request.headers.get("Upgrade", "").lower() == "websocket":
        return response(404, f"no WebSocket endpoint at {path}; use {STREAM_PATH}\n")
    return static_file(path)


def probe_response(app: Server, path: str) -> Response | None:
    """The answers of a load balancer's or monitor's probes, to GET and HEAD: /healthz, /readyz, /metrics."""
    if path == "/healthz":
        return response(200, "ok\n")
    if path == "/readyz":
        status, body = app.readiness()
        return json_response(status, body)
    if path == "/metrics":
        body, content_type = app.metrics.render()
        return response(200, body, content_type)
    return None


async def handle_body_request(app: Server, exchange: Any, request: Any) -> None:
    """A request that is not a GET (server/http_body.py): HEAD of a probe (`curl -I`, a monitor's check),
    else the POST handler of the door at its path (server/doors.py)."""
    probe = probe_response(app, urlsplit(request.path).path) if request.method == "HEAD" else None
    if probe is not None:
        await exchange.respond(probe.status_code, probe.body, probe.headers["Content-Type"])
        return
    await load(post_door(request.path.split("?", 1)[0]).post)(app, exchange, request)


def select_subprotocol(connection: ServerConnection, offered: Sequence[str]) -> str | None:
    """The subprotocol to answer a WebSocket handshake with: the first of its door's (server/doors.py) that the
    client offered (a browser's Deepgram stream offers "token" and its key; OpenAI's browser SDK "realtime")."""
    request = connection.request
    door = door_for(urlsplit(request.path).path, "stream") if request is not None else None
    return next((name for name in door.subprotocols if name in offered), None) if door is not None else None
