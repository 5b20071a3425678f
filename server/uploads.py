"""An upload's decoding, whatever door it came in by (OpenAI's POST /v1/audio/transcriptions, Deepgram's
POST /v1/listen): `FileTranscription`, the job a door's own upload class builds on.

The audio is cut by the same VAD as live streams (StreamSession, no partials) and decoded by the same
worker, as BATCH jobs: after every waiting final, taking turns with partials (server/worker.py), at most
FILE_JOBS_IN_FLIGHT at a time, so a long file neither starves live streams nor fills the queue. An upload
counts as one session against --max-sessions while it runs. One that continues the same client's previous
upload in real time (a live client's VAD cut both from one stream) is heard after the end of that one
(server/upload_sequence.py). What goes wrong here is an `UploadError`, which each door words in its own
error body; the request, its body and its answer are the door's.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import uuid
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Iterator

import numpy as np

from pipeline.audio import SAMPLE_RATE, AudioFormat
from pipeline.errors import AudioFormatError, OverloadError, UnipadError
from pipeline.segmenter import SegmentFinished
from pipeline.stream import StreamSession
from pipeline.trim import Continuation, prepared, shifted, sound_end

from .http import client_address
from .http_body import HttpExchange
from .protocol import Final, TokenTime
from .upload_sequence import Upload
from .worker import BATCH, Job

if TYPE_CHECKING:
    from .server import Server

log = logging.getLogger(__name__)

MAX_UPLOAD_BYTES = 25 << 20  # an upload's body at most: OpenAI's own limit (25 MB); larger bodies get 413
FILE_JOBS_IN_FLIGHT = 2  # an upload's segments queued or in inference at once (the worker stays busy)
JOB_TIMEOUT = 120.0  # seconds one segment may wait for the worker before the request fails (503)
# A segment's final (its text punctuated where the upload asked and a punctuation model serves), its words, and
# each word as that punctuated text writes it (None: not punctuated)
Segment = tuple[Final, list[TokenTime], list[str] | None]


class UploadError(Exception):
    """A failure of the upload machinery, in no door's words: HTTP `status`, a message, a code (and the
    request field at fault); each door answers it with its own error body."""

    def __init__(self, status: int, message: str, code: str | None, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param


def invalid_file(exc: AudioFormatError) -> UploadError:
    return UploadError(400, f"Invalid file format: {exc}", "invalid_file", param="file")


async def unless_client_leaves(exchange: HttpExchange, work: Any, door_log: logging.Logger, door: str) -> None:
    """Await an upload's `work`; when the client goes away first, cancel it (its jobs with it) and log that
    under the door's logger (`door`: how its lines name a request)."""
    task = asyncio.ensure_future(work)
    lost = exchange.connection.connection_lost_waiter
    await asyncio.wait({task, lost}, return_when=asyncio.FIRST_COMPLETED)
    if not task.done():
        task.cancel()
        door_log.info("%s request from %s: the client went away", door, client_address(exchange.connection))
        return
    task.result()


class FileTranscription:
    """One upload from its body to its answer; admitted like a stream, its jobs cancelled when it ends. A
    door's subclass reads the request and answers it; `segment_results` is the decoding."""

    def __init__(self, app: Server, exchange: HttpExchange) -> None:
        self.app = app
        self.exchange = exchange
        self.id = uuid.uuid4().hex[:12]
        self._slots = asyncio.Semaphore(FILE_JOBS_IN_FLIGHT)
        self._samples = 0  # of the upload decoded so far, at SAMPLE_RATE
        self.hotwords: Any = None  # the ContextGraph (Qwen3Context) its segments decode with; None: the server's
        self.punctuate = True  # its finals punctuated, where the server has a punctuation model (a door may ask not to)
        # The client (address, credentials, model, language) whose earlier upload this one may continue, and when
        # it arrived (server/upload_sequence.py); None: it continues none (the Deepgram door, --no-join-uploads).
        self.sequence_key: Hashable | None = None
        self.arrival = 0.0
        self.previous_arrival: float | None = None  # the same client's upload before it (the one it may continue)

    @contextlib.contextmanager
    def admitted(self, overloaded: Callable[[str], Exception]) -> Iterator[None]:
        """Counted like a stream while the block runs (`overloaded(message)` is raised when the server is
        warming up or full); its jobs still queued are cancelled when it ends."""
        try:
            self.app.admit(self)  # type: ignore[arg-type]
        except OverloadError as exc:
            raise overloaded(str(exc)) from None
        try:
            yield
        finally:
            self.app.release(self)  # type: ignore[arg-type]
            self.app.worker.cancel_session(self.id)

    async def segment_results(self, blocks: Iterator[Any], language: str,
                              timed_out: Callable[[str], Exception]) -> AsyncIterator[Segment]:
        """Each segment's (final, words), in order, as the worker delivers them, while the blocks are segmented
        and submitted (_submit_segments); `timed_out(message)` is raised when one takes longer than
        JOB_TIMEOUT, the producer's own error after the last. Run it under contextlib.aclosing: leaving early
        cancels the segments still queued (after a failure their results would go unread)."""
        pending: asyncio.Queue[asyncio.Future[Segment] | None] = asyncio.Queue()
        producer = asyncio.ensure_future(self._submit_segments(blocks, language, pending))
        try:
            while (future := await pending.get()) is not None:
                try:
                    result = await asyncio.wait_for(future, JOB_TIMEOUT)
                except asyncio.TimeoutError:
                    raise timed_out(f"no result from the model within {JOB_TIMEOUT:g} s; retry later") from None
                self._slots.release()
                yield result
            await producer  # its error, if any
        finally:
            producer.cancel()
            while not pending.empty():
                if (left := pending.get_nowait()) is not None:
                    left.cancel()

    async def _submit_segments(self, blocks: Iterator[Any], language: str, pending: asyncio.Queue[Any]) -> None:
        """Decode and segment the upload block by block (off the loop) and submit each segment,
        FILE_JOBS_IN_FLIGHT at most at once; queue each one's future in order, then None. An upload that
        continues an earlier one (server/upload_sequence.py) is placed after it on its timeline."""
        try:
            options = dataclasses.replace(self.app.segmenter_options, partial_interval=0.0)
            session = StreamSession(AudioFormat(SAMPLE_RATE, "f32le", 1), options)
            # a cut at the segment length limit falls inside speech: hear the end of the one before
            continuation = Continuation(options) if self.app.engine.family.word_times else None
            joining = continuation is not None and self.sequence_key is not None
            block = await asyncio.to_thread(next, blocks, None)
            following = None if block is None else await asyncio.to_thread(next, blocks, None)
            # Where the upload starts on its timeline, and its samples up to its last sound: a client's digital
            # silence after it (pipecat appends 0.5 s to each piece) is not part of the stream it was cut from.
            offset, sound = 0.0, 0
            while block is not None:
                if joining:
                    block_sound = sound_end(block)
                    sound = self._samples + block_sound if block_sound else sound
                    if not self._samples and following is None:  # a whole upload in one block: its length is known
                        earlier = self.app.uploads.continued(self.sequence_key, self.arrival, sound / SAMPLE_RATE,
                                                             self.previous_arrival)
                        if earlier is not None:
                            continuation, offset = earlier.continuation, earlier.end
                            log.debug("an upload from %s continues the one before it", self.sequence_key[0])
                events = await asyncio.to_thread(self._feed, block, session)
                await self._submit_each(events, language, continuation, offset, pending)
                block, following = following, (None if following is None else await asyncio.to_thread(next, blocks, None))
            await self._submit_each(session.finish(), language, continuation, offset, pending)
            if joining:
                self.app.uploads.keep(Upload(self.sequence_key, self.arrival, round(offset + sound / SAMPLE_RATE, 6),
                                             continuation.tail()))
        except AudioFormatError as exc:  # found while decoding (a NaN sample)
            raise invalid_file(exc) from None
        finally:
            pending.put_nowait(None)

    async def _submit_each(self, events: list[Any], language: str, continuation: Continuation | None, offset: float,
                           pending: asyncio.Queue[Any]) -> None:
        for event in events:
            if isinstance(event, SegmentFinished):
                await self._slots.acquire()
                pending.put_nowait(self._submit(shifted(event, offset) if offset else event, language, continuation,
                                                offset))

    def _feed(self, block: np.ndarray, session: StreamSession) -> list[Any]:
        """One block of the file through the segmenter (on a thread)."""
        self._samples += len(block)
        return session.feed(block.astype("<f4").tobytes())

    def _submit(self, event: SegmentFinished, language: str, continuation: Continuation | None,
                offset: float = 0.0) -> asyncio.Future[Segment]:
        """`event` on the upload's timeline (`offset` s from the upload's start); its answer in the upload's time."""
        future: asyncio.Future[Segment] = asyncio.get_running_loop().create_future()
        event, context, said = prepared(event, self.app.segmenter_options, continuation)

        def deliver(job: Job, transcript: Any, error: UnipadError | None) -> None:
            if future.done():
                return
            if error is not None:
                future.set_exception(UploadError(500, f"inference failed: {error}", error.code))
                return

            def back(t: float) -> float:  # the timeline's seconds -> the upload's
                return round(t - offset, 6) if offset else t
            future.set_result((Final(  # the model's tokens, as a live stream's final has them
                segment=job.segment, text=transcript.punctuated_text, start=back(job.start), end=back(job.end),
                language=transcript.language, emotion=transcript.emotion, event=transcript.event,
                tokens=[TokenTime(t.text, back(t.start), back(t.end)) for t in transcript.tokens]),
                [TokenTime(w.text, back(w.start), back(w.end)) for w in transcript.words],
                None if transcript.punctuation is None else list(transcript.punctuation.words)))

        self.app.worker.submit(Job(session=self.id, kind=BATCH, segment=event.segment, start=event.start,
                                   end=event.end, audio_start=event.audio_start, audio=event.audio,
                                   deliver=deliver, language=language,
                                   hotwords=self.hotwords or self.app.server_hotword_graph,
                                   context=context, said=said, punctuate=self.punctuate))
        return future
