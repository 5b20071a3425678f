"""server/receiver.py on a real event loop: the idle timeout counts from the start of each wait, shutdown
wakes a waiting receive with None, a cancel that is not its own goes through, and a woken task keeps no
cancellation behind (Python 3.11+'s uncancel). Over a real WebSocket: tests/server/test_errors.py
(idle_timeout) and tests/server/test_lifecycle.py (shutdown drains)."""
from __future__ import annotations

import asyncio
import sys

import pytest

from pipeline.errors import ProtocolError
from server.receiver import SHUTDOWN, Receiver


def make(idle: float) -> tuple[Receiver, asyncio.Queue, asyncio.Future, set]:
    queue: asyncio.Queue = asyncio.Queue()
    shutting_down = asyncio.get_running_loop().create_future()
    receiving: set = set()
    return Receiver(queue.get, idle, shutting_down, receiving), queue, shutting_down, receiving


async def test_messages_within_the_idle_time_keep_the_stream_and_silence_ends_it() -> None:
    receiver, queue, _, receiving = make(idle=0.3)
    loop = asyncio.get_running_loop()
    for i in range(6):  # 0.6 s in all, longer than the idle time, but never 0.3 s without a message
        loop.call_later(0.1, queue.put_nowait, i)
        assert await receiver.next() == i
    began = loop.time()
    with pytest.raises(ProtocolError) as raised:
        await receiver.next()
    assert raised.value.code == "idle_timeout" and "0.3 s" in str(raised.value)
    assert loop.time() - began >= 0.3 - 0.01
    assert not receiving  # in the set only while it waits
    receiver.close()


async def test_shutdown_wakes_a_waiting_receive_and_the_next_ones_return_none() -> None:
    receiver, queue, shutting_down, receiving = make(idle=60)
    waiting = asyncio.ensure_future(receiver.next())
    await asyncio.sleep(0.01)
    assert receiving == {receiver}
    shutting_down.set_result(None)
    for r in list(receiving):  # what Server.shutdown does
        r.wake(SHUTDOWN)
    assert await waiting is None
    queue.put_nowait("kept")  # nothing was taken from the source by the woken receive
    assert await receiver.next() is None and queue.qsize() == 1
    receiver.close()


async def test_a_cancel_that_is_not_its_own_goes_through() -> None:
    receiver, _, _, receiving = make(idle=60)
    waiting = asyncio.ensure_future(receiver.next())
    await asyncio.sleep(0.01)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert not receiving
    receiver.close()


@pytest.mark.skipif(sys.version_info < (3, 11), reason="asyncio.timeout and Task.uncancel are Python 3.11+")
async def test_a_task_woken_for_idleness_can_still_time_out_later() -> None:
    """The wake-up's cancel is taken back: a later asyncio.timeout in the same task (websockets' close
    uses one) still ends in TimeoutError, not in a stray CancelledError."""
    receiver, _, _, _ = make(idle=0.05)
    with pytest.raises(ProtocolError):
        await receiver.next()
    assert asyncio.current_task().cancelling() == 0
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await asyncio.sleep(1)
    receiver.close()


@pytest.mark.skipif(sys.version_info < (3, 11), reason="Task.cancelling and uncancel are Python 3.11+")
async def test_a_foreign_cancel_beside_the_wake_up_still_goes_through() -> None:
    receiver, _, _, receiving = make(idle=60)
    waiting = asyncio.ensure_future(receiver.next())
    await asyncio.sleep(0.01)
    receiver.wake(SHUTDOWN)
    waiting.cancel()  # the connection cancelled in the same turn: that cancel is not taken back
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert not receiving
    receiver.close()
