"""timeouts.wait_for: asyncio.wait_for's contract, without 3.11's lost cancellation."""
from __future__ import annotations

import asyncio

import pytest

from hai_cluster import timeouts


def test_a_cancel_that_comes_as_the_event_is_set_stops_the_loop():
    """A daemon's loop waits on an event with a timeout; shutdown cancels it just as the event
    is set (a lost node wakes the scheduler). The loop must end, not go round again: with 3.11's
    asyncio.wait_for it went on, and the controller never finished its shutdown."""
    async def scenario() -> bool:
        event = asyncio.Event()

        async def loop() -> None:
            while True:
                try:
                    await timeouts.wait_for(event.wait(), 10)
                except asyncio.TimeoutError:
                    pass
                event.clear()
        task = asyncio.create_task(loop())
        await asyncio.sleep(0)  # the loop waits on the event now
        event.set()
        task.cancel()
        done, _ = await asyncio.wait([task], timeout=5)
        return bool(done) and task.cancelled()
    assert asyncio.run(scenario())


def test_result_timeout_and_the_awaitable_cancelled():
    async def scenario():
        assert await timeouts.wait_for(asyncio.sleep(0, "r"), 1) == "r"
        assert await timeouts.wait_for(asyncio.sleep(0, "r"), None) == "r"
        fut = asyncio.get_running_loop().create_future()
        with pytest.raises(asyncio.TimeoutError):
            await timeouts.wait_for(fut, 0.01)
        assert fut.cancelled()
        with pytest.raises(TimeoutError):  # the same class since 3.11
            await timeouts.wait_for(asyncio.Event().wait(), 0.01)
    asyncio.run(scenario())
