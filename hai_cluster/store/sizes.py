"""What the scheduler learned from the jobs that ended (core.sizemodel), in the store: the model's
wire form and the last ended job folded into it, (end time, job id). The model is a fold over the
ended jobs in that order, so the store's accounting is its truth: a controller folds in what
ended after the saved point when it starts, and a lost state is rebuilt from the jobs."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, and_, delete, insert, or_, select

from ..core.sizemodel import FinishedJob
from ..core.states import FINAL_STATES
from .schema import jobs, scheduler_state

NAME = "sizes"
FINAL = [s.value for s in FINAL_STATES]


@dataclass(frozen=True)
class Saved:
    state: dict[str, Any]
    through: tuple[float, int]  # (end time, job id) of the last ended job folded in


@dataclass(frozen=True)
class Ended:
    fact: FinishedJob
    at: tuple[float, int]  # (end time, job id): the fold's order


def load(engine: Engine) -> Saved | None:
    with engine.connect() as c:
        row = c.execute(select(scheduler_state).where(scheduler_state.c.name == NAME)).first()
    if row is None or not isinstance(row.state, dict):
        return None
    return Saved(row.state, (row.through_end, row.through_id))


def save(engine: Engine, state: dict[str, Any], through: tuple[float, int], now: float) -> None:
    with engine.begin() as c:
        c.execute(delete(scheduler_state).where(scheduler_state.c.name == NAME))
        c.execute(insert(scheduler_state).values(name=NAME, state=state, through_end=through[0],
                                                 through_id=through[1], updated=now))


def ended_after(engine: Engine, after: tuple[float, int] | None, limit: int) -> list[Ended]:
    """The jobs that ended after `after` having run, oldest first, at most `limit`; with no
    `after` (a rebuild), the newest `limit` of them: the decay has forgotten the older ones."""
    ran = and_(jobs.c.state.in_(FINAL), jobs.c.end_time.is_not(None), jobs.c.attained_gpu_seconds > 0)
    q = select(jobs.c.id, jobs.c.end_time, jobs.c.attained_gpu_seconds, jobs.c.nodes, jobs.c.gpus_per_node,
               jobs.c.gpu_fraction, jobs.c.user, jobs.c.name).where(ran)
    newest_first = after is None
    if after is not None:
        end, job_id = after
        q = q.where(or_(jobs.c.end_time > end, and_(jobs.c.end_time == end, jobs.c.id > job_id)))
    q = (q.order_by(jobs.c.end_time.desc(), jobs.c.id.desc()) if newest_first
         else q.order_by(jobs.c.end_time, jobs.c.id)).limit(limit)
    with engine.connect() as c:
        rows = list(c.execute(q))
    if newest_first:
        rows.reverse()
    out = []
    for r in rows:
        gpus = r.gpu_fraction * r.nodes if r.gpu_fraction else r.nodes * r.gpus_per_node
        if gpus > 0:
            out.append(Ended(FinishedJob(gpus, r.attained_gpu_seconds / gpus, r.user, r.name), (r.end_time, r.id)))
    return out
