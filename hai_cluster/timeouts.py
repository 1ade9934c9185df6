"""`wait_for` without the lost cancellation of Python 3.11's asyncio.wait_for.

In 3.11, asyncio.wait_for runs its awaitable as a task of its own. When the caller is cancelled
at the moment that inner task finishes (a shutdown that cancels a loop just as the event it
waits on is set, or as data arrives), wait_for returns the result and the cancellation is gone:
the loop goes round again, and whoever awaits it to stop (daemon shutdown, a connection's close)
waits forever. A CI run caught the controller that way, still scheduling a minute after SIGTERM.
3.12's wait_for is this one: asyncio.timeout, which cancels the calling task itself and tells
its own cancellation from anyone else's.
"""
from __future__ import annotations

import asyncio
from typing import Awaitable, TypeVar

T = TypeVar("T")


async def wait_for(aw: Awaitable[T], timeout: float | None) -> T:
    """The result of `aw`, or TimeoutError (= asyncio.TimeoutError) after `timeout` seconds
    (None: no limit), when `aw` is cancelled."""
    async with asyncio.timeout(timeout):
        return await aw
