"""Messages on their way to one client: finals and control messages in order, and at most one partial, the
newest (a slow client loses partials, never finals). One task per connection drains it (server/streaming.py)."""
from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass
from typing import Any

# Finals one session may have waiting for or in inference. Beyond it the connection stops reading audio
# (TCP backpressure) until one is sent, so the worker's finals queue is bounded by sessions x this.
MAX_FINALS_IN_FLIGHT = 4


@dataclass(frozen=True)
class Outgoing:
    message: Any  # what the adapter's _render turns into a text frame when it is sent
    arrived: float | None = None  # set for a segment's final (or its error): end-of-speech arrival time


class Outbox:
    """Messages on their way to one client, sent in order by one task; at most one partial waits.

    Bounded: a session has at most MAX_FINALS_IN_FLIGHT finals queued, and its connection reads no more
    client messages while the outbox is crowded (half its limit: a burst of messages that are each answered,
    a Wyoming describe, a Deepgram Finalize or a mistake, waits for the client to read the answers);
    `limit` turns a bug into an error instead of unbounded memory. A partial is any object with a `segment`
    number.
    """

    def __init__(self, limit: int = MAX_FINALS_IN_FLIGHT + 8) -> None:
        self._items: collections.deque[Outgoing] = collections.deque()
        self._partial: Any = None
        self._wake = asyncio.Event()
        self._taken = asyncio.Event()  # set when get() takes a message
        self._limit = limit
        self.closed = False  # no more puts; get() returns None once drained

    def put(self, item: Outgoing, last: bool = False) -> None:
        """Queue `item`; `last`: the error a closing connection ends with, queued even when full."""
        if len(self._items) >= self._limit and not last:
            raise RuntimeError(f"outbox over its bound of {self._limit} messages")
        self._items.append(item)
        self._wake.set()

    def crowded(self) -> bool:
        return len(self._items) >= self._limit // 2

    async def taken(self) -> None:
        """Return once get() takes a message."""
        self._taken.clear()
        await self._taken.wait()

    def put_partial(self, partial: Any) -> bool:
        """Queue a partial; returns True when it replaced an unsent one."""
        replaced = self._partial is not None
        self._partial = partial
        self._wake.set()
        return replaced

    def discard_partial(self, segment: int) -> bool:
        """Drop the waiting partial if it belongs to `segment` or earlier (its final is coming)."""
        if self._partial is not None and self._partial.segment <= segment:
            self._partial = None
            return True
        return False

    def close(self) -> None:
        self.closed = True
        self._wake.set()

    async def get(self) -> Outgoing | None:
        while True:
            if self._items:
                self._taken.set()
                return self._items.popleft()
            partial = None if self.closed else self._take_partial()
            if partial is not None:
                return Outgoing(partial)
            if self.closed:
                return None
            self._wake.clear()
            await self._wake.wait()

    def _take_partial(self) -> Any:
        """The waiting partial to send next (None if none), no longer waiting."""
        partial, self._partial = self._partial, None
        return partial
