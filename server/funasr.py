"""FunASR runtime protocol adapter: FunASR's own clients, unchanged, on a port of their own (`--funasr-port`).

The same StreamSession, worker, admission control (`--max-sessions`), metrics and connection machinery
(server/streaming.py) as the Unipad endpoint (server/connection.py); only the messages differ
(server/funasr_protocol.py, docs/protocol.md).
FunASR's conventions that shape this module:
  * one connection may carry several inputs in a row (its offline file client sends file after file):
    each input ends with {"is_speaking": false}; a later JSON message or audio starts the next one;
  * the client closes the connection, not the server (we close on errors, idle timeout and shutdown);
  * online texts are appended by clients, so partial snapshots go out as deltas;
  * the last message of an input has is_final: true (FunASR's 2pass C++ client closes on it).
"""
from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence
from urllib.parse import urlsplit

from websockets.asyncio.server import Server as WebSocketServer, ServerConnection, serve
from websockets.http11 import Request, Response

from pipeline.audio import SAMPLE_RATE, AudioFormat
from pipeline.errors import ProtocolError, UnipadError
from pipeline.hotwords import parse_word_weights
from pipeline.stream import StreamSession

from .audio_file import audio_blocks, no_samples, open_audio
from .config import tls_context
from .funasr_protocol import (REALTIME_PCM_ONLY, SUBPROTOCOL, Control, FunasrConfig, ResultWriter, SegmentResult, Word,
                              ack_message, encode, end_message, error_message, final_message, parse_control)
from .http import check_handshake_token, response
from .protocol import CLOSE_GOING_AWAY
from .server import listener_options
from .streaming import StreamConnection, check_text_size
from .worker import Job

if TYPE_CHECKING:
    from .server import Server

log = logging.getLogger(__name__)

MAX_FILE_BYTES = 64 << 20  # a file input (wav_format not pcm) is held whole until its end: bound it
FILE_FEED_SAMPLES = SAMPLE_RATE  # a decoded file goes to the segmenter 1 s at a time (backpressure between)


async def start(app: Server) -> WebSocketServer:
    """Listen for FunASR clients on --funasr-port (the stream port's host and TLS, and its worker, admission
    control and metrics); the Server closes the returned listener on shutdown like its own."""
    ssl = tls_context(app.config)
    server = await serve(
        functools.partial(_serve_connection, app),
        app.config.host,
        app.config.funasr_port,
        process_request=functools.partial(process_request, app),
        select_subprotocol=select_subprotocol,
        ssl=ssl,
        **listener_options(app.config),
    )
    app.funasr_port = server.sockets[0].getsockname()[1]  # the bound port (config may say 0)
    log.info("FunASR runtime protocol on %s://%s:%d", "wss" if ssl else "ws", app.config.host, app.funasr_port)
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
    return check_handshake_token(app, connection, request, "a FunASR stream")  # as the Unipad endpoint's


async def _serve_connection(app: Server, ws: ServerConnection) -> None:
    await app.serve_stream(FunasrConnection(app, ws))  # so a graceful shutdown drains FunASR streams too


@dataclass(frozen=True)
class _Snapshot:
    """A partial transcript of the open segment; sent as the delta to what was sent before."""

    segment: int
    text: str


@dataclass(frozen=True)
class _SegmentDone:
    result: SegmentResult
    is_final: bool  # the last message of the input


class FunasrConnection(StreamConnection):
    """One FunASR client connection, from the handshake to the close; one input at a time."""

    log = logging.getLogger(__name__)
    log_name = "funasr session"
    went_away = "closed by the client"
    internal_message = "Internal error: {}."

    def __init__(self, app: Server, ws: ServerConnection) -> None:
        super().__init__(app, ws)
        self.config = FunasrConfig()
        self._input = 0  # inputs started on this connection; results of an older one are dropped
        self._hotwords: Any = None  # ContextGraph of the server's and this input's hotwords
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

    # ---- the conversation ------------------------------------------------------------------------------

    async def _serve(self) -> None:
        message = await self._next_message()
        if message is None:
            await self._close(CLOSE_GOING_AWAY, "server shutting down")
            return
        if isinstance(message, bytes):
            raise ProtocolError('audio before the JSON configuration message: send {"mode": …} first',
                                code="bad_order")
        control = self._parse(message, FunasrConfig())
        self._check_token(control.config.token, 'as "token" in the first message')
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
            self._check_flood(self._input_seconds())
            if isinstance(message, bytes):
                await self._feed(message)
                continue
            later = self._parse(message, self.config)  # settings are read at the start; wav_name may change
            self.config = dataclasses.replace(self.config, wav_name=later.config.wav_name)
            end, ack = later.end, later.ack
        await self._finish_input(ack)
        return False

    def _begin_input(self, config: FunasrConfig) -> None:
        if not self.app.model.manifest.prompt_frames:  # no SenseVoice prompt (a Paraformer): no tags to write
            config = dataclasses.replace(config, tags=False)
        self.config = config
        if not config.pcm and config.reply_mode != "offline":
            raise ProtocolError(REALTIME_PCM_ONLY, code="unsupported_audio", wav_format=config.wav_format)
        self.app.engine.language_id(config.svs_lang)  # ProtocolError bad_start for a language it lacks
        self._input += 1
        self._reset_input()
        self.outbox.discard_partial(1 << 62)
        # FunASR's word-weight hotwords (bad_start when malformed); as FunASR does, those the model cannot spell
        # are skipped, not refused
        self._hotwords = self.app.lenient_hotword_graph(parse_word_weights(config.hotwords),
                                                        f"funasr session {self.id}", self.log)
        if config.unknown:
            self.log.debug("funasr session %s: ignoring unknown field(s) %s", self.id, ", ".join(config.unknown))
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
        if error is not None:  # counted here: the send loop does not look inside FunASR's messages
            self.app.metrics.errors.labels(error["code"]).inc()
        await super()._close(code, reason, error)

    # ---- receiving -----------------------------------------------------------------------------------

    def _input_seconds(self) -> float:
        """Audio received in this input, for the flood policy; a file's bytes count as 16 kHz PCM16 would."""
        assert self.session is not None
        return self.session.received_seconds if self.config.pcm else len(self._file) / (2 * SAMPLE_RATE)

    def _parse(self, text: str, previous: FunasrConfig) -> Control:
        check_text_size(text)
        return parse_control(text, previous)

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
        if data:
            await self._feed_audio(data)

    async def _feed_file(self) -> None:
        """Decode the file a block at a time (off the loop) and feed it; its speech-end times are now (see
        _arrivals). Never whole: 64 MiB of Opus is hours, gigabytes decoded (server/audio_file.py)."""
        assert self.session is not None
        data, self._file = bytes(self._file), bytearray()
        if not data:
            return
        name = self.config.wav_format
        blocks = audio_blocks(await self._until_closed(asyncio.to_thread(open_audio, data, name)), name)
        fed = False
        while (block := await self._until_closed(asyncio.to_thread(next, blocks, None))) is not None:
            fed = True
            for i in range(0, len(block), FILE_FEED_SAMPLES):
                await self._handle(self.session.feed(block[i:i + FILE_FEED_SAMPLES].astype("<f4").tobytes()))
        if not fed:
            raise no_samples(name)

    # ---- results ---------------------------------------------------------------------------------------

    def _error(self, code: str, message: str) -> dict[str, Any]:
        return error_message(self.config.wav_name, code, message)

    def _job_options(self) -> dict[str, Any]:
        # finals punctuated where they go out whole (offline, 2pass-offline); online finals are deltas of live text
        return {"deliver": functools.partial(self._on_input_result, self._input), "language": self.config.svs_lang,
                "itn": self._itn(), "hotwords": self._hotwords, "punctuate": self.config.reply_mode != "online"}

    def _itn(self) -> bool:
        if not self.config.use_itn:
            return False
        try:
            self.app.engine.textnorm_id(True)
        except KeyError:  # a model without the withitn prompt
            return False
        return True

    def _count_final(self) -> None:
        self._outstanding += 1

    def _on_input_result(self, input_no: int, job: Job, transcript: Any, error: UnipadError | None) -> None:
        """A job's result; dropped when it belongs to an earlier input."""
        if input_no != self._input:
            self._jobs.discard(job)
            return
        self._on_result(job, transcript, error)

    def _partial_item(self, job: Job, transcript: Any) -> _Snapshot:
        return _Snapshot(job.segment, transcript.text)

    def _on_final(self, job: Job, transcript: Any, error: UnipadError | None) -> None:
        self._outstanding -= 1
        result = _segment_result(job, transcript, error)
        if self.config.whole_input:  # held for the one message of the whole input
            self._collected.append(result)
            self.app.metrics.segments.inc()
            self._final_done()
            return
        is_final = self._ending and self._outstanding == 0
        self._put(_SegmentDone(result, is_final), arrived=job.arrived)

    def _render(self, item: Any) -> str | None:
        """The text frame for an outgoing item, computed when it is sent (deltas depend on what was sent)."""
        self._writer.config = self.config
        if isinstance(item, _Snapshot):
            message = self._writer.partial(item.segment, item.text)
            if message is not None:
                self.app.metrics.partials.inc()
        elif isinstance(item, _SegmentDone):
            message = self._writer.final(item.result, item.is_final)
        else:
            message = item  # a dict built by funasr_protocol
        return None if message is None else encode(message)


def _segment_result(job: Job, transcript: Any, error: UnipadError | None) -> SegmentResult:
    if error is not None:
        return SegmentResult(job.segment, "", job.start, job.end, error=str(error))
    words = tuple(Word(w.text, w.start, w.end) for w in transcript.words)
    punctuation = transcript.punctuation  # FunASR's text as its punctuation model writes it, and its sentences
    return SegmentResult(job.segment, transcript.text if punctuation is None else punctuation.text, job.start, job.end,
                         words, transcript.language, transcript.emotion, transcript.event,
                         sentences=None if punctuation is None else punctuation.sentences)
