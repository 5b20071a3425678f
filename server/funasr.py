"""FunASR runtime protocol adapter: FunASR's own clients, unchanged, on a port of their own (`--funasr-port`).

The same StreamSession, worker, admission control (`--max-sessions`) and metrics as the Unipad endpoint
(server/connection.py); only the messages differ (server/funasr_protocol.py, docs/protocol.md).
FunASR's conventions that shape this module:
  * one connection may carry several inputs in a row (its offline file client sends file after file):
    each input ends with {"is_speaking": false}; a later JSON message or audio starts the next one;
  * the client closes the connection, not the server (we close on errors, idle timeout and shutdown);
  * online texts are appended by clients, so partial snapshots go out as deltas;
  * the last message of an input has is_final: true (FunASR's 2pass C++ client closes on it).
"""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import io
import logging
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Awaitable, Sequence
from urllib.parse import urlsplit

import numpy as np
from websockets.asyncio.server import Server as WebSocketServer, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from pipeline.audio import SAMPLE_RATE, AudioFormat, resample
from pipeline.errors import AudioFormatError, AuthenticationError, ProtocolError, UnipadError
from pipeline.segmenter import PartialDue, SegmentFinished
from pipeline.stream import StreamSession

from .access import install_redaction
from .connection import FLOOD_BURST, FLOOD_RATE, MAX_FINALS_IN_FLIGHT, SEND_TIMEOUT, Outbox, client_address, close_code
from .funasr_protocol import (REALTIME_PCM_ONLY, SUBPROTOCOL, Control, FunasrConfig, ResultWriter, SegmentResult, Word,
                              ack_message, encode, end_message, error_message, final_message, parse_control)
from .http import request_token, response, token_matches
from .protocol import CLOSE_GOING_AWAY, CLOSE_INTERNAL, MAX_TEXT_MESSAGE
from .server import KEEPALIVE_INTERVAL
from .worker import FINAL, PARTIAL, Job

if TYPE_CHECKING:
    import ssl as ssl_module

    from .server import Server

log = logging.getLogger(__name__)

MAX_FILE_BYTES = 64 << 20  # a file input (wav_format not pcm) is held whole until its end: bound it
FILE_FEED_SAMPLES = SAMPLE_RATE  # a decoded file goes to the segmenter 1 s at a time (backpressure between)


async def start(app: Server, host: str, port: int, ssl: ssl_module.SSLContext | None) -> WebSocketServer:
    """Listen for FunASR clients; the Server closes the returned listener on shutdown like its own."""
    server = await serve(
        functools.partial(_serve_connection, app),
        host,
        port,
        process_request=functools.partial(process_request, app),
        select_subprotocol=select_subprotocol,
        max_size=app.config.max_message_bytes,
        origins=[*app.config.allowed_origins, None] if app.config.allowed_origins else None,
        ssl=ssl,
        ping_interval=KEEPALIVE_INTERVAL,
        ping_timeout=KEEPALIVE_INTERVAL,
        logger=install_redaction(logging.getLogger("websockets.server")),  # handshakes may carry ?token=
    )
    app.funasr_port = server.sockets[0].getsockname()[1]  # the bound port (config may say 0)
    log.info("FunASR runtime protocol on %s://%s:%d", "wss" if ssl else "ws", host, app.funasr_port)
    return server


def select_subprotocol(connection: ServerConnection, offered: Sequence[str]) -> str | None:
    """"binary" when offered (FunASR's clients); none otherwise (its html5 page offers none)."""
    return SUBPROTOCOL if SUBPROTOCOL in offered else None


def process_request(app: Server, connection: ServerConnection, request: Request) -> Response | None:
    """Any path is the endpoint (FunASR's clients dial ws://host:port). A plain HTTPS GET gets a short page:
    FunASR's html5 page sends users there to accept a self-signed certificate."""
    if request.headers.get("Upgrade", "").lower() != "websocket":
        path = urlsplit(request.path).path
        if path == "/healthz":
            return response(200, "ok\n")
        return response(200, "Unipad ASR: FunASR runtime WebSocket protocol on this port "
                              f"(subprotocol \"{SUBPROTOCOL}\"); see docs/funasr.md\n")
    if app.config.token is not None:  # the same policy as the Unipad endpoint (server/http.py)
        address = str(connection.remote_address[0]) if connection.remote_address else "unknown"
        wait = app.auth_failures.blocked(address)
        if wait:
            app.metrics.sessions_refused.labels("auth_cooldown").inc()
            refused = response(429, f"too many failed authentications; retry in {wait:.0f} s\n")
            refused.headers["Retry-After"] = str(max(1, round(wait)))
            return refused
        given = request_token(request)
        if given is not None and not token_matches(app.config.token, given):
            app.auth_failures.record(address)
            app.metrics.sessions_refused.labels("unauthorized").inc()
            log.warning("refused a FunASR stream from %s: wrong token", address)
            return response(401, "unauthorized: wrong token\n")
        connection.authenticated = given is not None  # type: ignore[attr-defined]
    return None


async def _serve_connection(app: Server, ws: ServerConnection) -> None:
    task = asyncio.current_task()
    assert task is not None
    app._handlers.add(task)  # so a graceful shutdown drains FunASR streams too
    try:
        await FunasrConnection(app, ws).run()
    finally:
        app._handlers.discard(task)


def decode_file(data: bytes, wav_format: str) -> np.ndarray:
    """The bytes of an audio file soundfile can read -> float32 mono [n] at SAMPLE_RATE, in [-1, 1]."""
    import soundfile  # the streaming path never needs it

    try:
        samples, rate = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
    except (RuntimeError, OSError, ValueError) as exc:  # LibsndfileError is a RuntimeError
        raise AudioFormatError(f"Cannot decode the {wav_format} file ({len(data)} bytes): {exc}",
                               wav_format=wav_format) from None
    if samples.shape[0] == 0:
        raise AudioFormatError(f"The {wav_format} file contains no samples.", wav_format=wav_format)
    mono = samples.mean(axis=1, dtype=np.float32) if samples.shape[1] > 1 else samples[:, 0]
    if not np.isfinite(mono).all():
        raise AudioFormatError(f"The {wav_format} file contains NaN or infinite samples.", wav_format=wav_format)
    return np.clip(resample(mono, rate), -1.0, 1.0)


class _Gone(Exception):
    """The WebSocket closed while this connection waited for something else."""


@dataclass(frozen=True)
class _Item:
    message: Any  # a dict, a _Snapshot or a _SegmentDone (rendered when sent)
    arrived: float | None = None  # set for a segment's final: end-of-speech arrival time


@dataclass(frozen=True)
class _Snapshot:
    """A partial transcript of the open segment; sent as the delta to what was sent before."""

    segment: int
    text: str


@dataclass(frozen=True)
class _SegmentDone:
    result: SegmentResult
    is_final: bool  # the last message of the input


class FunasrConnection:
    """One FunASR client connection, from the handshake to the close; one input at a time."""

    def __init__(self, app: Server, ws: ServerConnection) -> None:
        self.app = app
        self.ws = ws
        self.id = uuid.uuid4().hex[:12]
        self.config = FunasrConfig()
        self.session: StreamSession | None = None
        self.outbox = Outbox()
        self._inflight = asyncio.Semaphore(MAX_FINALS_IN_FLIGHT)
        self._unsent_finals = 0
        self._finals_sent = asyncio.Event()
        self._finals_sent.set()
        self._jobs: set[Job] = set()
        self._sender: asyncio.Task[None] | None = None
        self._arrivals: collections.deque[tuple[float, float]] = collections.deque(maxlen=1024)
        self._input = 0  # inputs started on this connection; results of an older one are dropped
        self._reset_input()

    def _reset_input(self) -> None:
        self._closed_segment = -1  # highest segment whose SegmentFinished has been seen
        self._outstanding = 0  # finals submitted and not yet delivered by the worker
        self._ending = False  # the input ended and every segment was submitted
        self._collected: list[SegmentResult] = []  # whole-input mode: finals wait for the end
        self._writer = ResultWriter(self.config)
        self._carry = b""  # an odd byte: FunASR clients treat PCM as a byte stream
        self._file = bytearray()
        self._arrivals.clear()
        self._messages = 0  # client messages in this input (the flood policy)

    # ---- lifecycle -----------------------------------------------------------------------------------

    async def run(self) -> None:
        self._sender = asyncio.create_task(self._send_loop())
        try:
            self.app.admit(self)  # type: ignore[arg-type]  # only its identity is used
            try:
                await self._serve()
            finally:
                self.app.release(self)  # type: ignore[arg-type]
        except UnipadError as exc:
            log.info("funasr session %s: %s (%s)", self.id, exc, exc.code)
            await self._close(close_code(exc), exc.code, error_message(self.config.wav_name, exc.code, str(exc)))
        except (ConnectionClosed, _Gone):
            log.info("funasr session %s: closed by the client", self.id)
        except Exception as exc:  # noqa: BLE001 - a bug must not take the server down
            log.exception("funasr session %s: internal error", self.id)
            await self._close(CLOSE_INTERNAL, "internal_error", error_message(
                self.config.wav_name, "internal_error", f"Internal error: {type(exc).__name__}."))
        finally:
            self.app.worker.cancel_session(self.id)
            for job in self._jobs:
                job.cancelled = True
            self._jobs.clear()
            if not self._sender.done():
                self._sender.cancel()

    async def _serve(self) -> None:
        message = await self._next_message()
        if message is None:
            await self._close(CLOSE_GOING_AWAY, "server shutting down")
            return
        if isinstance(message, bytes):
            raise ProtocolError('audio before the JSON configuration message: send {"mode": …} first',
                                code="bad_order")
        control = self._parse(message, FunasrConfig())
        self._authenticate(control.config)
        audio: bytes | None = None
        while True:
            if await self._run_input(control, audio):
                await self._close(CLOSE_GOING_AWAY, "server shutting down")
                return
            message = await self._next_message()  # the next input, or the client's close
            if message is None:
                await self._close(CLOSE_GOING_AWAY, "server shutting down")
                return
            if isinstance(message, bytes):  # audio again: a new input with the same settings
                control, audio = Control(self.config), message
            else:
                control, audio = self._parse(message, self.config), None

    async def _run_input(self, control: Control, audio: bytes | None) -> bool:
        """One input from its settings to its last result; returns True when the server is shutting down."""
        self._begin_input(control.config)
        if audio is not None:
            await self._feed(audio)
        end, ack = control.end, control.ack
        while not end:
            message = await self._next_message()
            if message is None:
                await self._finish_input(ack=False)
                return True
            self._check_flood()
            if isinstance(message, bytes):
                await self._feed(message)
                continue
            later = self._parse(message, self.config)  # settings are read at the start; wav_name may change
            self.config = dataclasses.replace(self.config, wav_name=later.config.wav_name)
            end, ack = later.end, later.ack
        await self._finish_input(ack)
        return False

    def _begin_input(self, config: FunasrConfig) -> None:
        self.config = config
        if not config.pcm and config.reply_mode != "offline":
            raise ProtocolError(REALTIME_PCM_ONLY, code="unsupported_audio", wav_format=config.wav_format)
        self.app.engine.language_id(config.svs_lang)  # ProtocolError bad_start for a language it lacks
        self._input += 1
        self._reset_input()
        self.outbox.discard_partial(1 << 62)
        if config.hotwords:
            log.info("funasr session %s: hotwords are not supported yet; ignored", self.id)
        if config.unknown:
            log.debug("funasr session %s: ignoring unknown field(s) %s", self.id, ", ".join(config.unknown))
        options = self.app.segmenter_options
        if config.reply_mode == "offline":  # no partials to send: don't compute them
            options = dataclasses.replace(options, partial_interval=0.0)
        fmt = AudioFormat(config.audio_fs, "s16le", 1) if config.pcm else AudioFormat(SAMPLE_RATE, "f32le", 1)
        self.session = StreamSession(fmt, options)

    async def _finish_input(self, ack: bool) -> None:
        """Flush the open segment, send every result (the last one with is_final: true), then the ack."""
        assert self.session is not None
        if not self.config.pcm:
            await self._feed_file()
        await self._handle(self.session.finish())
        self._ending = True  # every segment is submitted: the last one delivered carries is_final
        if self.config.whole_input:
            await self._until_closed(self._finals_sent.wait())
            self._put(final_message(self.config, self._collected, is_final=True))
        elif self._outstanding == 0:
            self._put(end_message(self.config))
        await self._until_closed(self._finals_sent.wait())
        if ack:
            self._put(ack_message(self.config))

    async def _close(self, code: int, reason: str, error: dict[str, Any] | None = None) -> None:
        if error is not None:
            self.app.metrics.errors.labels(error["code"]).inc()
            self._put(error)
        self.outbox.close()
        if self._sender is not None:
            await asyncio.wait({self._sender}, timeout=SEND_TIMEOUT)
        discard = asyncio.ensure_future(self._discard_incoming())  # so the client's close answer gets read
        try:
            await self.ws.close(code, reason[:120])
        finally:
            discard.cancel()

    async def _discard_incoming(self) -> None:
        try:
            while True:
                await self.ws.recv()
        except Exception:  # noqa: BLE001 - ConnectionClosed, or a recv() already waiting elsewhere
            pass

    # ---- receiving -----------------------------------------------------------------------------------

    async def _next_message(self) -> str | bytes | None:
        """The next client message; None when the server starts shutting down; ProtocolError when idle."""
        recv = asyncio.ensure_future(self.ws.recv())
        done, _ = await asyncio.wait({recv, self.app.shutting_down}, timeout=self.app.config.idle_timeout,
                                     return_when=asyncio.FIRST_COMPLETED)
        if recv in done:
            return recv.result()
        recv.cancel()  # safe: websockets keeps the message for the next recv()
        if self.app.shutting_down.done():
            return None
        raise ProtocolError(f"no message for {self.app.config.idle_timeout:g} s", code="idle_timeout")

    def _check_flood(self) -> None:
        """The Unipad endpoint's message-rate policy (server/connection.py), per input; a file's bytes count
        as 16 kHz PCM16 would."""
        assert self.session is not None
        self._messages += 1
        seconds = self.session.received_seconds if self.config.pcm else len(self._file) / (2 * SAMPLE_RATE)
        if self._messages > FLOOD_BURST + FLOOD_RATE * seconds:
            raise ProtocolError(f"{self._messages} messages for {seconds:.3f} s of audio: send at 10-100 ms "
                                "of audio per message", code="too_many_messages")

    def _parse(self, text: str, previous: FunasrConfig) -> Control:
        if len(text) > MAX_TEXT_MESSAGE:
            raise ProtocolError(f"control message of {len(text)} characters (at most {MAX_TEXT_MESSAGE})",
                                code="message_too_big")
        return parse_control(text, previous)

    def _authenticate(self, config: FunasrConfig) -> None:
        expected = self.app.config.token
        if expected is None or getattr(self.ws, "authenticated", False):
            return
        if not token_matches(expected, config.token):
            address = client_address(self.ws)
            self.app.auth_failures.record(address)
            log.warning("funasr session %s: %s token from %s", self.id, "wrong" if config.token else "no", address)
            raise AuthenticationError("missing or wrong token (send it as \"token\" in the first message, "
                                      "?token= or Authorization)")

    async def _feed(self, data: bytes) -> None:
        assert self.session is not None
        if not self.config.pcm:
            if len(self._file) + len(data) > MAX_FILE_BYTES:
                raise ProtocolError(f"file larger than {MAX_FILE_BYTES >> 20} MiB", code="message_too_big")
            self._file += data
            return
        if self._carry:
            data = self._carry + data
        self._carry = data[-1:] if len(data) % 2 else b""
        if self._carry:
            data = data[:-1]
        if not data:
            return
        arrived = time.monotonic()
        try:
            events = self.session.feed(data)
        except AudioFormatError as exc:
            raise ProtocolError(str(exc), code="invalid_audio") from None
        self._arrivals.append((self.session.received_seconds, arrived))
        await self._handle(events)

    async def _feed_file(self) -> None:
        assert self.session is not None
        data, self._file = bytes(self._file), bytearray()
        if not data:
            return
        audio = await self._until_closed(asyncio.to_thread(decode_file, data, self.config.wav_format))
        for i in range(0, len(audio), FILE_FEED_SAMPLES):
            await self._handle(self.session.feed(audio[i:i + FILE_FEED_SAMPLES].astype("<f4").tobytes()))

    def _speech_end_arrival(self, end: float) -> float:
        """When the audio at input time `end` reached the server (now for a file decoded at its end)."""
        while len(self._arrivals) > 1 and self._arrivals[0][0] < end:
            self._arrivals.popleft()
        return self._arrivals[0][1] if self._arrivals else time.monotonic()

    async def _until_closed(self, awaitable: Awaitable[Any]) -> Any:
        task = asyncio.ensure_future(awaitable)
        closed = asyncio.ensure_future(self.ws.wait_closed())
        await asyncio.wait({task, closed}, return_when=asyncio.FIRST_COMPLETED)
        closed.cancel()
        if not task.done():
            task.cancel()
            raise _Gone()
        return task.result()

    # ---- segments and jobs ---------------------------------------------------------------------------

    async def _handle(self, events: list[Any]) -> None:
        for event in events:
            if isinstance(event, SegmentFinished):
                self._closed_segment = event.segment
                if self.outbox.discard_partial(event.segment):
                    self.app.metrics.partials_dropped.inc()
                if self._inflight.locked():  # backpressure: stop reading until a final is sent
                    await self._until_closed(self._inflight.acquire())
                else:
                    await self._inflight.acquire()
                self._unsent_finals += 1
                self._finals_sent.clear()
                self._outstanding += 1
                self._submit(event, FINAL, arrived=self._speech_end_arrival(event.end))
            elif isinstance(event, PartialDue):
                self._submit(event, PARTIAL)

    def _submit(self, event: PartialDue | SegmentFinished, kind: str, arrived: float = 0.0) -> None:
        job = Job(
            session=self.id, kind=kind, segment=event.segment, start=event.start, end=event.end,
            audio_start=event.audio_start, audio=event.audio, deliver=functools.partial(self._on_result, self._input),
            language=self.config.svs_lang, itn=self._itn(), arrived=arrived,
        )
        self._jobs.add(job)
        self.app.worker.submit(job)

    def _itn(self) -> bool:
        if not self.config.use_itn:
            return False
        try:
            self.app.engine.textnorm_id(True)
        except KeyError:  # a model without the withitn prompt
            return False
        return True

    def _on_result(self, input_no: int, job: Job, transcript: Any, error: UnipadError | None) -> None:
        """Called on the event loop by the worker with one job's result."""
        self._jobs.discard(job)
        if job.cancelled or input_no != self._input:
            return
        if job.kind == PARTIAL:
            if error is not None or job.segment <= self._closed_segment:
                self.app.metrics.partials_dropped.inc()  # stale: the segment's final is on its way
            elif self.outbox.put_partial(_Snapshot(job.segment, transcript.text)):  # type: ignore[arg-type]
                self.app.metrics.partials_dropped.inc()
            return
        self._outstanding -= 1
        result = _segment_result(job, transcript, error)
        if self.config.whole_input:  # held for the one message of the whole input
            self._collected.append(result)
            self.app.metrics.segments.inc()
            self._final_done()
            return
        is_final = self._ending and self._outstanding == 0
        self.outbox.put(_Item(_SegmentDone(result, is_final), arrived=job.arrived))  # type: ignore[arg-type]

    # ---- sending -------------------------------------------------------------------------------------

    def _put(self, message: dict[str, Any]) -> None:
        self.outbox.put(_Item(message))  # type: ignore[arg-type]

    async def _send_loop(self) -> None:
        metrics = self.app.metrics
        try:
            while (item := await self.outbox.get()) is not None:
                message = self._render(item.message)
                if message is not None and not await self._send(encode(message)):
                    return
                if item.arrived is not None:  # a segment's final
                    metrics.segments.inc()
                    metrics.final_latency.observe(time.monotonic() - item.arrived)
                    self._final_done()
        except ConnectionClosed:
            pass
        except Exception:  # noqa: BLE001 - a message we cannot encode is a bug; don't leave the stream hanging
            log.exception("funasr session %s: cannot send", self.id)
            await self.ws.close(CLOSE_INTERNAL, "internal_error")

    async def _send(self, text: str) -> bool:
        """Send one message; a client that takes none for send_timeout is not reading: abort its connection
        (as the Unipad endpoint does)."""
        try:
            await asyncio.wait_for(self.ws.send(text), self.app.config.send_timeout)
            return True
        except asyncio.TimeoutError:
            log.warning("funasr session %s: the client took no message for %g s; dropping it", self.id,
                        self.app.config.send_timeout)
            self.app.metrics.sessions_dropped.labels("not_reading").inc()
            self.ws.transport.abort()
            return False

    def _render(self, item: Any) -> dict[str, Any] | None:
        """The JSON object for an outgoing item, computed when it is sent (deltas depend on what was sent)."""
        self._writer.config = self.config
        if isinstance(item, _Snapshot):
            message = self._writer.partial(item.segment, item.text)
            if message is not None:
                self.app.metrics.partials.inc()
            return message
        if isinstance(item, _SegmentDone):
            return self._writer.final(item.result, item.is_final)
        return item

    def _final_done(self) -> None:
        self._unsent_finals -= 1
        self._inflight.release()
        if self._unsent_finals == 0:
            self._finals_sent.set()


def _segment_result(job: Job, transcript: Any, error: UnipadError | None) -> SegmentResult:
    if error is not None:
        return SegmentResult(job.segment, "", job.start, job.end, error=str(error))
    words = tuple(Word(w.text, w.start, w.end) for w in transcript.words)
    return SegmentResult(job.segment, transcript.text, job.start, job.end, words,
                         transcript.language, transcript.emotion, transcript.event)
