"""Deepgram live streaming on the stream port: GET /v1/listen?... (WebSocket), for Deepgram's clients.

The wire shapes are server/deepgram_shapes.py's, the audio decoding server/deepgram_audio.py's; the
machinery is every stream's (server/streaming.py: admission, backpressure, the worker, the ordered send
loop). Binary messages are audio; text messages are KeepAlive, Finalize and CloseStream. Per segment:
    SpeechStarted (vad_events=true) -> Results is_final false ... (interim_results=true)
    -> Results is_final true (speech_final true when the end silence ended it) -> UtteranceEnd
       (utterance_end_ms set, once that long passed after its last word with no new speech)
Finalize closes the open segment now (its final has from_finalize true; with nothing open, an empty one
does). CloseStream: every final, then Metadata, then close 1000. With multichannel=true each channel is its
own StreamSession (own VAD, own segments, own partial slot in the worker), tagged channel_index [i, n].
Parameters are checked at the handshake, so a bad one is an HTTP 400 with Deepgram's error body.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from websockets.asyncio.server import ServerConnection

from pipeline.audio import AudioFormat, check_format
from pipeline.errors import AudioFormatError, UnipadError, quoted
from pipeline.json_text import loads_shallow
from pipeline.segmenter import PartialDue, SegmentFinished, SpeechStarted
from pipeline.stream import StreamSession
from pipeline.trim import Continuation, prepared

from .deepgram_audio import MAX_WAV_HEADER, PcmDecoder, read_wav_header
from .deepgram_shapes import (MAX_CHANNELS, ListenOptions, error_message, metadata_message, results, results_metadata,
                              speech_started, utterance_end)
from .protocol import CLOSE_GOING_AWAY, CLOSE_NORMAL
from .outbox import Outbox
from .streaming import StreamConnection, check_text_size
from .worker import FINAL, PARTIAL, Job

if TYPE_CHECKING:
    from .server import Server

log = logging.getLogger(__name__)
KEEPALIVE_FREE_EVERY = 1.0  # seconds; Deepgram asks for a KeepAlive every 3-5 s without audio
OUTBOX_LIMIT = 256  # messages waiting for a client: finals, SpeechStarted and UtteranceEnd of every channel


# ---- one stream ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Interim:
    channel: int
    segment: int  # connection-wide number
    start: float
    end: float
    text: str
    words: tuple[Any, ...]


class _Channel:
    """One channel's stream: its StreamSession (renewed by each Finalize, times continuing), its segments."""

    def __init__(self, index: int, worker_id: str, fmt: AudioFormat, options: Any, continuation: Any) -> None:
        self.index, self.worker_id, self.fmt, self.options = index, worker_id, fmt, options
        self.session = StreamSession(fmt, options)
        self.continuation = continuation
        self.time_base = 0.0  # stream seconds before this StreamSession
        self.generation = 0
        self.numbers: dict[tuple[int, int], int] = {}  # (generation, its segment) -> connection-wide number
        self.open: int | None = None  # the segment heard now
        self.closed = -1  # highest segment whose SegmentFinished has been seen
        self.inflight = 0  # finals submitted, not yet delivered
        self.last_word_end: float | None = None
        self.utterance_open = False  # words were sent since the last UtteranceEnd

    def renew(self) -> None:
        """After finish(): a fresh StreamSession whose times continue where this one's audio ended."""
        self.time_base += self.session.received_seconds
        self.generation += 1
        self.session = StreamSession(self.fmt, self.options)


class DeepgramConnection(StreamConnection):
    """One Deepgram live stream, from the handshake to the close."""

    log = logging.getLogger(__name__)
    log_name = "deepgram stream"

    def __init__(self, app: Server, ws: ServerConnection) -> None:
        super().__init__(app, ws)
        self.outbox = _ChannelOutbox(OUTBOX_LIMIT)
        self.options, self.request_id = getattr(ws, "deepgram", (ListenOptions(), str(uuid.uuid4())))
        self.metadata = results_metadata(self.request_id, app.model_name, self.options.model)
        self._decoder: PcmDecoder | None = None
        self._header = b""  # containerised audio: the first bytes, until the WAV header is read
        self._rate = self.options.sample_rate or 0
        self._audio_channels = self.options.channels  # the query's, or a WAV header's once read
        self._frames = 0  # sample frames received (all channels share them)
        self._sha = hashlib.sha256()  # of the audio bytes, for Metadata
        self._channels: list[_Channel] = []
        self._by_worker: dict[str, _Channel] = {}
        self._flags: dict[int, tuple[bool, bool]] = {}  # segment -> (speech_final, from_finalize)
        self._finishing: str | None = None  # "finalize" or "close" while open segments are being closed
        self._next_segment = 0
        self._finished = 0  # segments finished, every channel's (the end-of-stream log)
        self._hotwords: Any = None
        self._opened, self._free_keepalives = time.monotonic(), 0

    # ---- the conversation ------------------------------------------------------------------------------

    async def _serve(self) -> None:
        self._check_token(None, "with the handshake")
        self._hotwords = self.app.lenient_hotword_graph(self.options.hotwords, f"deepgram stream {self.id}",
                                                        self.log)
        if self.options.ignored:
            self.log.debug("deepgram stream %s: accepted, not applied: %s", self.id, ", ".join(self.options.ignored))
        if self.options.encoding is not None:
            self._start(self.options.encoding, self.options.sample_rate or 0, self.options.channels)
        while True:
            message = await self._next_message()
            if message is None:
                await self._end(CLOSE_GOING_AWAY, "server shutting down")
                return
            if isinstance(message, bytes):
                self._check_flood(self._seconds())
                await self._audio(message)
                continue
            check_text_size(message)
            kind = _message_type(message)
            if not self._free_keepalive(kind):
                self._check_flood(self._seconds())
            if kind == "CloseStream":
                await self._end(CLOSE_NORMAL, "")
                return
            if kind == "Finalize":
                await self._finalize("finalize")
            elif kind != "KeepAlive":
                self._put(error_message(f"unknown message {quoted(kind)}: send audio as binary messages, or KeepAlive, "
                                        "Finalize or CloseStream", "SchemaError", message[:200]))

    def _free_keepalive(self, kind: str) -> bool:
        """Whether this message is a KeepAlive that the flood policy does not count: one a second of the
        stream's life (and one more), however they bunch up on the way. KeepAlive holds a stream open that
        sends no audio (a muted microphone, for an hour), where the policy's allowance, counted in seconds
        of audio, does not grow."""
        if kind != "KeepAlive":
            return False
        if self._free_keepalives >= 1 + (time.monotonic() - self._opened) / KEEPALIVE_FREE_EVERY:
            return False
        self._free_keepalives += 1
        return True

    async def _end(self, code: int, reason: str) -> None:
        """Every final, then Metadata, then the close."""
        await self._finalize("close")
        await self._until_closed(self._finals_sent.wait())
        self._put(metadata_message(request_id=self.request_id, sha256=self._sha.hexdigest(), duration=self._seconds(),
                                   channels=self._audio_channels, served=self.app.model_name,
                                   requested=self.options.model))
        await self._close(code, reason)

    def _start(self, encoding: str, rate: int, channels: int) -> None:
        """The audio's format is known (the query's, or a WAV header's): one _Channel per stream."""
        # A WAV's header gives its channels, whatever the query says (as the pre-recorded door reads it)
        if self.options.multichannel and channels > MAX_CHANNELS:  # each channel is a stream of its own
            raise AudioFormatError(f"the WAV has {channels} channels; multichannel=true takes at most {MAX_CHANNELS}")
        fmt = AudioFormat(rate, "f32le", 1)
        check_format(fmt)  # a WAV's rate (the query's was checked at the handshake)
        self._decoder, self._rate, self._audio_channels = PcmDecoder(encoding, channels), rate, channels
        options = self.app.segmenter_options
        end_silence = options.end_silence if self.options.endpointing_ms is None else self.options.endpointing_ms / 1000
        options = dataclasses.replace(options, end_silence=end_silence, post_roll=min(options.post_roll, end_silence))
        if not self.options.interim_results:  # no interim results to send: don't compute them
            options = dataclasses.replace(options, partial_interval=0.0)
        streams = channels if self.options.multichannel else 1
        for i in range(streams):
            continuation = Continuation(self.app.segmenter_options) if self.app.engine.family.word_times else None
            channel = _Channel(i, f"{self.id}:{i}", fmt, options, continuation)
            self._channels.append(channel)
            self._by_worker[channel.worker_id] = channel

    def _seconds(self) -> float:
        return self._frames / self._rate if self._rate else 0.0

    def audio_seconds(self) -> float:  # each channel has its own StreamSession, none is the connection's
        return self._seconds()

    def segments_finished(self) -> int:
        return self._finished

    async def _audio(self, data: bytes) -> None:
        self._sha.update(data)
        if self._decoder is None:  # containerised: wait for the WAV header
            self._header += data
            header = read_wav_header(self._header)
            if header is None:
                if len(self._header) > MAX_WAV_HEADER:
                    raise AudioFormatError("no WAV data chunk in the first bytes")
                return
            self._start(header.encoding, header.sample_rate, header.channels)
            data, self._header = self._header[header.data_offset:], b""
        assert self._decoder is not None
        frames = self._decoder.feed(data)
        if not len(frames):
            return
        arrived = time.monotonic()
        self._frames += len(frames)
        self._arrivals.append((self._seconds(), arrived))
        mono = [frames[:, i] for i in range(frames.shape[1])] if self.options.multichannel else \
            [frames.mean(axis=1, dtype=np.float32) if frames.shape[1] > 1 else frames[:, 0]]
        for channel, samples in zip(self._channels, mono):
            await self._events(channel, channel.session.feed(np.ascontiguousarray(samples, "<f4").tobytes()))
        self._utterance_ends()

    async def _finalize(self, why: str) -> None:
        """Close every channel's open segment now (Finalize, CloseStream, shutdown); renew its session."""
        self._finishing = why
        try:
            for channel in self._channels:
                events = channel.session.finish()
                await self._events(channel, events)
                channel.renew()
                if why == "finalize" and not any(isinstance(e, SegmentFinished) for e in events):
                    # Deepgram answers every Finalize with a from_finalize result, empty when nothing was open
                    await self._until_closed(self._finals_sent.wait())
                    now = self._seconds()
                    self._put(results(channel.index, len(self._channels), now, now, "", (), True, False, True,
                                      self.metadata))
        finally:
            self._finishing = None
        if why == "finalize" and not self._channels:  # nothing heard yet (a WAV header still awaited)
            self._put(results(0, 1, 0.0, 0.0, "", (), True, False, True, self.metadata))

    # ---- segments and jobs ---------------------------------------------------------------------------

    async def _events(self, channel: _Channel, events: list[Any]) -> None:
        for e in events:
            key = (channel.generation, e.segment)
            if key not in channel.numbers:
                channel.numbers[key] = self._next_segment
                self._next_segment += 1
            fields: dict[str, Any] = {"segment": channel.numbers[key], "start": e.start + channel.time_base}
            if not isinstance(e, SpeechStarted):
                fields |= {"end": e.end + channel.time_base, "audio_start": e.audio_start + channel.time_base}
            e = dataclasses.replace(e, **fields)
            if isinstance(e, SpeechStarted):
                channel.open = e.segment
                if self.options.vad_events:
                    self._put(speech_started(channel.index, len(self._channels), e.start))
            elif isinstance(e, PartialDue):
                self._submit(channel, e, PARTIAL)
            elif isinstance(e, SegmentFinished):
                del channel.numbers[key]
                await self._segment_finished(channel, e)

    async def _segment_finished(self, channel: _Channel, e: SegmentFinished) -> None:
        channel.open, channel.closed = None, e.segment
        self._finished += 1
        if self.outbox.discard_channel_partial(channel.index):
            self.app.metrics.partials_dropped.inc()
        await self._until_closed(self._inflight.acquire())  # backpressure: stop reading until a final is sent
        self._unsent_finals += 1
        self._finals_sent.clear()
        channel.inflight += 1
        limit = self.app.segmenter_options
        cut = e.end - e.start >= limit.max_segment_seconds - limit.cut_search  # at the length limit, inside speech
        self._flags[e.segment] = (self._finishing is None and self.options.speech_final and not cut,
                                  self._finishing == "finalize")
        self._submit(channel, e, FINAL, arrived=self._speech_end_arrival(e.end))

    def _submit(self, channel: _Channel, event: Any, kind: str, arrived: float = 0.0) -> None:
        event, context, said = prepared(event, self.app.segmenter_options,
                                        channel.continuation if kind == FINAL else None)
        job = Job(session=channel.worker_id, kind=kind, segment=event.segment, start=event.start, end=event.end,
                  audio_start=event.audio_start, audio=event.audio, arrived=arrived, context=context, said=said,
                  deliver=self._on_result, language=self.options.language, hotwords=self._hotwords,
                  punctuate=self.options.punctuate)
        if kind == PARTIAL:  # the worker keeps one partial per channel: the ones it replaced never come back
            self._jobs = {j for j in self._jobs if j.kind != PARTIAL or j.session != channel.worker_id}
        self._jobs.add(job)
        self.app.worker.submit(job)

    def _release_jobs(self) -> None:
        for channel in self._channels:
            self.app.worker.cancel_session(channel.worker_id)
        super()._release_jobs()

    # ---- results -------------------------------------------------------------------------------------

    def _on_result(self, job: Job, transcript: Any, error: UnipadError | None) -> None:
        self._jobs.discard(job)
        if job.cancelled:
            return
        channel = self._by_worker[job.session]
        if job.kind == PARTIAL:
            if error is not None or job.segment <= channel.closed:
                self.app.metrics.partials_dropped.inc()  # stale: the segment's final is on its way
            elif self.outbox.put_partial(_Interim(channel.index, job.segment, job.start, job.end, transcript.text,
                                                  tuple(transcript.words))):
                self.app.metrics.partials_dropped.inc()
            return
        channel.inflight -= 1
        speech_final, from_finalize = self._flags.pop(job.segment, (False, False))
        if error is not None:
            self._put(error_message(f"inference failed for the segment at {job.start:.2f}-{job.end:.2f} s: {error}",
                                    error.code), arrived=job.arrived)
            return
        punctuation = transcript.punctuation  # with punctuate=true and a punctuation model (--punc)
        self._put(results(channel.index, len(self._channels), job.start, job.end, transcript.punctuated_text,
                          transcript.words, True, speech_final, from_finalize, self.metadata,
                          None if punctuation is None else punctuation.words), arrived=job.arrived)
        if transcript.words:
            channel.last_word_end, channel.utterance_open = transcript.words[-1].end, True
        self._utterance_ends()

    def _utterance_ends(self) -> None:
        """UtteranceEnd for each channel whose last word is utterance_end_ms behind the audio, nothing since."""
        wait = self.options.utterance_end_ms
        if wait is None:
            return
        now = self._seconds()
        for channel in self._channels:
            if channel.utterance_open and channel.open is None and channel.inflight == 0 \
                    and channel.last_word_end is not None and now >= channel.last_word_end + wait / 1000:
                channel.utterance_open = False
                self._put(utterance_end(channel.index, len(self._channels), channel.last_word_end))

    def _error(self, code: str, message: str) -> dict[str, Any]:
        return error_message(message, code)

    def _job_options(self) -> dict[str, Any]:  # jobs are built in _submit
        raise NotImplementedError

    def _render(self, message: Any) -> str | None:
        if isinstance(message, _Interim):
            message = results(message.channel, len(self._channels), message.start, message.end, message.text,
                              message.words, False, False, False, self.metadata)
        return json.dumps(message, ensure_ascii=False)

    def _sent(self, message: Any) -> None:
        if isinstance(message, _Interim):
            self.app.metrics.partials.inc()
        elif isinstance(message, dict) and message.get("type") == "Error":
            self.app.metrics.errors.labels(message["variant"]).inc()


def _message_type(text: str) -> str:
    try:
        data = loads_shallow(text)
    except ValueError:
        return "(not JSON)"
    kind = data.get("type") if isinstance(data, dict) else None
    return kind if isinstance(kind, str) else "(no type)"


class _ChannelOutbox(Outbox):
    """The Outbox with one waiting interim result per channel (a partial replaces only its own channel's)."""

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self._slots: dict[int, _Interim] = {}

    def put_partial(self, partial: Any) -> bool:
        replaced = partial.channel in self._slots
        self._slots[partial.channel] = partial
        self._wake.set()
        return replaced

    def discard_partial(self, segment: int) -> bool:
        return False  # channels discard their own (discard_channel_partial)

    def discard_channel_partial(self, channel: int) -> bool:
        return self._slots.pop(channel, None) is not None

    def _take_partial(self) -> Any:
        return self._slots.pop(next(iter(self._slots))) if self._slots else None
