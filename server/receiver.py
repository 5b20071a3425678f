"""One stream's receiving: the next client message; None once the server starts shutting down; ProtocolError
`idle_timeout` after `idle` seconds of waiting for one.

One idle timer per stream, armed by a wait and re-armed only when it fires during a later one, and a wake-up
that cancels the waiting receive: the server wakes every receiver in its `receiving` set when it shuts down.
The way before, a task and an `asyncio.wait` around every receive, cost the event loop 11-30 us a message,
about a sixth of its busy time at 256 streams (docs/history.md, "Capacity"). A receive
cancelled while it waits loses nothing: websockets (and the Wyoming reader) keep the message for the next.
"""
from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

from pipeline.errors import ProtocolError

IDLE, SHUTDOWN = "idle", "shutdown"  # why a waiting receive was woken
TIMER_SLACK = 1e-3  # seconds: the loop may run a timer up to its clock resolution early


class Receiver:
    def __init__(self, recv: Callable[[], Awaitable[Any]], idle: float, shutting_down: asyncio.Future[None],
                 receiving: set[Receiver]) -> None:
        """`receiving`: the server's set of receivers waiting now (each is in it only while it waits)."""
        self._recv = recv
        self.idle = idle
        self._shutting_down = shutting_down
        self._receiving = receiving
        self._waiting: asyncio.Task[Any] | None = None  # the task waiting for a message, while it waits
        self._since = 0.0  # loop time the current (or last) wait began
        self._woken: str | None = None
        self._timer: asyncio.TimerHandle | None = None

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def next(self) -> Any:
        if self._shutting_down.done():
            return None
        loop = asyncio.get_running_loop()
        self._waiting, self._since, self._woken = asyncio.current_task(), loop.time(), None
        if self._timer is None:
            self._timer = loop.call_at(self._since + self.idle, self._check_idle)
        self._receiving.add(self)
        try:
            return await self._recv()
        except asyncio.CancelledError:
            if self._woken is None:  # not ours: the connection itself is being cancelled
                raise
            uncancel = getattr(self._waiting, "uncancel", None)  # Python 3.11+: take back our one cancel
            if uncancel is not None and uncancel() > 0:  # and someone else's, if any, still goes through
                raise
            if self._woken == SHUTDOWN:
                return None
            raise ProtocolError(f"no message for {self.idle:g} s", code="idle_timeout") from None
        finally:
            self._waiting = None
            self._receiving.discard(self)

    def wake(self, why: str) -> None:
        """End the wait now (IDLE or SHUTDOWN); nothing when none is under way."""
        if self._waiting is not None and self._woken is None:
            self._woken = why
            self._waiting.cancel()

    def _check_idle(self) -> None:
        self._timer = None
        if self._waiting is None:  # the next wait arms it again
            return
        loop = asyncio.get_running_loop()
        due = self._since + self.idle
        if loop.time() + TIMER_SLACK >= due:
            self.wake(IDLE)
        else:  # a later wait than the one that armed it
            self._timer = loop.call_at(due, self._check_idle)
