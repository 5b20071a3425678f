"""Wyoming adapter: Home Assistant's speech-to-text protocol on a TCP port of its own (`--wyoming-port`).

The same StreamSession, worker, admission control (`--max-sessions`), idle timeout, flood policy and
graceful shutdown as the WebSocket endpoints (server/streaming.py): `_Channel` gives a Wyoming TCP
connection the few methods of a WebSocket that StreamConnection uses. The events are server/wyoming_protocol.py's;
docs/wyoming.md tells how Home Assistant adds the service.
Wyoming's conventions that shape this module:
  * `describe` is answered at once, before admission: Home Assistant asks while it adds the service and
    whenever it reconnects, also while we warm up or are full;
  * one request is transcribe, audio-start, audio-chunk..., audio-stop, and its answer comes after audio-stop
    (Home Assistant reads nothing before); a connection may carry several requests in a row;
  * segments are cut by our VAD as the audio arrives and decoded as they end, like an upload's, so a long
    dictation gives the upload's words; each final goes out at once as a transcript-chunk (no partials:
    their text would be revised, and chunks are appended by clients), and `transcript` carries the whole;
  * Wyoming has no authentication: the port binds `--wyoming-host` (loopback unless told otherwise).
"""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import ipaddress
import logging
import types
from importlib import metadata
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from websockets.exceptions import ConnectionClosed

from pipeline.audio import AudioFormat
from pipeline.errors import ProtocolError, UnipadError
from pipeline.stream import StreamSession
from pipeline.trim import Continuation

from pipeline.transcript import join_texts
from .model_info import NOT_LANGUAGES, spoken_languages
from .protocol import CLOSE_GOING_AWAY, CLOSE_NORMAL
from .streaming import StreamConnection
from .worker import Job
from .wyoming_protocol import (Event, EventReader, PcmFormat, error_event, info_event, pcm_format, requested_language,
                               to_float32, transcript, transcript_chunk, transcript_start, transcript_stop)

if TYPE_CHECKING:
    from .server import Server

log = logging.getLogger(__name__)

READ_BYTES = 1 << 16
QUEUED_EVENTS = 8  # parsed events waiting for the connection; beyond it we stop reading (TCP backpressure)


async def start(app: Server) -> _Listener:
    """Listen for Wyoming clients on --wyoming-host and --wyoming-port; the Server closes the returned listener
    on shutdown like its own."""
    host = app.config.wyoming_host
    listener = _Listener(app)
    listener.server = await asyncio.start_server(listener.accept, host, app.config.wyoming_port)
    app.wyoming_port = listener.server.sockets[0].getsockname()[1]  # the bound port (config may say 0)
    log.info("Wyoming protocol on tcp://%s:%d", host, app.wyoming_port)
    if not _loopback(host):
        log.warning("the Wyoming port takes clients from %s without authentication (Wyoming has none): bind it "
                    "to a trusted network only (docs/wyoming.md)", host)
    return listener


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


@functools.cache
def _version() -> str | None:
    """The installed unipad-asr's version (info's `version`); None in a checkout that was never installed."""
    try:
        return metadata.version("unipad-asr")
    except metadata.PackageNotFoundError:
        return None


class _Listener:
    """What Server.shutdown expects of a listener (`.server.close()`, `.close()`, `.wait_closed()`)."""

    def __init__(self, app: Server) -> None:
        self.app = app
        self.server: asyncio.Server
        self.channels: set[_Channel] = set()

    async def accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        channel = _Channel(reader, writer, self.app.config.max_message_bytes)
        self.channels.add(channel)
        try:
            connection = WyomingConnection(self.app, channel)  # type: ignore[arg-type]
            if await connection.answer_describes():
                await self.app.serve_stream(connection)  # so a graceful shutdown drains Wyoming streams too
        finally:
            self.channels.discard(channel)
            await channel.close(CLOSE_NORMAL, "done")

    def close(self) -> None:
        self.server.close()
        for channel in list(self.channels):
            asyncio.ensure_future(channel.close(CLOSE_GOING_AWAY, "server shutting down"))

    async def wait_closed(self) -> None:
        while self.channels:
            await asyncio.sleep(0.05)


class _Channel:
    """A Wyoming TCP connection with the WebSocket methods StreamConnection uses: recv() -> Event (raises
    ConnectionClosed once the peer is gone, ProtocolError for a malformed event), send(bytes), close(code,
    reason), wait_closed(), remote_address, transport, protocol.close_sent (for the stream's end line).
    A reader task parses ahead, at most QUEUED_EVENTS, so recv() may be cancelled without losing bytes."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, max_payload: int) -> None:
        self._writer = writer
        self.remote_address = writer.get_extra_info("peername")
        self.transport = writer.transport
        self.protocol = types.SimpleNamespace(close_sent=None)  # websockets' name for "the code we closed with"
        self._items: collections.deque[Event | Exception] = collections.deque()  # or the error reading stopped at
        self._wake = asyncio.Event()
        self._room = asyncio.Event()
        self._closed = asyncio.get_running_loop().create_future()
        self._pump = asyncio.ensure_future(self._read(reader, EventReader(max_payload)))

    async def _read(self, reader: asyncio.StreamReader, parser: EventReader) -> None:
        try:
            while data := await reader.read(READ_BYTES):
                try:
                    parser.receive_data(data)
                except ProtocolError as exc:  # delivered after the events before it; nothing more is read
                    self._push(*parser.events(), exc)
                    return
                self._push(*parser.events())
                while len(self._items) >= QUEUED_EVENTS:
                    self._room.clear()
                    await self._room.wait()
        except (ConnectionError, OSError):
            pass
        except Exception as exc:  # noqa: BLE001 - a bug: the connection's recv() raises it (an internal error)
            self._push(exc)
            return
        self._set_closed()

    def _push(self, *items: Event | Exception) -> None:
        self._items.extend(items)
        self._wake.set()

    def _set_closed(self) -> None:
        if not self._closed.done():
            self._closed.set_result(None)

    async def recv(self) -> Event:
        while not self._items:
            if self._closed.done():
                raise ConnectionClosed(None, None)
            self._wake.clear()
            waiter = asyncio.ensure_future(self._wake.wait())
            try:
                await asyncio.wait({waiter, self._closed}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiter.cancel()
        item = self._items.popleft()
        self._room.set()
        if isinstance(item, Exception):
            raise item
        return item

    def unread(self, event: Event) -> None:
        """Put `event` back: the next recv() returns it (the first request event, read before admission)."""
        self._items.appendleft(event)

    async def send(self, data: bytes) -> None:
        if self._closed.done():
            raise ConnectionClosed(None, None)
        self._writer.write(data)
        await self._writer.drain()

    async def close(self, code: int, reason: str = "") -> None:
        if self.protocol.close_sent is None:
            self.protocol.close_sent = types.SimpleNamespace(code=code, reason=reason)
        self._pump.cancel()
        self._set_closed()
        self._writer.close()
        try:
            await asyncio.wait_for(self._writer.wait_closed(), 5.0)
        except (asyncio.TimeoutError, ConnectionError, OSError):
            pass

    async def wait_closed(self) -> None:
        await asyncio.shield(self._closed)


@dataclass(frozen=True)
class _Final:
    """A segment's final result, sent as a transcript-chunk when it reaches the send loop."""

    segment: int
    text: str
    language: str | None


class WyomingConnection(StreamConnection):
    """One Wyoming client connection, from its first event to the close; one request at a time."""

    log = logging.getLogger(__name__)
    log_name = "wyoming session"
    went_away = "closed by the client"
    internal_message = "internal error: {}"

    def __init__(self, app: Server, channel: _Channel) -> None:
        super().__init__(app, channel)  # type: ignore[arg-type]
        self.language = "auto"
        self.format: PcmFormat | None = None  # the open request's audio format; None between requests
        self._reset_request()

    def _reset_request(self) -> None:
        self._texts: dict[int, tuple[str, str | None]] = {}  # segment -> (text, language)
        self._sent_text = ""  # what the transcript-chunks of this request added up to
        self._failure: UnipadError | None = None  # a final's inference error: the request fails with it
        self._messages = 0

    # ---- before admission: describe ------------------------------------------------------------------

    async def answer_describes(self) -> bool:
        """Answer `describe` events until another arrives (True: it is kept for _serve) or the client leaves,
        idles, or the server shuts down (False)."""
        while True:
            try:
                event = await self._next_message()
            except ProtocolError as exc:  # malformed, or idle: said in Wyoming's form, then closed
                await self._send(error_event(exc.code, str(exc)))
                return False
            except ConnectionClosed:
                return False
            if event is None:
                return False
            if event.type != "describe":
                self.ws.unread(event)  # type: ignore[attr-defined]
                return True
            await self._send(self._info())

    def _info(self) -> bytes:
        manifest = self.app.model.manifest
        description = manifest.notice or f"{manifest.name} ({', '.join(spoken_languages(self.app.model))})"
        return info_event(manifest.name, description, spoken_languages(self.app.model), _version())

    # ---- the conversation ----------------------------------------------------------------------------

    async def _serve(self) -> None:
        while True:
            event = await self._next_message()
            if event is None:  # shutting down: an open request still gets its transcript
                if self.session is not None:
                    await self._finish_request()
                await self._close(CLOSE_GOING_AWAY, "server shutting down")
                return
            await self._on_event(event)

    async def _on_event(self, event: Event) -> None:
        kind = event.type
        if kind == "describe":
            self._put(self._info())
        elif kind == "transcribe":
            if self.session is not None:
                raise ProtocolError("transcribe between audio-start and audio-stop: send it before audio-start",
                                    code="bad_order")
            self.language = requested_language(event, spoken_languages(self.app.model))
        elif kind == "audio-start":
            if self.session is not None:
                raise ProtocolError("a second audio-start before audio-stop", code="bad_order")
            self._start_request(pcm_format(event))
        elif kind == "audio-chunk":
            await self._on_chunk(event)
        elif kind == "audio-stop":
            if self.session is None:
                raise ProtocolError("audio-stop before audio-start", code="bad_order")
            await self._finish_request()
        # Any other event is ignored, as the protocol asks of every program (e.g. select-program, ping).

    def _start_request(self, fmt: PcmFormat) -> None:
        self.format = fmt
        self._reset_request()
        options = dataclasses.replace(self.app.segmenter_options, partial_interval=0.0)  # no partials: see above
        self.session = StreamSession(AudioFormat(fmt.rate, "f32le", 1), options, first_segment=self._closed_segment + 1)
        if self._continuation is not None:  # a request's first segment continues nothing
            self._continuation = Continuation(self.app.segmenter_options)

    async def _on_chunk(self, event: Event) -> None:
        if self.session is None or self.format is None:
            raise ProtocolError("audio-chunk before audio-start: send audio-start with rate, width and channels "
                                "first", code="bad_order")
        fmt = pcm_format(event)
        if fmt != self.format:
            raise ProtocolError(f"audio-chunk format {fmt} differs from audio-start's {self.format}",
                                code="unsupported_audio")
        self._check_flood(self.session.received_seconds)
        if event.payload:
            await self._feed_audio(to_float32(event.payload, fmt))

    async def _finish_request(self) -> None:
        """Flush the open segment, wait for every final, then transcript (and transcript-stop)."""
        assert self.session is not None
        await self._handle(self.session.finish())
        await self._until_closed(self._finals_sent.wait())
        if self._failure is not None:
            raise self._failure
        segments = [self._texts[k] for k in sorted(self._texts)]
        text = join_texts([t for t, _ in segments])
        language = next((lang for _, lang in segments if lang), None)
        if language is None and self.language != "auto":
            language = self.language
        if not self._sent_text:  # no chunk went out: the stream still starts, for clients that follow it
            self._put(transcript_start(language))
        self._put(transcript(text, language))
        self._put(transcript_stop())
        self.session, self.format = None, None
        self.language = "auto"  # each request brings its own transcribe (Home Assistant's do)

    # ---- results -------------------------------------------------------------------------------------

    def _error(self, code: str, message: str) -> bytes:
        return error_event(code, message)

    def _job_options(self) -> dict[str, Any]:
        # As the upload's jobs (server/openai_http.py): the same text for the same audio.
        return {"deliver": self._on_result, "language": self.language, "hotwords": self.app.server_hotword_graph,
                "punctuate": True}

    def _on_final(self, job: Job, transcript: Any, error: UnipadError | None) -> None:
        if error is not None:
            self._failure = self._failure or error
            final = _Final(job.segment, "", None)
        else:
            language = transcript.language if transcript.language not in NOT_LANGUAGES else None
            final = _Final(job.segment, transcript.punctuated_text, language)
        self._texts[job.segment] = (final.text, final.language)
        self._put(final, arrived=job.arrived)

    def _render(self, item: Any) -> bytes | None:
        if not isinstance(item, _Final):
            return item  # bytes built by wyoming_protocol
        whole = join_texts([self._sent_text, item.text])
        if whole == self._sent_text:
            return None
        out = b"" if self._sent_text else transcript_start(item.language or self._start_language())
        out += transcript_chunk(whole[len(self._sent_text):])
        self._sent_text = whole
        return out

    def _start_language(self) -> str | None:
        return None if self.language == "auto" else self.language

    async def _close(self, code: int, reason: str, error: Any = None) -> None:
        if error is not None:  # counted here: the send loop does not look inside Wyoming's events
            self.app.metrics.errors.labels(reason).inc()
        await super()._close(code, reason, error)
