"""Listings kept until the store's next write: squeue and sacct are polled all day by tools, and a
10,000-job page costs tens of milliseconds of store reads each time (docs/BENCHMARKS.md).

A value is kept under its request's key (everything the reply is built from: the method and its
filters, page and fields; never the caller, which no listing depends on) with the store's write
generation when its read began (store/generation.py). It is served while the generation is the
same: no write has committed since, so a fresh read would return the same rows. A write that
commits while the read runs moves the generation past the value's, so the value is read again
next time. Values that depend on the clock (a running job's level) or on live telemetry are not
kept by their callers, only the rows under them.

Bounded: at most MAX_ROWS rows over all values (a listing is at most PAGE_ROWS), least recently
used first out; a request with a new key costs what it did without the cache."""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Awaitable, Callable, Hashable

from ..store.generation import WriteGeneration

MAX_ROWS = 40_000  # ~4 pages of 10,000 jobs: tens of MB at most


class ListingCache:
    def __init__(self, generation: WriteGeneration, max_rows: int = MAX_ROWS) -> None:
        self.generation = generation
        self.max_rows = max_rows
        self._values: OrderedDict[Hashable, tuple[int, int, Any]] = OrderedDict()  # key -> (generation, rows, value)
        self._rows = 0
        self._seen = generation.value  # the generation the values were checked at
        self.hits = self.misses = 0

    async def get(self, key: Hashable, read: Callable[[], Awaitable[tuple[Any, int]]]) -> Any:
        """The value under key, or read()'s (value, its row count), kept for the next caller."""
        now = self.generation.value
        if now != self._seen:  # a write committed: every value is stale, let them go at once
            self._values.clear()
            self._rows, self._seen = 0, now
        kept = self._values.get(key)
        if kept is not None and kept[0] == now:
            self._values.move_to_end(key)
            self.hits += 1
            return kept[2]
        self.misses += 1
        value, rows = await read()  # read after `now` was taken: a write during it makes it stale
        self._put(key, now, rows, value)
        return value

    def _put(self, key: Hashable, generation: int, rows: int, value: Any) -> None:
        old = self._values.pop(key, None)
        if old is not None:
            self._rows -= old[1]
        if rows > self.max_rows:
            return
        if generation != self.generation.value:
            return  # already stale
        self._values[key] = (generation, rows, value)
        self._rows += rows
        while self._rows > self.max_rows:
            _k, (_g, n, _v) = self._values.popitem(last=False)
            self._rows -= n
