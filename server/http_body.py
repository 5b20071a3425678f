"""HTTP requests with a body (POST) on the WebSocket port, next to websockets' handshakes.

Why this module exists: websockets (13 to 17) answers plain HTTP only through `process_request`, and its
HTTP parser reads handshakes, which have no body: a request with Content-Length or Transfer-Encoding is
refused before `process_request` runs ("unsupported request body"), and the whole exchange must fit in
its `open_timeout`. A POST of an audio file needs both a body and as long as the decoding takes.
So the port's connections are `BodyAwareConnection`s (websockets' `create_connection` hook): the request
method in the first bytes decides. A GET (every handshake, health check and page) goes to websockets
unchanged; any other method is read by h11 (python-hyper's sans-I/O HTTP/1.1: body framing by
Content-Length or chunked, Expect: 100-continue, chunked responses for streaming), and its handler answers
on the same transport. This is the cleanest fit we found: no second web framework on a second port,
websockets untouched for everything it already does, and the HTTP parsing done by a well-kept library.
"""
from __future__ import annotations

import asyncio
import email.utils
import http
import logging
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import h11
from websockets.asyncio.server import ServerConnection
from websockets.protocol import CONNECTING, OPEN
from websockets.datastructures import Headers

log = logging.getLogger(__name__)

MAX_HEAD = 16 << 10  # bytes of request line and headers
OPEN_TIMEOUT = 10.0  # seconds for a request head (and a WebSocket's opening handshake): websockets' default
BODY_TIMEOUT = 30.0  # seconds a request body may pause between packets
SEND_TIMEOUT = 30.0  # seconds the client has to take a response part
_PAUSE_AT = 1 << 20  # unparsed bytes at which reading pauses until the handler catches up


@dataclass(frozen=True)
class HttpRequest:
    method: str
    path: str  # the request target: path and query
    headers: Headers


class BodyTooLarge(Exception):
    """The request's body exceeds the handler's limit (answer 413)."""


class HttpExchange:
    """One request and its response on a transport, through h11; the connection closes after it."""

    def __init__(self, connection: BodyAwareConnection) -> None:
        self.connection = connection
        self.transport = connection.transport
        self._h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
        self._wake = asyncio.Event()
        self._paused = False
        self._head_only = False  # a HEAD request: responses carry no body
        self._declared_length: int | None = None  # the request's Content-Length

    def receive(self, data: bytes) -> None:
        """Bytes from the transport (b"" at EOF); called by the connection."""
        self._h11.receive_data(data)
        if len(self._h11.trailing_data[0]) > _PAUSE_AT and not self._paused:
            self.transport.pause_reading()
            self._paused = True
        self._wake.set()

    async def _next_event(self, timeout: float, deadline: float | None = None) -> Any:
        """The next h11 event, waiting at most `timeout` for each packet and ending by `deadline` (loop time)."""
        while True:
            event = self._h11.next_event()
            if event is not h11.NEED_DATA:
                return event
            if self._paused:
                self.transport.resume_reading()
                self._paused = False
            self._wake.clear()
            if deadline is not None:
                timeout = min(timeout, deadline - asyncio.get_running_loop().time())
            await asyncio.wait_for(self._wake.wait(), max(timeout, 0.0))

    async def read_head(self, deadline: float) -> h11.Request:
        """The request line and headers, whole by `deadline` (loop time), as websockets' handshake is (a head
        trickled a byte at a time once held a connection for hours); raises h11.RemoteProtocolError or
        TimeoutError."""
        event = await self._next_event(OPEN_TIMEOUT, deadline)
        if not isinstance(event, h11.Request):
            raise h11.RemoteProtocolError("no request")
        self._head_only = event.method == b"HEAD"
        self._declared_length = next((int(v) for k, v in event.headers if k == b"content-length"), None)
        return event

    async def read_body(self, limit: int) -> bytes:
        """The whole body, at most `limit` bytes (else BodyTooLarge: answer it, the rest is not read; a body
        declared larger is refused before a byte of it is read, and before a client that waits for 100 Continue
        sends it)."""
        if self._declared_length is not None and self._declared_length > limit:
            raise BodyTooLarge()
        if self._h11.they_are_waiting_for_100_continue:
            self.transport.write(self._h11.send(h11.InformationalResponse(status_code=100, headers=[])))
        body = bytearray()
        while True:
            event = await self._next_event(BODY_TIMEOUT)
            if isinstance(event, h11.Data):
                body += event.data
                if len(body) > limit:
                    raise BodyTooLarge()
            elif isinstance(event, h11.EndOfMessage):
                return bytes(body)
            elif isinstance(event, h11.ConnectionClosed):
                raise h11.RemoteProtocolError("the client closed the connection mid-request")

    # ---- responses -------------------------------------------------------------------------------------

    def _head(self, status: int, content_type: str, length: int | None) -> bytes:
        headers = [("Date", email.utils.formatdate(usegmt=True)), ("Connection", "close"),
                   ("Content-Type", content_type), ("Cache-Control", "no-store")]
        if length is not None:
            headers.append(("Content-Length", str(length)))
        reason = http.HTTPStatus(status).phrase.encode()
        return self._h11.send(h11.Response(status_code=status, headers=headers, reason=reason))

    async def respond(self, status: int, body: bytes | str, content_type: str) -> None:
        """A complete response."""
        if isinstance(body, str):
            body = body.encode()
        if self._h11.our_state not in (h11.IDLE, h11.SEND_RESPONSE) or self.transport.is_closing():
            return  # already answered, or nobody to answer
        head = self._head(status, content_type, len(body))
        data = b"" if self._head_only else self._h11.send(h11.Data(data=body))  # HEAD: the headers alone
        self.transport.write(head + data + self._h11.send(h11.EndOfMessage()))
        await self._drain()

    @property
    def streaming(self) -> bool:
        """A `start_stream()` response is under way: its status is sent, its body is not ended."""
        return self._h11.our_state is h11.SEND_BODY

    async def start_stream(self, status: int, content_type: str) -> None:
        """A response whose body follows in `send_part()` calls (chunked encoding), ended by `end_stream()`."""
        self.transport.write(self._head(status, content_type, None))
        await self._drain()

    async def send_part(self, data: bytes | str) -> None:
        if isinstance(data, str):
            data = data.encode()
        self.transport.write(self._h11.send(h11.Data(data=data)))
        await self._drain()

    async def end_stream(self) -> None:
        self.transport.write(self._h11.send(h11.EndOfMessage()))
        await self._drain()

    async def _drain(self) -> None:
        await asyncio.wait_for(self.connection.drain(), SEND_TIMEOUT)

    async def close(self) -> None:
        """Close after the response is flushed; abort a client that does not take it."""
        self.transport.close()
        try:
            await asyncio.wait_for(asyncio.shield(self.connection.connection_lost_waiter), SEND_TIMEOUT)
        except asyncio.TimeoutError:
            self.transport.abort()


Handler = Callable[[HttpExchange, HttpRequest], Awaitable[None]]


class BodyAwareConnection(ServerConnection):
    """websockets' server connection, plus requests of any method other than GET (see the docstring).

    Use `connection_class(handler)`: `handler(exchange, request)` answers one such request; it reads the body
    with `exchange.read_body(limit)` and writes with `exchange.respond()` or the stream methods.
    """

    handle_request: Handler  # set by connection_class()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._start = b""  # the first bytes, until the method is known
        self._routed: asyncio.Future[bool] = self.loop.create_future()  # True: ours; False: websockets'
        self.exchange: HttpExchange | None = None
        # A GET's bytes after its head, until websockets has answered it. websockets parses whatever follows a
        # handshake request as WebSocket frames at once, so a second request pipelined behind a plain GET
        # (HTTP/1.1 allows it) failed the connection and the first got no answer. Held, they are fed after an
        # upgrade (frames a client sent early) and dropped after a plain answer, which closes the connection:
        # an HTTP/1.1 client sends again what a closed connection did not answer.
        self._head_tail = b""  # the last bytes of the head so far, to find its end across packets
        self._after_head: bytearray | None = None

    def data_received(self, data: bytes) -> None:
        if self.exchange is not None:
            self.exchange.receive(data)
            return
        if self._after_head is not None:
            self._after_head += data
            return
        if self._routed.done():
            self._to_websockets(data)
            return
        self._start += data
        method, space, _ = self._start.partition(b" ")
        if not space and len(self._start) < 16:
            return  # wait for the whole method
        start, self._start = self._start, b""
        if method == b"GET" or not space:
            self._routed.set_result(False)
            self._to_websockets(start)
            return
        self.exchange = HttpExchange(self)
        self._routed.set_result(True)
        self.exchange.receive(start)

    def _to_websockets(self, data: bytes) -> None:
        """A GET's bytes to websockets, up to the end of its head while it is unanswered (see __init__)."""
        if self.protocol.state is not CONNECTING:
            super().data_received(data)
            return
        seen = self._head_tail + data
        end = seen.find(b"\r\n\r\n")
        if end < 0:
            self._head_tail = seen[-3:]
            super().data_received(data)
            return
        cut = end + 4 - len(self._head_tail)
        self._after_head = bytearray(data[cut:])
        super().data_received(data[:cut])

    def eof_received(self) -> bool | None:
        if self.exchange is not None:
            # An HTTP client that stops sending has gone: HTTP clients do not half-close to await an
            # answer (uvicorn treats EOF the same way). Closing makes connection_lost end the request's
            # work, so a file nobody waits for is not decoded on.
            self.exchange.receive(b"")
            return False
        return super().eof_received()

    async def handshake(self, *args: Any, **kwargs: Any) -> None:
        """websockets' opening handshake under OPEN_TIMEOUT (serve() gets open_timeout=None, so that a POST
        may take as long as its decoding); for another method, the whole exchange, then the close."""
        deadline = self.loop.time() + OPEN_TIMEOUT
        await asyncio.wait_for(asyncio.wait([self._routed, self.connection_lost_waiter],
                                            return_when=asyncio.FIRST_COMPLETED), OPEN_TIMEOUT)
        if not self._routed.done() or not self._routed.result():
            try:
                await asyncio.wait_for(super().handshake(*args, **kwargs), max(0.0, deadline - self.loop.time()))
            finally:
                held, self._after_head = self._after_head, None
                if held and self.protocol.state is OPEN:
                    super().data_received(bytes(held))
            return
        assert self.exchange is not None
        try:
            head = await self.exchange.read_head(deadline)
            request = HttpRequest(head.method.decode("ascii", "replace"), head.target.decode("ascii", "replace"),
                                  Headers([(k.decode("latin-1"), v.decode("latin-1")) for k, v in head.headers]))
        except (h11.RemoteProtocolError, asyncio.TimeoutError) as exc:
            await self.exchange.respond(400, f"bad request: {exc or 'no request head'}\n", "text/plain; charset=utf-8")
            request = None
        try:
            if request is not None:
                await self.handle_request(self.exchange, request)
        except Exception:  # noqa: BLE001 - websockets would drop it silently (it aborts the transport)
            log.exception("HTTP %s %s: the handler failed", request.method if request else "?",
                          request.path if request else "?")
        finally:
            await self.exchange.close()


def connection_class(handler: Handler) -> type[BodyAwareConnection]:
    """A BodyAwareConnection class whose non-GET requests go to `handler` (for serve(create_connection=))."""
    return type("BodyAwareConnection", (BodyAwareConnection,), {"handle_request": staticmethod(handler)})
