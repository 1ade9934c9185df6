"""Group commit: store writes of one kind that arrive while the previous ones are being written
share one transaction, and so one synchronous commit (an fsync on SQLite with synchronous=FULL).

Under a burst (hundreds of trivial jobs starting and ending), the controller's store thread spent
most of its time in commits: a job is a submission, a start, a "running" and an end, each its own
commit. A lone call is written at once, as before; only calls that would otherwise queue behind
the store thread are folded together. Each caller still gets its own result, after the commit.
"""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any


class GroupWriter:
    """`await writer(item)`: write_many([item, ...]) runs on the store (through `db`) with every
    item queued meanwhile, in order, and returns one result per item (or None: None for each)."""

    def __init__(self, db: Callable[..., Awaitable[Any]], write_many: Callable[[list], list]) -> None:
        self._db = db
        self._write_many = write_many
        self._queue: list[tuple[Any, asyncio.Future]] = []
        self._batch: list[tuple[Any, asyncio.Future]] = []  # on the store now
        self._task: asyncio.Task | None = None  # the one writing, while there is one

    async def __call__(self, item: Any) -> Any:
        future = asyncio.get_running_loop().create_future()
        self._queue.append((item, future))
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._write())
            self._task.add_done_callback(self._finished)
        return await future

    async def _write(self) -> None:
        try:
            while self._queue:
                self._batch, self._queue = self._queue, []
                try:
                    results = await self._db(self._write_many, [item for item, _ in self._batch])
                except Exception as exc:  # the store is down: every caller of this batch hears it
                    for _, future in self._batch:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                if results is None:
                    results = [None] * len(self._batch)
                for (_, future), result in zip(self._batch, results):
                    if not future.done():
                        future.set_result(result)
            self._batch = []
        finally:
            self._task = None  # at once: a call right after this must start a new writer

    def _finished(self, task: asyncio.Task) -> None:
        if task.cancelled():  # the controller stops: no one waits for writes that will not happen
            for _, future in [*self._batch, *self._queue]:
                future.cancel()
            self._batch, self._queue = [], []
            if self._task is task:  # cancelled before it ever ran
                self._task = None
