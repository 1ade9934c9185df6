"""What a user's and an account's interactive jobs hold (the [interactive] limits): their count
and GPUs, over the jobs not ended (pending and running alike)."""
from __future__ import annotations

from sqlalchemy import Engine, func, select

from ..core.states import FINAL_STATES, JobState
from .schema import jobs

# The states a job is in until it ends, spelled out: an IN list reads the state indexes
# (ix_jobs_user_state, ix_jobs_state), where NOT IN (the final ones) scanned every job ever.
_NOT_ENDED = jobs.c.state.in_([s.value for s in JobState if s not in FINAL_STATES])
_HELD = select(func.count(), func.coalesce(func.sum(jobs.c.nodes * jobs.c.gpus_per_node), 0))


def live_allocations(engine: Engine, submitted_before: float) -> list[int]:
    """The interactive jobs not ended that were submitted before the time given."""
    with engine.connect() as c:
        return [r.id for r in c.execute(select(jobs.c.id).where(
            jobs.c.interactive.is_(True), _NOT_ENDED, jobs.c.submit_time < submitted_before))]


def held(engine: Engine, *, user: str, account: str) -> tuple[tuple[int, int], tuple[int, int]]:
    """((jobs, GPUs) of the user's interactive jobs, (jobs, GPUs) of the account's)."""
    with engine.connect() as c:
        mine = c.execute(_HELD.where(jobs.c.interactive.is_(True), _NOT_ENDED, jobs.c.user == user)).one()
        theirs = c.execute(_HELD.where(jobs.c.interactive.is_(True), _NOT_ENDED, jobs.c.account == account)).one()
    return (int(mine[0]), int(mine[1])), (int(theirs[0]), int(theirs[1]))
