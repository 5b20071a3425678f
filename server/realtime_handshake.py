"""The OpenAI Realtime door's handshake: the token policy with the key also accepted as OpenAI's browser SDK
sends it (its path and subprotocol are server/realtime_events.py's; server/openai_realtime.py is the session
behind it)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from websockets.asyncio.server import ServerConnection
from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from .http import check_handshake_token, client_address, response

if TYPE_CHECKING:
    from .server import Server

KEY_SUBPROTOCOL = "openai-insecure-api-key."  # the browser SDK's key rides in a subprotocol: this, then the key


def check_handshake(app: Server, connection: ServerConnection, request: Request) -> Response | None:
    """The stream token policy, with the key also accepted as the browser SDK sends it (a subprotocol);
    OpenAI's clients have no first message to carry it, so a handshake without it is refused (401)."""
    headers = Headers(request.headers.raw_items())
    offered = [p.strip() for v in headers.get_all("Sec-WebSocket-Protocol") for p in v.split(",")]
    key = next((p[len(KEY_SUBPROTOCOL):] for p in offered if p.startswith(KEY_SUBPROTOCOL)), None)
    if key is not None and "Authorization" not in headers:
        headers["Authorization"] = f"Bearer {key}"
    refused = check_handshake_token(app, connection, Request(request.path, headers), "a realtime session")
    if refused is None and app.config.token is not None and not getattr(connection, "authenticated", False):
        app.auth_failures.record(client_address(connection))
        app.metrics.sessions_refused.labels("unauthorized").inc()
        return response(401, "unauthorized: send the token as the API key (Authorization: Bearer)\n")
    return refused
