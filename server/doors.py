"""The doors: every protocol a client may speak to the server, one row each, and the one table every router reads.

    process_request       (server/http.py)  a GET on the stream port: the handshake check of the door at its path
    handle_body_request   (server/http.py)  a request with a body: the POST handler of the door at its path
    select_subprotocol    (server/http.py)  the subprotocol of the door at the handshake's path
    Server._handle        (server/server.py)  an accepted WebSocket: the StreamConnection of the door at its path
    Server.startup        (server/server.py)  each door with a port of its own, when its config field is set

Handlers are named "module:attribute" (a module of this package) and imported on first use: a door costs
nothing until a client knocks, and FunASR's and Wyoming's modules load only when their port is configured.
Adding a door is a row here plus its module (and, for a port of its own, its ServerConfig field and flag).
"""
from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from typing import Any

from .deepgram_shapes import LISTEN_PATH, TOKEN_SUBPROTOCOL
from .protocol import STREAM_PATH
from .realtime_events import REALTIME_PATH, SUBPROTOCOL as REALTIME_SUBPROTOCOL


@dataclass(frozen=True)
class Door:
    """One way in. A door on the stream port owns `path` (with `prefix`, every path under it); a door with a
    port of its own has `port` and `start` instead. Each handler is optional: a door without one leaves
    that kind of request to the next row that has it."""

    name: str
    path: str | None = None
    prefix: bool = False  # `path` ends in "/" and the door owns every path under it
    slash_too: bool = False  # `path` + "/" (as typed or pasted) is this door too
    # (app, connection, request) -> Response | None: a GET's answer, or None to go on to the WebSocket
    handshake: str | None = None
    stream: str | None = None  # the StreamConnection subclass that serves its WebSockets
    post: str | None = None  # async (app, exchange, request): a request with a body (server/http_body.py)
    subprotocols: tuple[str, ...] = ()  # the WebSocket subprotocols it answers when a client offers one
    port: str | None = None  # the ServerConfig field of its own port (None there: the door stays shut) ...
    start: str | None = None  # ... and async (app) -> listener, which the Server closes on shutdown like its own

    def serves(self, path: str) -> bool:
        """Whether this door owns `path` (a request target's path, without the query) on the stream port."""
        if self.path is None:
            return False
        if self.prefix:
            return path.startswith(self.path)
        return path == self.path or (self.slash_too and path.rstrip("/") == self.path)


# The stream port's rows first, exact paths before OpenAI's prefix (a path matches the first row that owns it
# and has the handler asked for); then the doors with a port of their own.
DOORS = (
    # Realtime's subprotocol answered on Unipad's path too: the port answered it on every path before this
    # table (issue 56 kept the behaviour).
    Door("unipad", STREAM_PATH, slash_too=True, handshake="connection:check_handshake",
         stream="connection:Connection", subprotocols=(REALTIME_SUBPROTOCOL,)),
    Door("deepgram", LISTEN_PATH, handshake="deepgram_http:get_response", stream="deepgram_live:DeepgramConnection",
         post="deepgram_http:handle", subprotocols=(TOKEN_SUBPROTOCOL,)),
    Door("openai-realtime", REALTIME_PATH, handshake="realtime_handshake:check_handshake",
         stream="openai_realtime:RealtimeConnection", subprotocols=(REALTIME_SUBPROTOCOL,)),
    # OpenAI's API: every path under /v1/ that no row above claims
    Door("openai", "/v1/", prefix=True, handshake="openai_http:get_response", post="openai_http:handle"),
    Door("funasr", port="funasr_port", start="funasr:start"),
    Door("wyoming", port="wyoming_port", start="wyoming:start"),
)


def door_for(path: str, role: str) -> Door | None:
    """The first row that owns `path` and has a `role` handler ("handshake", "stream", "post"), or None."""
    return next((door for door in DOORS if door.serves(path) and getattr(door, role) is not None), None)


def door_named(name: str) -> Door:
    return next(door for door in DOORS if door.name == name)


def post_door(path: str) -> Door:
    """The door that answers a request with a body at `path`; a path none claims (POST /) gets OpenAI's API,
    whose 404 error object names the endpoints."""
    return door_for(path, "post") or door_named("openai")


def stream_door(path: str) -> Door:
    """The door whose StreamConnection serves a WebSocket at `path` (only a door's handshake accepts one;
    Unipad's is the default)."""
    return door_for(path, "stream") or door_named("unipad")


@functools.cache
def load(handler: str) -> Any:
    """The object a row names as "module:attribute", its module imported now."""
    module, _, attribute = handler.partition(":")
    return getattr(importlib.import_module(f".{module}", __package__), attribute)
