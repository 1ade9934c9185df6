"""Store side of accounts: live limit overrides, job counts for submission limits, and the runs
fair share is computed from. Synchronous, on the controller's store thread like the repository."""
from __future__ import annotations

from typing import Any, Mapping

from sqlalchemy import Engine, func, insert, literal_column, or_, select, update

from ..core.states import ACTIVE_STATES, JobState
from .schema import jobs, limits, runs

LIMIT_FIELDS = ("shares", "max_gpus", "max_pending", "max_jobs")
OPEN = [JobState.PENDING.value] + [s.value for s in ACTIVE_STATES]
DEFAULT_ACCOUNT = "default"


def _account():
    # a literal, not a bound parameter: PostgreSQL must see the same expression in GROUP BY
    return func.coalesce(jobs.c.account, literal_column(f"'{DEFAULT_ACCOUNT}'"))


_ALL_LIMITS = select(limits)  # built once: read at every submission


def overrides(engine: Engine) -> dict[tuple[str, str], dict[str, Any]]:
    """(kind, name) -> the limits an admin set (a None value: the config's applies)."""
    with engine.connect() as c:
        return {(r.kind, r.name): {k: getattr(r, k) for k in LIMIT_FIELDS} for r in c.execute(_ALL_LIMITS)}


def set_override(engine: Engine, kind: str, name: str, values: Mapping[str, int], by: str, now: float) -> None:
    with engine.begin() as c:
        row = dict(values, updated_by=by, updated_at=now)
        res = c.execute(update(limits).where(limits.c.kind == kind, limits.c.name == name).values(**row))
        if res.rowcount == 0:
            c.execute(insert(limits).values(kind=kind, name=name, **row))


def job_counts(engine: Engine, user: str, account: str | None = None) -> dict[str, int]:
    """Pending and open (pending + running) jobs of the user, the spec bytes its pending jobs hold
    in the store, and (given `account`) the account's pending and open jobs. The user's come from
    the (user, state, spec_bytes) index alone; the account's read every open job, so they are
    counted only where an account limit asks for them."""
    with engine.connect() as c:
        def count(*where) -> tuple[int, int, int]:
            rows = {r[0]: r[1:] for r in c.execute(
                select(jobs.c.state, func.count(), func.sum(func.coalesce(jobs.c.spec_bytes, 0)))
                .where(jobs.c.state.in_(OPEN), *where).group_by(jobs.c.state))}
            pending, pending_bytes = rows.get(JobState.PENDING.value, (0, 0))
            return pending, sum(n for n, _ in rows.values()), int(pending_bytes or 0)
        up, ut, ub = count(jobs.c.user == user)
        ap, at, _ = count(_account() == account) if account is not None else (0, 0, 0)
    return {"user_pending": up, "user_jobs": ut, "user_pending_bytes": ub, "account_pending": ap,
            "account_jobs": at}


def _usage_of_runs(*first):
    """(first..., account, user, gpus, start, end) per run; a sharing run's gpus are the
    GPU-equivalents it is charged."""
    charged = func.coalesce(runs.c.gpu_charge, runs.c.gpus)
    return select(*first, _account(), jobs.c.user, charged, runs.c.start_time, runs.c.end_time).join(
        jobs, jobs.c.id == runs.c.job_id), charged


def usage_runs(engine: Engine, since: float) -> list[tuple[str, str, int, float, float | None]]:
    """Every run still running or ended after `since`, charged anything: the whole read that
    fair share once did each refresh, kept as the reference the tracker (runs_after) is tested
    against."""
    q, charged = _usage_of_runs()
    q = q.where(charged > 0, or_(runs.c.end_time.is_(None), runs.c.end_time >= since))
    with engine.connect() as c:
        return [tuple(r) for r in c.execute(q)]


def runs_after(engine: Engine, after_id: int, limit: int) -> tuple[list[tuple[int, tuple]], int, bool]:
    """Up to `limit` runs with ids above `after_id`, by id, read through the primary key: (id,
    (account, user, gpus, start, end)) for those charged anything, the last id read, and whether
    `limit` were read (more may follow)."""
    q, _charged = _usage_of_runs(runs.c.id)
    q = q.where(runs.c.id > after_id).order_by(runs.c.id).limit(limit)
    with engine.connect() as c:
        rows = c.execute(q).all()
    last = rows[-1][0] if rows else after_id
    return [(r[0], tuple(r[1:])) for r in rows if r[3] and r[3] > 0], last, len(rows) >= limit


def run_ends(engine: Engine, run_ids: list[int]) -> dict[int, float | None]:
    """The end time (None: still going) of each of these runs that exists, by primary key."""
    out: dict[int, float | None] = {}
    with engine.connect() as c:
        for i in range(0, len(run_ids), 500):
            out.update(c.execute(select(runs.c.id, runs.c.end_time).where(runs.c.id.in_(run_ids[i:i + 500]))).all())
    return out


def open_members(engine: Engine) -> list[tuple[str, str]]:
    """(account, user) pairs with open jobs: they appear in the share tree even before any usage."""
    with engine.connect() as c:
        return [tuple(r) for r in c.execute(select(_account(), jobs.c.user).where(jobs.c.state.in_(OPEN))
                                            .group_by(_account(), jobs.c.user))]


__all__ = ["overrides", "set_override", "job_counts", "usage_runs", "runs_after", "run_ends", "open_members"]
