"""Job listings whose cost is that of the page, not of the store's history.

A listing is its filters, in id order, a page at a time. Filtered by users, names or
partitions, it was one query that the planner answered by walking or sorting every job that
matched one filter (a user's whole history for each page, every COMPLETED job for `-t CD -u x`:
0.3-1 s at 2,000,000 jobs, ninth audit). Here such a listing is a merge, in id order, of one
walk per (value, state) pair down an index of (that column, state, id): each walk reads rows in
the page's order and stops when the page is full, so a page costs its rows plus a short read per
pair. At most MAX_FILTER_VALUES users, names or partitions are walked in one listing."""
from __future__ import annotations

import heapq
from collections import deque
from typing import Sequence

from sqlalchemy import Select, func, select

from ..core.states import JobState
from .schema import jobs

MAX_FILTER_VALUES = 64
ALL_STATES = tuple(s.value for s in JobState)


class TooManyValues(ValueError):
    pass


def leading(users, names, partitions):
    """The filter to walk by, the most selective given (users, then names, then partitions), and
    its values without repeats; (None, None) when there is none. The others stay plain conditions."""
    for column, values in ((jobs.c.user, users), (jobs.c.name, names), (jobs.c.partition, partitions)):
        if values:
            return column, list(dict.fromkeys(values))
    return None, None


def merged_page(c, q: Select, column, values: Sequence[str], states: Sequence[str] | None,
                after_id: int | None, limit: int | None) -> list:
    """The rows of `q` (its other filters set, no order, no limit) with column in `values` and
    state in `states` (None: any), ids above `after_id`, in id order, at most `limit`."""
    if len(values) > MAX_FILTER_VALUES:
        raise TooManyValues(f"at most {MAX_FILTER_VALUES} {column.name}s in one listing, got {len(values)}")
    walked_states = list(dict.fromkeys(states)) if states else ALL_STATES
    pairs = [(v, s) for v in values for s in walked_states]
    want = limit if limit is not None else 1 << 62
    batch = max(20, min(want, 10_000) // len(pairs) + 1)
    start = after_id if after_id is not None else -1

    def pull(value, state, after):
        return c.execute(q.where(column == value, jobs.c.state == state, jobs.c.id > after)
                         .order_by(jobs.c.id).limit(batch)).all()

    buffers: dict[int, tuple[deque, bool]] = {}
    heap: list[tuple[int, int]] = []
    for i, (value, state) in enumerate(pairs):
        rows = pull(value, state, start)
        buffers[i] = (deque(rows), len(rows) == batch)
        if rows:
            heap.append((rows[0].id, i))
    heapq.heapify(heap)
    out = []
    while heap and len(out) < want:
        _, i = heapq.heappop(heap)
        buf, more = buffers[i]
        row = buf.popleft()
        out.append(row)
        if not buf and more:
            rows = pull(*pairs[i], row.id)
            buf.extend(rows)
            buffers[i] = (buf, len(rows) == batch)
        if buf:
            heapq.heappush(heap, (buf[0].id, i))
    return out


def first_not_ended_before(c, since: float) -> int | None:
    """The lowest id of a job not ended before `since`, read off ix_jobs_end_time. `id + 0`: min(id)
    would walk the primary key until a row matches, every job when none does (eighth audit:
    hacct -S now cost 150 ms at 1,000,000 jobs; with this, 1 ms)."""
    lows = [c.execute(select(func.min(jobs.c.id + 0)).where(cond)).scalar()
            for cond in (jobs.c.end_time.is_(None), jobs.c.end_time >= since)]
    return min((x for x in lows if x is not None), default=None)
