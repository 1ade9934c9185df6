"""Job steps in the store (table run_steps): an srun's step is recorded when the controller lays
it out and ended when srun's agent reports its end; a run's end closes the steps still open.
Step ids are numbered per run from 0, from the store, so a controller restart goes on counting,
and a restarted controller rebuilds an open step's routing from its row."""
from __future__ import annotations

from typing import Sequence

from sqlalchemy import Engine, bindparam, func, select, text, update
from sqlalchemy.exc import IntegrityError

from ..core.states import JobState
from . import statements as st
from .schema import run_steps, runs

OPEN = text("run_steps.end_time IS NULL")  # as the partial index ix_run_steps_open says it
NEXT_STEP = select(func.coalesce(func.max(run_steps.c.step_id) + 1, 0)).where(run_steps.c.run_id == bindparam("p_run"))
STEP_INSERT = run_steps.insert()
CLOSE_OPEN = update(run_steps).where(run_steps.c.run_id == bindparam("p_run"), OPEN).values(
    end_time=bindparam("p_end"), state=JobState.CANCELLED.value)
NAME_LEN = 200  # run_steps.name
STEPS_SHOWN = 1000  # hacct: each run's newest steps, a job of 100,000 sruns makes no huge reply
ROWS_SHOWN = 50_000  # and at most these in one reply (a page of runs)
OPEN_SHOWN = 50_000  # hqueue -s: open steps in one reply
TRIES = 5  # two steps of one run created at once both read the same next id: one tries again


def close_open(c, run_id: int, end: float) -> None:
    """On the caller's transaction, as the run ends: its steps still open went with it."""
    c.execute(CLOSE_OPEN, {"p_run": run_id, "p_end": end})


def _row(r) -> dict:
    return dict(r._mapping)


class StepBook:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def begin(self, job_id: int, attempt: int, *, name: str, nodes: Sequence[str], counts: Sequence[int], cpus: int,
              origin: str,
              now: float) -> int | None:
        """A new step of the job's run `attempt`: its id (None: that run is not in the store)."""
        for _ in range(TRIES):
            try:
                with self.engine.begin() as c:
                    run_id = c.execute(st.RUN_ID_OF_ATTEMPT, {"p_job": job_id, "p_attempt": attempt}).scalar()
                    if run_id is None:
                        return None
                    step_id = c.execute(NEXT_STEP, {"p_run": run_id}).scalar()
                    c.execute(STEP_INSERT, dict(
                        run_id=run_id, step_id=step_id, name=name[:NAME_LEN], nodelist=",".join(nodes),
                        counts=",".join(map(str, counts)), ntasks=sum(counts), cpus=cpus, origin=origin,
                        start_time=now, state=JobState.RUNNING.value))
                    return step_id
            except IntegrityError:
                continue
        raise RuntimeError(f"job {job_id}: no step id after {TRIES} tries")

    def end(self, job_id: int, attempt: int, step_id: int, *, origin: str, state: str, exit_code: int | None,
            exit_signal: int | None, now: float) -> bool:
        """Record a step's end, reported by the agent of its srun's node; False: not an open step of there."""
        with self.engine.begin() as c:
            run_id = c.execute(st.RUN_ID_OF_ATTEMPT, {"p_job": job_id, "p_attempt": attempt}).scalar()
            if run_id is None:
                return False
            res = c.execute(update(run_steps).where(
                run_steps.c.run_id == run_id, run_steps.c.step_id == step_id, run_steps.c.origin == origin, OPEN)
                .values(end_time=now, state=state, exit_code=exit_code, exit_signal=exit_signal))
            return res.rowcount == 1

    def open_step(self, job_id: int, step_id: int) -> dict | None:
        """An open step of the job's live run: its run's attempt, srun's node, its nodes and counts."""
        q = (select(runs.c.attempt, run_steps.c.origin, run_steps.c.nodelist, run_steps.c.counts)
             .join(runs, runs.c.id == run_steps.c.run_id)
             .where(runs.c.job_id == job_id, runs.c.end_time.is_(None), run_steps.c.step_id == step_id, OPEN))
        with self.engine.connect() as c:
            row = c.execute(q).first()
        return None if row is None else _row(row)

    def of_runs(self, run_ids: Sequence[int]) -> list[dict]:
        """The steps of these runs, each run's newest STEPS_SHOWN, in step order (hacct)."""
        if not run_ids:
            return []
        inner = run_steps.alias("later")
        newest = select(func.max(inner.c.step_id)).where(inner.c.run_id == run_steps.c.run_id).scalar_subquery()
        q = (select(run_steps).where(run_steps.c.run_id.in_(list(run_ids)), run_steps.c.step_id > newest - STEPS_SHOWN)
             .order_by(run_steps.c.run_id, run_steps.c.step_id).limit(ROWS_SHOWN))
        with self.engine.connect() as c:
            return [_row(r) for r in c.execute(q)]

    def open_of(self, job_ids: Sequence[int]) -> list[dict]:
        """The open steps of these jobs' live runs, with their job's id (hqueue -s)."""
        if not job_ids:
            return []
        q = (select(run_steps, runs.c.job_id).join(runs, runs.c.id == run_steps.c.run_id)
             .where(runs.c.job_id.in_(list(job_ids)), runs.c.end_time.is_(None), OPEN)
             .order_by(runs.c.job_id, run_steps.c.step_id).limit(OPEN_SHOWN))
        with self.engine.connect() as c:
            return [_row(r) for r in c.execute(q)]
