"""The idle clocks of running jobs' runs (controller/reclaim.py): read once at a controller's
start, written when a clock starts, stops or warns (not at every sample)."""
from __future__ import annotations

from typing import Sequence

from sqlalchemy import Engine, and_, bindparam, select, update

from ..core.states import JobState
from ..scheduling.idle import IdleClock
from .schema import jobs, runs

Key = tuple[int, int]


def running_clocks(engine: Engine) -> dict[Key, IdleClock]:
    """The stored clocks of the current runs of jobs holding GPUs (those with one started)."""
    held = [s.value for s in JobState if s.holds_resources]
    with engine.connect() as c:
        rows = c.execute(select(runs.c.job_id, runs.c.attempt, runs.c.idle_since, runs.c.idle_warned)
                         .select_from(runs.join(jobs, and_(jobs.c.id == runs.c.job_id)))
                         .where(jobs.c.state.in_(held), runs.c.end_time.is_(None),
                                runs.c.idle_since.is_not(None)))
        return {(r.job_id, r.attempt): IdleClock(since=r.idle_since, warned=r.idle_warned) for r in rows}


def save_clocks(engine: Engine, clocks: Sequence[tuple[Key, IdleClock]]) -> None:
    """Write these runs' clocks (since and warned; a busy run's are NULL)."""
    if not clocks:
        return
    with engine.begin() as c:
        c.execute(update(runs).where(runs.c.job_id == bindparam("jid"), runs.c.attempt == bindparam("att"))
                  .values(idle_since=bindparam("v_since"), idle_warned=bindparam("v_warned")),
                  [{"jid": k[0], "att": k[1], "v_since": clk.since, "v_warned": clk.warned} for k, clk in clocks])
