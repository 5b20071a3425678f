"""OpenAI Realtime transcription on the stream port: GET /v1/realtime?intent=transcription (WebSocket).

The events are OpenAI's (server/realtime_events.py); the machinery is every stream's (server/streaming.py:
admission, backpressure, the worker, the ordered send loop). Per item (one VAD segment, or one commit,
however many segments an upload of its audio would have):
    input_audio_buffer.speech_started -> .speech_stopped -> .committed                  (server_vad)
    input_audio_buffer.committed                                                          (after a commit)
    conversation.item.input_audio_transcription.delta ... -> .completed (or .failed)
Deltas are append-only: a partial sends only the words pipeline/stable_prefix.py commits, the final sends
the rest as a last delta. `.completed` carries the final's own transcript, the same words an upload of the
segment gets: the deltas add up to it unless a committed partial word was wrong (then the deltas keep it,
as append-only text must, and `.completed`, which clients keep as the turn's text, corrects it).
Mistakes in a client event (bad JSON, bad base64, an unsupported format, an empty commit, an unknown
type) are `error` events and the session goes on, as OpenAI's does; the stream's own limits (token,
flood, idle, size) close it as on the other endpoints.
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from pipeline.audio import SAMPLE_RATE, AudioFormat, Resampler, decode_pcm
from pipeline.errors import AudioFormatError, ProtocolError, UnipadError, quoted
from pipeline.segmenter import SegmentFinished, SpeechStarted
from pipeline.stable_prefix import StablePrefix
from pipeline.stream import StreamSession
from pipeline.trim import segments_in

from pipeline.transcript import join_texts
from .protocol import CLOSE_GOING_AWAY
from .realtime_events import (BETA_UPDATE, GA_UPDATE, EventError, SessionConfig, apply_update, error_event, event,
                              new_id, parse_event, segmenter_options, session_object)
from .outbox import Outbox
from .streaming import StreamConnection, StreamGone
from .worker import Job

if TYPE_CHECKING:
    from .server import Server

MIN_COMMIT_SECONDS = 0.1  # OpenAI refuses to commit less than 100 ms of audio
MAX_UNCOMMITTED_SECONDS = 300.0  # turn_detection null: audio held until a commit (~15 MB at 24 kHz, OpenAI's cap)
OUTBOX_LIMIT = 256  # events waiting for a client: a few per item plus error answers to a burst of mistakes
# An error echoes the event_id of the event it answers: at most this much of it, so that an outbox of errors
# stays small (a client that wrote megabyte ids and read nothing held 130 MB).
MAX_ECHOED_EVENT_ID = 256
TRANSCRIPTION = "conversation.item.input_audio_transcription"
# A commit that ends inside speech (a client's VAD ended the turn as the next word began: pipecat's default
# stop_secs is 0.2 s) holds the start of a word it cut off. Its last segment waits for this much of the audio
# that follows the commit and is heard with it, so the word is heard whole; the words that start after the
# commit are left to the next item (pipeline.families.sensevoice.decoding.before_cut). Alone, the piece was misheard ("s" of
# "save" as "slower") and the next item, hearing the word whole as its context, dropped it as said.
LOOKAHEAD_SECONDS = 0.5
LOOKAHEAD_WAIT = 1.0  # seconds: a client that sends nothing after such a commit gets its item this much later
RUN_IN_SECONDS = 0.06  # speech that ends this close to the commit's end (two VAD frames) ran into it


class RealtimeConnection(StreamConnection):
    """One Realtime transcription session, from the handshake to the close."""

    log = logging.getLogger(__name__)
    log_name = "realtime session"

    def __init__(self, app: Server, ws: ServerConnection) -> None:
        super().__init__(app, ws)
        self.outbox = Outbox(OUTBOX_LIMIT)
        self.session_id = new_id("sess")
        self.config = SessionConfig()
        self._context: Any = None  # a Qwen3-ASR's context of the session's prompt (and the server's hotwords)
        self._received = 0.0  # seconds of audio appended in the whole session (the flood policy)
        self._pending = 0.0  # seconds appended since the last commit or clear
        self._manual: list[np.ndarray] = []  # turn_detection null: 16 kHz audio awaiting a commit
        self._resampler: Resampler | None = None  # turn_detection null: the client's rate -> 16 kHz
        # Each commit, clear or format change starts a new StreamSession; its segments and times are
        # shifted into the session's: segment numbers after `_segment_base`, times after `_time_base`.
        self._segment_base = 0
        self._segments_here = 0  # segment numbers the current StreamSession (or commit) has used
        self._time_base = 0.0
        self._items: dict[int, str] = {}  # open segment -> its item id
        self._prefixes: dict[int, StablePrefix] = {}  # open segment -> its committed text
        self._commits: dict[int, _CommitItem] = {}  # segment of a commit awaiting its final -> the commit's item
        self._last_item: str | None = None
        self._held: SegmentFinished | None = None  # a commit's last segment awaiting its look-ahead
        self._held_timer: asyncio.Task | None = None
        self._order = asyncio.Lock()  # segments reach the worker in stream order, a held one too

    # ---- the conversation ------------------------------------------------------------------------------

    async def _serve(self) -> None:
        self._check_token(None, "with the handshake")
        self._new_session()
        self._put(event("session.created", session=session_object(self.session_id, self.config)))
        while True:
            message = await self._next_message()
            if message is None:
                await self._flush(commit=True)
                await self._release()  # nothing follows
                await self._until_closed(self._finals_sent.wait())
                await self._close(CLOSE_GOING_AWAY, "server shutting down")
                return
            self._check_flood(self._received)
            try:  # text events carry the audio (base64): websockets bounds them by --max-message-bytes
                if isinstance(message, bytes):
                    raise EventError("binary frames are not events: send JSON text events", code="invalid_event")
                await self._dispatch(parse_event(message))
            except EventError as exc:
                self._put(error_event(exc.message, exc.code, exc.param, exc.event_id))

    async def _dispatch(self, data: dict[str, Any]) -> None:
        kind = data["type"]
        try:
            if kind in (GA_UPDATE, BETA_UPDATE):
                await self._update(data)
            elif kind == "input_audio_buffer.append":
                await self._append(data.get("audio"))
            elif kind == "input_audio_buffer.commit":
                await self._commit()
            elif kind == "input_audio_buffer.clear":
                await self._release()  # committed: its look-ahead is what is cleared
                self._restart()
                if self._continuation is not None:  # the next speech no longer follows the last segment
                    self._continuation.forget()
                self._put(event("input_audio_buffer.cleared"))
            else:
                raise EventError(f"Invalid value: {quoted(kind)}. This server takes {GA_UPDATE}, {BETA_UPDATE} and "
                                 "input_audio_buffer.append, .commit and .clear", param="type")
        except EventError as exc:
            event_id = data.get("event_id")  # echoed in the error: a client's own ids are short
            exc.event_id = event_id[:MAX_ECHOED_EVENT_ID] if isinstance(event_id, str) else None
            raise

    async def _update(self, data: dict[str, Any]) -> None:
        config = apply_update(self.config, data, self.app.engine.model.manifest.languages)
        if config.prompt != self.config.prompt and self.app.engine.family.prompt:  # its prompt's context; CTC: unused
            try:
                self._context = self.app.hotword_graph((), config.prompt) if config.prompt else None
            except ProtocolError as exc:
                raise EventError(str(exc), param="session.audio.input.transcription.prompt") from None
        if config.rate != self.config.rate or config.turn_detection != self.config.turn_detection:
            await self._flush(commit=True)  # what was said under the old settings becomes items now
            await self._release()  # what follows is at the new settings
            self.config = config
            self._restart()
        self.config = config
        kind = "session.updated" if data["type"] == GA_UPDATE else "transcription_session.updated"
        self._put(event(kind, session=session_object(self.session_id, self.config)))

    async def _append(self, audio: Any) -> None:
        if not isinstance(audio, str):
            raise EventError("Missing required parameter: 'audio' (base64 PCM16)", param="audio",
                             code="missing_required_parameter")
        try:
            data = base64.b64decode(audio, validate=True)
        except (binascii.Error, ValueError):
            raise EventError("Invalid 'audio'. Expected base64-encoded audio bytes", param="audio",
                             code="invalid_base64") from None
        seconds = len(data) / 2 / self.config.rate
        if self._resampler is not None and self._pending + seconds > MAX_UNCOMMITTED_SECONDS:
            raise EventError(f"the input audio buffer holds {MAX_UNCOMMITTED_SECONDS:g} s at most without turn "
                             "detection: commit it (this audio was dropped)", param="audio",
                             code="input_audio_buffer_full")
        try:
            if self._resampler is not None:
                self._manual.append(self._resampler.process(decode_pcm(data, self._format())))
            else:
                await self._feed_audio(data)
        except (AudioFormatError, ProtocolError) as exc:  # an odd byte count
            raise EventError(f"Invalid 'audio': {exc}", param="audio", code="invalid_audio") from None
        self._received += seconds
        self._pending += seconds
        if self._held is not None and sum(map(len, self._manual)) >= LOOKAHEAD_SECONDS * SAMPLE_RATE:
            await self._release(np.concatenate(self._manual))

    async def _commit(self) -> None:
        if self._pending < MIN_COMMIT_SECONDS:
            raise EventError("Error committing input audio buffer: buffer too small. Expected at least "
                             f"{MIN_COMMIT_SECONDS * 1000:.0f}ms of audio, but buffer only has "
                             f"{self._pending * 1000:.2f}ms of audio.", code="input_audio_buffer_commit_empty")
        before = self._last_item
        await self._flush(commit=True)
        if self._last_item == before:  # no speech in it: still an item, with an empty transcript (as OpenAI)
            item = new_id("item")
            self._put(event("input_audio_buffer.committed", item_id=item, previous_item_id=self._last_item))
            self._put(event(f"{TRANSCRIPTION}.completed", item_id=item, content_index=0, transcript="",
                            usage={"type": "duration", "seconds": round(self._pending, 3)}))
            self._last_item = item
        self._restart()

    # ---- audio, segments and items -----------------------------------------------------------------------

    def _format(self) -> AudioFormat:
        return AudioFormat(self.config.rate, "s16le", 1)

    def audio_seconds(self) -> float:  # without turn detection the audio waits in _manual, not in a session
        return self._received

    def _new_session(self) -> None:
        self.session = StreamSession(self._format(), segmenter_options(self.app.segmenter_options, self.config))
        self._resampler = Resampler(self.config.rate) if self.config.turn_detection is None else None
        self._manual, self._pending = [], 0.0

    def _restart(self) -> None:
        """Forget the uncommitted audio (an open segment with it) and go on with a fresh StreamSession."""
        assert self.session is not None
        if self._resampler is None:
            self._time_base += self.session.received_seconds
        else:
            self._time_base += sum(len(a) for a in self._manual) / SAMPLE_RATE
        self._segment_base += self._segments_here
        self._segments_here = 0
        self._arrivals.clear()
        self._new_session()

    async def _flush(self, commit: bool) -> None:
        """The uncommitted audio becomes items: with server_vad its open segment (if speech was heard);
        without turn detection all of it, as one item of the segments an upload of it would have."""
        assert self.session is not None
        if self._resampler is None:
            await self._handle(self.session.finish())
            return
        if not commit:
            return
        audio = np.concatenate(self._manual + [self._resampler.flush()])
        self._manual = [audio]  # for _restart's time accounting
        await self._release(audio)  # the previous commit's held segment first: this audio followed it
        if self._continuation is not None:  # the next commit's context is this sound as it came
            self._continuation.heard(audio, self._time_base)
        found = segments_in(audio, self.app.segmenter_options, cut=True)
        if not found:  # no speech at all: no segment (a commit answers with an empty transcript)
            return
        commit_item = _CommitItem(new_id("item"), len(found), found[-1].end - found[0].start)
        self._put(event("input_audio_buffer.committed", item_id=commit_item.item, previous_item_id=self._last_item))
        self._last_item = commit_item.item
        for e in found:
            self._commits[e.segment + self._segment_base] = commit_item
        if len(audio) / SAMPLE_RATE - found[-1].end > RUN_IN_SECONDS:
            await self._handle(found)
            return
        await self._handle(found[:-1])
        self._held = self._shifted(found[-1])
        self._held_timer = asyncio.ensure_future(self._release_later())

    async def _release_later(self) -> None:
        await asyncio.sleep(LOOKAHEAD_WAIT)
        self._held_timer = None
        try:
            await self._release()
        except (ConnectionClosed, StreamGone):
            pass  # the session's end releases its jobs

    def _release_jobs(self) -> None:
        if self._held_timer is not None:
            self._held_timer.cancel()
        self._held = None
        super()._release_jobs()

    async def _release(self, after: np.ndarray | None = None) -> None:
        """The held segment (if any) to the worker, heard with up to LOOKAHEAD_SECONDS of `after`, the audio
        that followed its commit (None: as it was cut)."""
        held, self._held = self._held, None
        if held is None:
            return
        if self._held_timer is not None:
            self._held_timer.cancel()
            self._held_timer = None
        if after is not None and len(after):
            after = after[:int(LOOKAHEAD_SECONDS * SAMPLE_RATE)]
            cut = held.audio_start + len(held.audio) / SAMPLE_RATE
            held = dataclasses.replace(held, audio=np.concatenate([held.audio, after]).astype(np.float32, copy=False),
                                       end=round(cut + len(after) / SAMPLE_RATE, 6), cut=round(cut, 6))
        async with self._order:
            await super()._handle([held])

    async def _handle(self, events: list[Any]) -> None:
        """The StreamSession's events, shifted into the session's numbering and time; item events first."""
        shifted = [self._shifted(e) for e in events]
        async with self._order:
            await super()._handle(shifted)

    def _shifted(self, e: Any) -> Any:
        """One StreamSession event in the session's numbering and time, its item's events sent."""
        self._segments_here = max(self._segments_here, e.segment + 1)
        fields: dict[str, Any] = {"segment": e.segment + self._segment_base, "start": e.start + self._time_base}
        if not isinstance(e, SpeechStarted):
            fields |= {"end": e.end + self._time_base, "audio_start": e.audio_start + self._time_base}
        e = dataclasses.replace(e, **fields)
        if isinstance(e, SpeechStarted):
            self._items[e.segment] = new_id("item")
            # OpenAI's audio_start_ms includes the prefix padding the client asked for (the model
            # itself hears only the server's pre-roll: pipeline/trim.py).
            padded = max(self._time_base, e.start - self.config.turn_detection.prefix_padding_ms / 1000)
            self._put(event("input_audio_buffer.speech_started", audio_start_ms=ms(padded),
                            item_id=self._items[e.segment]))
        elif isinstance(e, SegmentFinished) and self._resampler is None:  # a commit's item: _flush
            item = self._items.setdefault(e.segment, new_id("item"))
            self._put(event("input_audio_buffer.speech_stopped", audio_end_ms=ms(e.end), item_id=item))
            self._put(event("input_audio_buffer.committed", item_id=item, previous_item_id=self._last_item))
            self._last_item = item
            self._pending = 0.0
        return e

    def _speech_end_arrival(self, end: float) -> float:
        return super()._speech_end_arrival(end - self._time_base)  # arrivals are in the StreamSession's time

    # ---- results -------------------------------------------------------------------------------------

    def _error(self, code: str, message: str) -> dict[str, Any]:
        return error_event(message, code, kind="server_error" if code == "internal_error" else "invalid_request_error")

    def _job_options(self) -> dict[str, Any]:
        return {"deliver": self._on_result, "language": self.config.language,
                "hotwords": self._context or self.app.server_hotword_graph, "punctuate": True}

    def _partial_item(self, job: Job, transcript: Any) -> _Partial:
        return _Partial(job.segment, transcript.text)

    def _on_final(self, job: Job, transcript: Any, error: UnipadError | None) -> None:
        if job.segment in self._commits:
            self._on_commit_part(self._commits.pop(job.segment), job, transcript, error)
            return
        item = self._items.pop(job.segment, None) or new_id("item")
        prefix = self._prefixes.pop(job.segment, StablePrefix())
        if error is not None:
            self._put(event(f"{TRANSCRIPTION}.failed", item_id=item, content_index=0,
                            error={"type": "server_error", "code": error.code, "message": str(error),
                                   "param": None}), arrived=job.arrived)
            return
        rest = prefix.complete(transcript.punctuated_text)
        if rest:
            self._put(event(f"{TRANSCRIPTION}.delta", item_id=item, content_index=0, delta=rest))
        # The final's own words, never the committed partials': every client takes the turn's text from
        # `.completed` (pipecat, LiveKit, openai-agents), and a partial hears only the start of a turn
        # ("next next" for "next", "off" for "delete": issue 36's turn edges).
        self._put(event(f"{TRANSCRIPTION}.completed", item_id=item, content_index=0,
                        transcript=transcript.punctuated_text.strip(),
                        usage={"type": "duration", "seconds": round(job.end - job.start, 3)}), arrived=job.arrived)

    def _on_commit_part(self, commit: _CommitItem, job: Job, transcript: Any, error: UnipadError | None) -> None:
        """One segment of a commit decoded (they come in order): its words as a delta of the commit's item,
        and with the last one the item's `.completed` (or `.failed`, if any of its segments failed). Each
        segment's final goes to the outbox once (`arrived`), as the backpressure counts them."""
        before = join_texts(commit.texts)
        commit.texts.append(transcript.punctuated_text if error is None else "")
        commit.error = commit.error or error
        delta = join_texts(commit.texts)[len(before):]
        if delta and commit.error is None:
            self._put(event(f"{TRANSCRIPTION}.delta", item_id=commit.item, content_index=0, delta=delta),
                      arrived=None if len(commit.texts) == commit.segments else job.arrived)
        elif len(commit.texts) < commit.segments:
            self._put(None, arrived=job.arrived)  # nothing to send, but this final is done
        if len(commit.texts) < commit.segments:
            return
        if commit.error is not None:
            self._put(event(f"{TRANSCRIPTION}.failed", item_id=commit.item, content_index=0,
                            error={"type": "server_error", "code": commit.error.code, "message": str(commit.error),
                                   "param": None}), arrived=job.arrived)
            return
        self._put(event(f"{TRANSCRIPTION}.completed", item_id=commit.item, content_index=0,
                        transcript=join_texts(commit.texts), usage={"type": "duration", "seconds": commit.seconds}),
                  arrived=job.arrived)

    def _render(self, message: Any) -> str | None:
        if message is None:  # a commit's segment that added no words
            return None
        if isinstance(message, _Partial):  # what is stable is decided when it is sent (replaced partials skip)
            item = self._items.get(message.segment)
            delta = self._prefixes.setdefault(message.segment, StablePrefix()).update(message.text)
            if not delta or item is None:
                return None
            message = event(f"{TRANSCRIPTION}.delta", item_id=item, content_index=0, delta=delta)
        return json.dumps(message, ensure_ascii=False)

    def _sent(self, message: Any) -> None:
        if isinstance(message, _Partial):
            self.app.metrics.partials.inc()
        elif isinstance(message, dict) and message.get("type") == "error":
            self.app.metrics.errors.labels(message["error"]["code"] or "error").inc()


@dataclass
class _CommitItem:
    """The one item of a commit, whose segments are decoded one by one."""
    item: str
    segments: int  # how many the commit holds
    speech_seconds: float  # from the first one's speech start to the last one's end
    texts: list[str] = dataclasses.field(default_factory=list)  # theirs so far, in order
    error: UnipadError | None = None  # the first segment that failed

    @property
    def seconds(self) -> float:
        return round(self.speech_seconds, 3)


@dataclass(frozen=True)
class _Partial:
    segment: int
    text: str


def ms(seconds: float) -> int:
    return int(round(seconds * 1000))
