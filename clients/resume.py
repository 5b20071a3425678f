"""Streams that survive losing their server: `connect(url, resume=True)` (docs/protocol.md, "Resuming").

    Backlog          sans-I/O: the audio sent that no final covers yet, bounded (ResumeOptions.keep_seconds),
                     and where a resume starts (the end of the last final, on the 30 ms VAD frame grid).
    ResumableStream  a `Stream` that, when its connection drops, the server drains (close 1001) or fails,
                     reconnects with backoff, sends `start` with a `resume` and re-sends the backlog.

The server keeps no state for resumption: any instance behind a load balancer continues the stream, its
segment numbers and its times, so the caller sees one stream with exactly one final per utterance.
"""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import math
import random
import time
from dataclasses import dataclass
from typing import Any, Callable

from websockets.exceptions import ConnectionClosed

from pipeline.segmenter import FRAME_SECONDS
from server.protocol import Error, Final, Start, Stop, encode
from server.resume import Resume

from .client import SEND_PIECE, STOP_TIMEOUT, Stream, connect
from .errors import ClientError, ConnectError, ServerError, StreamClosedError

log = logging.getLogger(__name__)

# Server errors after which the same stream may go on elsewhere; any other error ends it.
RETRYABLE_ERRORS = ("overloaded", "internal_error")
# Close codes that say the client itself was wrong: resuming would only repeat the mistake.
FATAL_CLOSES = (1003, 1007, 1008, 1009)
# Handshake refusals that another attempt would only repeat: wrong token, origin or path, not a WebSocket.
FATAL_STATUSES = (400, 401, 403, 404, 405, 426)


@dataclass(frozen=True)
class ResumeOptions:
    attempts: int = 8  # the stream's first connection (no audio is at stake yet): attempts before connect() fails
    backoff: float = 0.2  # seconds before the second attempt (the first is at once); doubles each time ...
    max_backoff: float = 5.0  # ... up to this, each wait drawn from its upper half (jitter)
    # A lost connection is tried again for as long as the audio kept lasts (keep_seconds from the loss: what
    # a live source says meanwhile is the next audio to keep), however many attempts that takes.
    keep_seconds: float = 60.0  # audio kept past the last final: a 30 s segment plus a margin for the server's lag


def resume_options(opener: connect) -> ResumeOptions:
    """`connect(resume=True)` means the defaults."""
    return ResumeOptions() if opener.resume is True else opener.resume


@dataclass(frozen=True)
class Resumption:
    """One reconnection of a stream, for the caller's records (`ResumableStream.resumptions`)."""
    resume: Resume
    began: float  # time.monotonic() when the connection was found lost
    resumed: float  # ... and when the new connection had `ready`
    attempts: int  # connection attempts, the one that worked included
    reason: str  # why the connection was lost
    failures: tuple[str, ...] = ()  # why each failed attempt failed ("HTTP 429", "overloaded", "refused ...")


class Backlog:
    """The audio of one stream that no final covers yet, as sent (wire bytes at the client's rate).

    Times are stream seconds. `cover(final)` drops what a final covers; a resume re-sends `pending()`,
    which starts at `resume_time`. Bounded: past `keep_seconds` the oldest audio goes (and the resume
    point moves on with it), so a server that is that far behind loses the start of its open segment.
    """

    def __init__(self, sample_rate: int, frame_bytes: int, keep_seconds: float) -> None:
        self.rate = sample_rate
        self.frame_bytes = frame_bytes  # bytes per sample frame (all channels)
        self.keep_frames = int(keep_seconds * sample_rate)
        self._chunks: collections.deque[tuple[int, bytes]] = collections.deque()  # (first sample, bytes)
        self.sent = 0  # sample frames sent in the whole stream
        self.resume_time = 0.0  # on the VAD frame grid
        self.next_segment = 0

    def add(self, data: bytes) -> None:
        self._chunks.append((self.sent, data))
        self.sent += len(data) // self.frame_bytes
        while self._chunks and self.sent - self._start_sample() > self.keep_frames:
            self._drop_to(self._chunks[1][0] if len(self._chunks) > 1 else self.sent)

    def cover(self, segment: int, end: float | None) -> None:
        """A final (or a segment's error, which has no `end`) arrived: later resumes start after it."""
        self.next_segment = max(self.next_segment, segment + 1)
        if end is not None:
            self._advance(round(end / FRAME_SECONDS) * FRAME_SECONDS)

    def resume(self, session: str) -> Resume:
        return Resume(session=session, segment=self.next_segment, time=round(self.resume_time, 6))

    def pending(self) -> list[bytes]:
        """The audio from `resume_time` on, to re-send on a new connection."""
        first = self._start_sample()
        out = []
        for start, data in self._chunks:
            skip = max(0, first - start) * self.frame_bytes
            if skip < len(data):
                out.append(data[skip:])
        return out

    def _start_sample(self) -> int:
        return math.floor(self.resume_time * self.rate + 1e-6)

    def _advance(self, time: float) -> None:
        if time <= self.resume_time:
            return  # never backwards: resume times are monotonic
        self.resume_time = time
        first = self._start_sample()
        while self._chunks and self._chunks[0][0] + len(self._chunks[0][1]) // self.frame_bytes <= first:
            self._chunks.popleft()

    def _drop_to(self, sample: int) -> None:
        """Forget audio before `sample` (the bound): the resume point moves up to the next frame of the grid."""
        self._advance(math.ceil(sample / self.rate / FRAME_SECONDS - 1e-9) * FRAME_SECONDS)


class ResumableStream(Stream):
    """A Stream whose connection may be replaced; made by `connect(..., resume=...)`."""

    def __init__(self, opener: connect, ws: Any, ready: Any) -> None:
        self._opener = opener
        self.options = resume_options(opener)
        start = opener.start
        self.backlog = Backlog(start.sample_rate, start.channels * (2 if start.format == "s16le" else 4),
                               self.options.keep_seconds)
        self.resumptions: list[Resumption] = []
        self._connected = asyncio.Event()  # a connection is up and its backlog re-sent: send() may go on
        self._connected.set()
        self._retry: str | None = None  # a retryable server error seen on the current connection
        self._closing = False
        self._resender: asyncio.Task[None] | None = None
        super().__init__(ws, start, ready, opener.on_partial, opener.on_final)

    async def send(self, audio: Any) -> None:
        data = self._pcm_to_send(audio)
        if not data:
            return
        await self._wait_connected()
        if self._error is not None:  # the stream failed while this send waited for a resume
            raise self._error
        pieces = [data[i:i + SEND_PIECE] for i in range(0, len(data), SEND_PIECE)]  # each a message the server takes
        for piece in pieces:  # before sending: if this connection fails, the resume re-sends them
            self.backlog.add(piece)
        ws = self._ws  # not a resumed one: its resume re-sends the backlog itself
        try:
            for piece in pieces:
                await ws.send(piece)
        except ConnectionClosed:
            pass  # the reader resumes and re-sends them

    async def stop(self, timeout: float = STOP_TIMEOUT) -> Any:
        if not self._stopped and self._error is None and self.done is None:
            self._stopped = True  # a resume in progress sends `stop` after the backlog
            if self._connected.is_set():
                try:
                    await self._ws.send(encode(Stop()))
                except ConnectionClosed:
                    pass
        return await super().stop(timeout)

    async def close(self) -> None:
        self._closing = True
        if self._resender is not None:
            self._resender.cancel()
        await super().close()

    async def _wait_connected(self) -> None:
        if self._connected.is_set():
            return
        waiter = asyncio.ensure_future(self._connected.wait())
        finished = asyncio.ensure_future(self._finished.wait())
        await asyncio.wait({waiter, finished}, return_when=asyncio.FIRST_COMPLETED)
        finished.cancel()
        if not waiter.done():
            waiter.cancel()
            raise self._error or StreamClosedError(None)

    # ---- reading and resuming -------------------------------------------------------------------------

    async def _read(self) -> None:
        try:
            while True:
                await self._receive()
                if self.done is not None or self._error is not None or self._closing:
                    return
                if not self._resumable():
                    return  # _end() reports the close
                await self._resume()
        except ClientError as exc:
            self._fail(exc)
        finally:
            self._connected.set()  # release senders; they see the error or the end
            await self._end()

    def _resumable(self) -> bool:
        code = self._ws.close_code
        return self._retry is not None or code not in FATAL_CLOSES

    async def _dispatch(self, message: Any) -> None:
        if isinstance(message, Error) and message.segment is None and message.code in RETRYABLE_ERRORS:
            self._retry = message.code  # the server closes next; the stream goes on elsewhere
            return
        if isinstance(message, Final):
            self.backlog.cover(message.segment, message.end)
        elif isinstance(message, Error) and message.segment is not None:
            self.backlog.cover(message.segment, None)
        await super()._dispatch(message)

    async def _resume(self) -> None:
        """Connect again (backoff between attempts), send start+resume, re-send the backlog (and stop)."""
        self._connected.clear()
        began = time.monotonic()
        reason = self._retry or f"closed {self._ws.close_code}"

        def start() -> Start:
            self._retry = None
            return dataclasses.replace(self.start, resume=self.backlog.resume(self.session))

        failures: list[str] = []
        ws, _, start_sent = await handshake_with_backoff(self._opener, start, failures,
                                                         deadline=began + self.options.keep_seconds)
        self._ws = ws
        if self._closing:
            return
        resume = start_sent.resume
        log.info("stream %s resumed at %.2f s, segment %d (attempt %d)", self.session, resume.time,
                 resume.segment, len(failures) + 1)
        self.resumptions.append(Resumption(resume, began, time.monotonic(), len(failures) + 1, reason,
                                           tuple(failures)))
        self._resender = asyncio.ensure_future(self._resend(ws))  # the reader reads the new connection meanwhile

    async def _resend(self, ws: Any) -> None:
        try:
            for data in self.backlog.pending():
                await ws.send(data)
            if self._stopped:
                await ws.send(encode(Stop()))
        except ConnectionClosed:
            return  # the reader sees the close and resumes again; send() keeps waiting
        if ws is self._ws:
            self._connected.set()


async def handshake_with_backoff(opener: connect, make_start: Callable[[], Start], failures: list[str],
                                 deadline: float | None = None) -> tuple[Any, Any, Start]:
    """Connect and get `ready`, retrying with backoff while servers are full, failing or unreachable: until
    time.monotonic() `deadline` (no attempt starts after it), or without one `ResumeOptions.attempts` times.
    Appends why each failed attempt failed to `failures`; returns the connection, its `ready`, the start sent."""
    options = resume_options(opener)
    began, delay = time.monotonic(), 0.0
    while True:
        if delay:
            wait = random.uniform(delay / 2, delay)
            if deadline is not None:
                wait = min(wait, max(0.0, deadline - time.monotonic()))
            await asyncio.sleep(wait)
        delay = min(options.max_backoff, max(delay * 2, options.backoff))
        start = make_start()
        try:
            ws, ready = await opener._handshake(start)
            return ws, ready, start
        except ServerError as exc:
            if exc.code not in RETRYABLE_ERRORS:
                raise
            failures.append(exc.code)
        except (ConnectError, StreamClosedError) as exc:
            status = getattr(exc, "status", None)
            if status in FATAL_STATUSES:
                raise
            failures.append(f"HTTP {status}" if status else str(exc))
        out_of_time = time.monotonic() >= deadline if deadline is not None else len(failures) >= options.attempts
        if out_of_time:
            raise ConnectError(f"no server took the stream in {len(failures)} attempts over "
                               f"{time.monotonic() - began:.0f} s: {failures[-1]}")


async def open_resumable(opener: connect) -> ResumableStream:
    """The first connection of a resumable stream, retried like a resume when a server is full or gone."""
    ws, ready, _ = await handshake_with_backoff(opener, lambda: opener.start, [])
    return ResumableStream(opener, ws, ready)
