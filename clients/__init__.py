"""Unipad ASR clients: an asyncio library (`connect`), file and microphone scripts, and the browser page
in `static/` that the server serves at `/`."""
from __future__ import annotations

from .client import DEFAULT_URL, Client, Stream, connect
from .errors import ClientError, ConnectError, ServerError, StreamClosedError

__all__ = ["DEFAULT_URL", "Client", "ClientError", "ConnectError", "ServerError", "Stream", "StreamClosedError",
           "connect"]
