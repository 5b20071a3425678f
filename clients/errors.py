"""The client library's exceptions (clients/client.py raises them; `clients` exports them)."""
from __future__ import annotations


class ClientError(Exception):
    """Root of the client's exceptions."""


class ConnectError(ClientError):
    """The server could not be reached, or refused the WebSocket handshake (`status`: its HTTP status)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ServerError(ClientError):
    """The server sent an `error` message: `code` is the stable machine-readable code."""

    def __init__(self, code: str, message: str, segment: int | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.message, self.segment = code, message, segment


class StreamClosedError(ClientError):
    """The connection closed before `done`: `code` is the WebSocket close code (1008 policy, 1013 overloaded...)."""

    def __init__(self, code: int | None, reason: str = "") -> None:
        text = f"connection closed (code {code})" if code is not None else "connection lost without a close frame"
        super().__init__(f"{text}: {reason}" if reason else text)
        self.code = code
        self.reason = reason
