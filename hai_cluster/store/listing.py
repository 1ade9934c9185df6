"""Job listings whose cost is that of the page, not of the store's history.

A listing is its filters, in id order, a page at a time. Filtered by users, names or
partitions, it was one query that the planner answered by walking or sorting every job that
matched one filter (a user's whole history for each page, every COMPLETED job for `-t CD -u x`:
0.3-1 s at 2,000,000 jobs, ninth audit). Here such a listing is a merge, in id order, of one
walk per (value, state) pair down an index of (that column, state, id).

Each walk reads a window of its index at a time (ids up to the window's last), and only the
rows of the window that pass the other filters come back. A listing examines at most a budget
of rows (EXAMINED_PER_ROW per row asked for) beyond the first window of each walk: when that is
spent before the page is full, the page ends short, with the id every walk has read up to as
where the next page starts. Otherwise filters that matched nothing made every walk read its
whole history (tenth audit: 64 users and a name nobody uses cost 2.65 s, and a flood of them
held another user's listing 41 s). At most MAX_FILTER_VALUES users, names or partitions are
walked in one listing."""
from __future__ import annotations

import heapq
from bisect import bisect_right
from collections import deque
from dataclasses import dataclass
from typing import Sequence

from sqlalchemy import ColumnElement, Select, func, literal, select, union

from ..core.states import JobState
from .schema import jobs

MAX_FILTER_VALUES = 64
ALL_STATES = tuple(s.value for s in JobState)
EXAMINED_PER_ROW = 4  # rows a listing may examine per row it may answer with
MIN_WINDOW = 16


class TooManyValues(ValueError):
    pass


@dataclass(frozen=True)
class Page:
    """A listing's rows, and where the next page starts when the budget ended this one short
    (`resume_after`: every row up to that id was examined; None: the rows are all there is)."""
    rows: list
    resume_after: int | None = None


@dataclass(frozen=True)
class NamedIds:
    """A walk over jobs named by id (sorted): read a window of the ids themselves, one seek each,
    instead of an index."""
    ids: tuple[int, ...]


def leading(users, names, partitions):
    """The filter to walk by, the most selective given (users, then names, then partitions), and
    its values without repeats; (None, None) when there is none. The others stay plain conditions."""
    for column, values in ((jobs.c.user, users), (jobs.c.name, names), (jobs.c.partition, partitions)):
        if values:
            if len(values := list(dict.fromkeys(values))) > MAX_FILTER_VALUES:
                raise TooManyValues(f"at most {MAX_FILTER_VALUES} {column.name}s in one listing, got {len(values)}")
            return column, values
    return None, None


def walks_of(c, column, values: Sequence[str], states: Sequence[str] | None) -> list[tuple[ColumnElement, ...]]:
    """The conditions of each (value, state) walk of a listing led by `column`: only the pairs
    some job holds, so that a listing of names nobody uses is no walk at all (eleventh audit:
    64 names x 12 states were 768 walks, two queries each, 0.33 s for nothing)."""
    wanted = set(states) if states else set(ALL_STATES)
    return [(column == v, jobs.c.state == s) for v in values for s in states_held(c, column, v) if s in wanted]


def states_held(c, column, value: str) -> list[str]:
    """The states of jobs with `column` = value, in order: a loose index scan down the index of
    (column, state, id), one seek per state held (a recursive query, on SQLite and PostgreSQL)."""
    st = jobs.c.state
    seed = select(func.min(st).label("s")).where(column == value).cte("held", recursive=True)
    step = select(select(func.min(st)).where(column == value, st > seed.c.s).scalar_subquery()).where(seed.c.s.is_not(None))
    held = seed.union_all(step)
    return [s for s in c.execute(select(held.c.s)).scalars() if s is not None]


def merged_page(c, q: Select, walks: Sequence[tuple[ColumnElement, ...] | NamedIds], after_id: int | None,
                limit: int) -> Page:
    """The rows of `q` (its other filters set, no order, no limit) that one of `walks` (each
    conditions an index answers in id order, () the primary key, or NamedIds) holds, ids above
    `after_id`, in id order, at most `limit`, examining about EXAMINED_PER_ROW x limit rows at most."""
    budget = EXAMINED_PER_ROW * limit
    start = after_id if after_id is not None else -1
    window = [MIN_WINDOW] * len(walks)
    reached: list[int | None] = [start] * len(walks)  # None: the walk has read all it holds
    buffers = [deque() for _ in walks]

    def pull(i: int) -> None:
        nonlocal budget
        conds, after, w = walks[i], reached[i], window[i]
        if isinstance(conds, NamedIds):
            first = bisect_right(conds.ids, after)
            chunk = conds.ids[first:first + w]
            hi = chunk[-1] if first + w < len(conds.ids) else None
            buffers[i].extend(c.execute(q.where(jobs.c.id.in_(chunk)).order_by(jobs.c.id)).all() if chunk else ())
        else:
            # The window's last id, read off the index alone; the rows come only for those that match.
            hi = c.execute(select(jobs.c.id).where(*conds, jobs.c.id > after).order_by(jobs.c.id)
                           .offset(w - 1).limit(1)).scalar()
            bound = [] if hi is None else [jobs.c.id <= hi]
            buffers[i].extend(c.execute(q.where(*conds, jobs.c.id > after, *bound).order_by(jobs.c.id)).all())
        reached[i], budget = hi, budget - w  # a walk's last window counts whole: it is at most its size
        window[i] = min(2 * w, max(MIN_WINDOW, budget))  # a walk that keeps matching reads further

    # (next id, 0: a row in the buffer | 1: the walk must read on, walk): every walk reads one
    # window whatever the budget, so a short page still moves past `after_id`.
    for i in range(len(walks)):
        pull(i)
    heap = [h for i in range(len(walks)) if (h := _head(buffers[i], reached[i], i)) is not None]
    heapq.heapify(heap)
    out: list = []
    while heap and len(out) < limit:
        key, must_read, i = heapq.heappop(heap)
        if must_read:
            if budget <= 0:  # every row below `key` is examined, in `out` or filtered away
                return Page(out, key - 1)
            pull(i)
        else:
            out.append(buffers[i].popleft())
        if (head := _head(buffers[i], reached[i], i)) is not None:
            heapq.heappush(heap, head)
    return Page(out)


def _head(buf: deque, reached: int | None, i: int):
    if buf:
        return buf[0].id, 0, i
    return None if reached is None else (reached + 1, 1, i)


def not_ended_ids(since: float, after: int, bound: int, c) -> Select | None:
    """The ids above `after` of jobs not ended before `since`, as a query over ix_jobs_end_time,
    when at most `bound` jobs are open or ended since then (what `hacct` asks most: jobs since
    midnight); None when more are. A job open for weeks made the walk start at its id and read
    every job since (tenth audit: 0.3-0.5 s a request)."""
    conds = (jobs.c.end_time.is_(None), jobs.c.end_time >= since)
    counted = sum(c.execute(select(func.count()).select_from(
        select(literal(1)).where(cond).limit(bound + 1).subquery())).scalar() for cond in conds)
    if counted > bound:
        return None
    return union(*(select(jobs.c.id).where(cond, jobs.c.id > after) for cond in conds))


def first_not_ended_before(c, since: float) -> int | None:
    """The lowest id of a job not ended before `since`, read off ix_jobs_end_time. `id + 0`: min(id)
    would walk the primary key until a row matches, every job when none does (eighth audit:
    hacct -S now cost 150 ms at 1,000,000 jobs; with this, 1 ms)."""
    lows = [c.execute(select(func.min(jobs.c.id + 0)).where(cond)).scalar()
            for cond in (jobs.c.end_time.is_(None), jobs.c.end_time >= since)]
    return min((x for x in lows if x is not None), default=None)
