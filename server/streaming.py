"""What every stream endpoint shares, whatever its wire format: the machinery between a WebSocket, a
StreamSession and the worker.

    StreamConnection   base class of every door's stream (server/doors.py: Unipad's, Deepgram's, OpenAI
                       Realtime's, FunASR's, Wyoming's): lifecycle (admission, errors -> error message + close
                       code, job cancellation), receiving (idle timeout and server shutdown in
                       server/receiver.py, flood policy, token check), feeding audio, backpressure on finals,
                       the worker's partial results, the ordered send loop with its send timeout, and the
                       close that drains incoming frames.
    Outbox             the bounded, ordered queue of one connection's outgoing messages.
The only place where UnipadError becomes a close code. Every failure stays inside its connection: the
error message is sent first, then the close, and the session's waiting jobs are cancelled.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import time
import uuid
from typing import TYPE_CHECKING, Any, Awaitable

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from pipeline.errors import AudioFormatError, AuthenticationError, ProtocolError, UnipadError
from pipeline.segmenter import PartialDue, SegmentFinished
from pipeline.stream import StreamSession
from pipeline.trim import Continuation, prepared

from .http import client_address, token_matches
from .logs import StreamLog
from .protocol import (
    CLOSE_INTERNAL,
    CLOSE_INVALID_PAYLOAD,
    CLOSE_POLICY,
    CLOSE_TOO_BIG,
    CLOSE_TRY_AGAIN,
    CLOSE_UNSUPPORTED,
    MAX_TEXT_MESSAGE,
)
from .outbox import MAX_FINALS_IN_FLIGHT, Outbox, Outgoing
from .receiver import Receiver
from .worker import FINAL, PARTIAL, Job

if TYPE_CHECKING:
    from .server import Server

SEND_TIMEOUT = 10.0  # seconds a closing connection waits for its last messages to reach the client
# Message-rate policy against floods of tiny frames (each costs a decode and a loop turn whatever its
# size): a stream may send at most FLOOD_BURST messages plus FLOOD_RATE per second of audio received,
# i.e. 2 ms of audio per message on average. Real clients send 10-100 ms per message (an unbatched
# AudioWorklet quantum, 128 frames, is 2.7 ms at 48 kHz); more messages close the stream with 1008.
FLOOD_BURST = 1000
FLOOD_RATE = 500  # messages per second of audio
_ARRIVALS = 1024  # recent (stream seconds, arrival time) pairs kept for the latency metric

# Error code -> close code. Anything else a client did wrong (bad_order, unknown_type, bad_start,
# unauthorized, idle_timeout, too_many_messages) is a policy violation.
CLOSE_CODES = {
    "invalid_json": CLOSE_INVALID_PAYLOAD,
    "invalid_audio": CLOSE_INVALID_PAYLOAD,
    "unsupported_audio": CLOSE_UNSUPPORTED,
    "message_too_big": CLOSE_TOO_BIG,
    "overloaded": CLOSE_TRY_AGAIN,
    "internal_error": CLOSE_INTERNAL,
}


def close_code(error: UnipadError) -> int:
    return CLOSE_CODES.get(error.code, CLOSE_POLICY)


def check_text_size(text: str, hint: str = "") -> None:
    """Raise ProtocolError message_too_big for a control message over MAX_TEXT_MESSAGE characters."""
    if len(text) > MAX_TEXT_MESSAGE:
        raise ProtocolError(f"control message of {len(text)} characters (at most {MAX_TEXT_MESSAGE}){hint}",
                            code="message_too_big")


class StreamGone(Exception):
    """The WebSocket closed while this connection waited for something else."""


class StreamConnection:
    """One WebSocket stream from the handshake to the close; a door's subclass supplies the wire format.

    Every door overrides (each raises NotImplementedError here):
        _serve()                          the conversation, from the first message to the close
        _error(code, message)             an error message in its format
        _job_options()                    `deliver`, `language`, `itn`, `hotwords` of the jobs it submits
        _partial_item(job, transcript)    what goes to the outbox for a partial result
        _on_final(job, transcript, error) a final result (or its inference error)
        _render(message)                  an outgoing message as a frame (None: send nothing)
    A door may also override:
        log, log_name, went_away, internal_message   its logger; how log lines name it; the end line's
                                          reason for a client's close; the text of an internal error
        outbox                            set in __init__: an Outbox of its own size or kind
        _count_final()                    a segment's final was submitted (its own bookkeeping)
        _sent(message)                    after a message went out (metrics)
        _close(code, reason, error)       the close (e.g. counting the errors it sends)
        _handle(events)                   a StreamSession's events to jobs (e.g. shifted into its own numbering)
        _submit(...)                      one job to the worker (e.g. a job per audio channel, its own arguments)
        _on_result(job, transcript, error)  the worker's answer, before the partial/final split
        _speech_end_arrival(end)          when the audio at stream time `end` arrived (its own time base)
        _release_jobs()                   at the end: cancel its jobs (and any it holds back)
        audio_seconds(), segments_finished()  what the stream's end line reports, when no one session holds it
    """

    log = logging.getLogger(__name__)  # subclasses log under their own module's name
    log_name = "session"  # how log lines name a connection
    went_away = "client went away"
    internal_message = "internal error: {}"  # the error message of an unexpected exception (its type)

    def __init__(self, app: Server, ws: ServerConnection) -> None:
        self.app = app
        self.ws = ws
        self.id = uuid.uuid4().hex[:12]
        self._session: StreamSession | None = None
        self._audio_before = 0.0  # seconds received by the sessions this connection held before its current one
        self.outbox = Outbox()
        self._inflight = asyncio.Semaphore(MAX_FINALS_IN_FLIGHT)
        self._unsent_finals = 0
        self._finals_sent = asyncio.Event()
        self._finals_sent.set()
        self._jobs: set[Job] = set()  # submitted and not yet delivered (of partials, only the newest)
        self._closed_segment = -1  # highest segment whose SegmentFinished has been seen
        # finals that continue the previous one are heard after its end (pipeline/trim.py); words need times
        self._continuation = Continuation(app.segmenter_options) if app.engine.family.word_times else None
        # (stream seconds received, monotonic time) after each audio message, for the latency metric
        self._arrivals: collections.deque[tuple[float, float]] = collections.deque(maxlen=_ARRIVALS)
        self._sender: asyncio.Task[None] | None = None
        self._receiver = Receiver(ws.recv, app.config.idle_timeout, app.shutting_down, app.receiving)
        self._messages = 0  # client messages received (the flood policy)

    @property
    def session(self) -> StreamSession | None:
        """The StreamSession hearing the audio now (a door may renew it: a Realtime commit, a Wyoming request)."""
        return self._session

    @session.setter
    def session(self, session: StreamSession | None) -> None:
        if self._session is not None and session is not self._session:
            self._audio_before += self._session.received_seconds
        self._session = session

    def audio_seconds(self) -> float:
        """Seconds of audio this connection received, over every session it held (its end-of-stream log)."""
        return self._audio_before + (self._session.received_seconds if self._session is not None else 0.0)

    def segments_finished(self) -> int:
        """Segments this connection finished (its end-of-stream log)."""
        return self._closed_segment + 1

    # ---- lifecycle -----------------------------------------------------------------------------------

    async def run(self) -> None:
        self._sender = asyncio.create_task(self._send_loop())
        ending = StreamLog(self)  # one line as the stream starts, one as it ends (server/logs.py)
        try:
            self.app.admit(self)
            ending.started()
            try:
                await self._serve()
            finally:
                self.app.release(self)
        except UnipadError as exc:
            ending.fail(exc.code, str(exc))
            await self._close(close_code(exc), exc.code, self._error(exc.code, str(exc)))
        except (ConnectionClosed, StreamGone):
            ending.reason = self.went_away
        except Exception as exc:  # noqa: BLE001 - a bug must not take the server down
            ending.fail("internal_error", f"internal error ({type(exc).__name__})", bug=exc)
            await self._close(CLOSE_INTERNAL, "internal_error",
                              self._error("internal_error", self.internal_message.format(type(exc).__name__)))
        finally:
            self._receiver.close()
            self._release_jobs()
            if not self._sender.done():
                self._sender.cancel()
            # A cancelled task keeps its CancelledError, whose traceback holds the send loop's frame and so this
            # connection: with the task still ours, every connection a client closed was a reference cycle that
            # only Python's full collection freed (its segmenter's buffers included).
            self._sender = None
            ending.ended()

    async def _serve(self) -> None:
        raise NotImplementedError

    def _error(self, code: str, message: str) -> Any:
        raise NotImplementedError

    async def _close(self, code: int, reason: str, error: Any = None) -> None:
        """Send what is queued (plus `error`), then close with `code`."""
        if error is not None:
            self.outbox.put(Outgoing(error), last=True)
        self.outbox.close()
        if self._sender is not None:
            await asyncio.wait({self._sender}, timeout=SEND_TIMEOUT)
        # Read and drop what the client still sends: a client that keeps sending would otherwise fill
        # websockets' read queue, which then stops reading, and our close frame's answer behind it would
        # never be seen (the close would wait its full timeout).
        discard = asyncio.ensure_future(self._discard_incoming())
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

    def _release_jobs(self) -> None:
        self.app.worker.cancel_session(self.id)
        for job in self._jobs:
            job.cancelled = True
        self._jobs.clear()

    # ---- receiving -----------------------------------------------------------------------------------

    async def _next_message(self) -> str | bytes | None:
        """The next client message; None when the server starts shutting down; ProtocolError when idle.
        Not before the outbox has room: a client that sends faster than it reads our answers waits."""
        while self.outbox.crowded():
            assert self._sender is not None
            taken = asyncio.ensure_future(self.outbox.taken())
            try:
                await asyncio.wait({taken, self._sender}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                taken.cancel()
            if self._sender.done():  # it dropped a client that took nothing (_send)
                raise StreamGone()
        return await self._receiver.next()

    def _check_flood(self, seconds: float) -> None:
        """Count one client message against FLOOD_BURST + FLOOD_RATE x `seconds` of audio received."""
        self._messages += 1
        if self._messages > FLOOD_BURST + FLOOD_RATE * seconds:
            raise ProtocolError(f"{self._messages} messages for {seconds:.3f} s of audio: send at 10-100 ms "
                                "of audio per message", code="too_many_messages")

    def _check_token(self, given: str | None, where: str) -> None:
        """The token sent in the first message, unless the handshake already proved it (server/http.py)."""
        expected = self.app.config.token
        if expected is None or getattr(self.ws, "authenticated", False):
            return
        if not token_matches(expected, given):
            self.app.auth_failures.record(client_address(self.ws))  # the stream's end line logs it (WARNING)
            raise AuthenticationError(f"missing or wrong token (send it {where}, ?token= or Authorization)")

    async def _feed_audio(self, data: bytes) -> None:
        """Wire-format audio bytes -> the session -> jobs for its events."""
        assert self.session is not None
        arrived = time.monotonic()
        try:
            events = self.session.feed(data)
        except AudioFormatError as exc:  # malformed payload (odd length, NaN): 1007, not 1003
            raise ProtocolError(str(exc), code="invalid_audio") from None
        self._arrivals.append((self.session.stream_seconds, arrived))
        await self._handle(events)

    def _speech_end_arrival(self, end: float) -> float:
        """When the audio at stream time `end` reached the server (the oldest kept, if it is older)."""
        while len(self._arrivals) > 1 and self._arrivals[0][0] < end:
            self._arrivals.popleft()
        return self._arrivals[0][1] if self._arrivals else time.monotonic()

    async def _until_closed(self, awaitable: Awaitable[Any]) -> Any:
        """Await `awaitable` unless the WebSocket closes first (then raise StreamGone)."""
        task = asyncio.ensure_future(awaitable)
        closed = asyncio.ensure_future(self.ws.wait_closed())
        await asyncio.wait({task, closed}, return_when=asyncio.FIRST_COMPLETED)
        closed.cancel()
        if not task.done():
            task.cancel()
            raise StreamGone()
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
                self._count_final()
                self._submit(event, FINAL, arrived=self._speech_end_arrival(event.end))
            elif isinstance(event, PartialDue):
                self._submit(event, PARTIAL)
            # SpeechStarted has no message of its own: the first partial shows the segment.

    def _count_final(self) -> None:
        pass

    def _submit(self, event: PartialDue | SegmentFinished, kind: str, arrived: float = 0.0) -> None:
        event, context, said = prepared(event, self.app.segmenter_options,
                                        self._continuation if kind == FINAL else None)
        job = Job(session=self.id, kind=kind, segment=event.segment, start=event.start, end=event.end,
                  audio_start=event.audio_start, audio=event.audio, arrived=arrived, context=context, said=said,
                  cut=event.cut if isinstance(event, SegmentFinished) else None,
                  **self._job_options())
        if kind == PARTIAL:  # the worker keeps one partial per session: the ones it replaced never come back
            self._jobs = {j for j in self._jobs if j.kind != PARTIAL}
        self._jobs.add(job)
        self.app.worker.submit(job)

    def _job_options(self) -> dict[str, Any]:
        raise NotImplementedError

    def _on_result(self, job: Job, transcript: Any, error: UnipadError | None) -> None:
        """Called on the event loop by the worker with one job's result."""
        self._jobs.discard(job)
        if job.cancelled:
            return
        if job.kind == PARTIAL:
            if error is not None or job.segment <= self._closed_segment:
                self.app.metrics.partials_dropped.inc()  # stale: the segment's final is on its way
            elif self.outbox.put_partial(self._partial_item(job, transcript)):
                self.app.metrics.partials_dropped.inc()
            return
        self._on_final(job, transcript, error)

    def _partial_item(self, job: Job, transcript: Any) -> Any:
        raise NotImplementedError

    def _on_final(self, job: Job, transcript: Any, error: UnipadError | None) -> None:
        raise NotImplementedError

    # ---- sending -------------------------------------------------------------------------------------

    def _put(self, message: Any, arrived: float | None = None) -> None:
        self.outbox.put(Outgoing(message, arrived))

    async def _send_loop(self) -> None:
        metrics = self.app.metrics
        try:
            while (item := await self.outbox.get()) is not None:
                text = self._render(item.message)
                if text is not None:
                    if not await self._send(text):
                        return
                    self._sent(item.message)
                if item.arrived is not None:  # a segment's final or its inference error
                    metrics.segments.inc()
                    metrics.final_latency.observe(time.monotonic() - item.arrived)
                    self._final_done()
        except ConnectionClosed:
            pass
        except Exception:  # noqa: BLE001 - a message we cannot encode is a bug; don't leave the stream hanging
            self.log.exception("%s %s: cannot send", self.log_name, self.id)
            await self.ws.close(CLOSE_INTERNAL, "internal_error")

    def _render(self, message: Any) -> str | None:
        raise NotImplementedError

    def _sent(self, message: Any) -> None:
        pass

    async def _send(self, text: str) -> bool:
        """Send one message; a client that does not take it within send_timeout is not reading: its
        buffers are full, a close frame would not get through either, so the TCP connection is aborted
        (the outbox stays bounded, and the stream's backpressure has already stopped its audio)."""
        timeout = self.app.config.send_timeout
        try:
            await asyncio.wait_for(self.ws.send(text), timeout)
            return True
        except asyncio.TimeoutError:
            self.log.warning("%s %s: the client took no message for %g s (not reading); dropping it",
                             self.log_name, self.id, timeout)
            self.app.metrics.sessions_dropped.labels("not_reading").inc()
            self.ws.transport.abort()
            return False

    def _final_done(self) -> None:
        self._unsent_finals -= 1
        self._inflight.release()
        if self._unsent_finals == 0:
            self._finals_sent.set()
