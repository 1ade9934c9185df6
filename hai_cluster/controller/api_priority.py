"""sprio's request: the pending jobs' priority factors under the running policy
(scheduling/priority.py), from the snapshot a scheduling pass would see now."""
from __future__ import annotations

import time
from dataclasses import asdict, replace

from ..scheduling.priority import priorities as compute, weights
from .access import Caller
from .apicontext import ApiContext
from .requests import filter_list, int_list, task_list

# The order is computed over every pending job (a whole snapshot read, like a pass's), one request
# at a time; a listing's later pages (`after`) reuse the first page's for this long, so that the
# pages of one sprio agree with each other (a first page is always fresh: a job just submitted is
# listed, as Slurm's sprio lists it).
REUSE_SECONDS = 30.0


async def priorities(ctx: ApiContext, body, caller: Caller):
    """A page (by job id) of the listed pending jobs with their factors; `ids`, `tasks`, `users`
    and `partitions` filter them (a job in several partitions is kept if one of them is asked)."""
    ids = int_list(body, "ids")
    tasks = task_list(body)
    users = filter_list(body, "users")
    partitions = filter_list(body, "partitions")
    after, limit = ctx.page(body)
    now, rows = await _current(ctx, fresh=after is None)
    missing = []
    if tasks:  # 12_4: each array task is a job of its own; sprio refuses one that is not
        found = await ctx.ctl.db(ctx.repo.jobs, tasks=tasks, columns=["id", "array_job_id", "array_task_id"])
        ids = (ids or []) + [r["id"] for r in found]
        known = {(r["array_job_id"], r["array_task_id"]) for r in found}
        missing = [list(t) for t in tasks if tuple(t) not in known]
    wanted_ids = set(ids) if ids is not None or tasks is not None else None
    wanted_users = set(users) if users is not None else None
    wanted_parts = set(partitions) if partitions is not None else None
    picked = [r for r in rows
              if (wanted_ids is None or r["job_id"] in wanted_ids)
              and (wanted_users is None or r["user"] in wanted_users)
              and (wanted_parts is None or wanted_parts.intersection(r["partitions"]))
              and (after is None or r["job_id"] > after)]
    more = len(picked) > limit
    page = picked[:limit]
    cfg = ctx.ctl.cfg
    return {"now": now, "policy": cfg.scheduler.policy,
            "weights": weights(cfg.scheduler.policy, cfg.fairshare.enabled),
            "jobs": page, "more": more, "next": page[-1]["job_id"] if more else None, "missing_tasks": missing}


async def _current(ctx: ApiContext, *, fresh: bool) -> tuple[float, list[dict]]:
    """(when, every listed job's row in job id order): computed now, or (not `fresh`) the last
    computation if it is recent."""
    async with ctx.priority_lock:
        cached = ctx.priority_cache
        if not fresh and cached is not None and time.monotonic() - cached[0] < REUSE_SECONDS:
            return cached[1], cached[2]
        now = time.time()
        cfg = ctx.ctl.cfg

        def load() -> list[dict]:  # on the store thread: the snapshot, its fair-share factors, the order
            snapshot = ctx.ctl.tenancy.extend(ctx.repo.engine, ctx.repo.load_snapshot(now))
            snapshot = replace(snapshot, sizes=ctx.ctl.sizes.model)  # what the policy learned, as a pass has it
            out = [asdict(p) for p in compute(snapshot, cfg.scheduler.policy, cfg.scheduler.mlfq)]
            out.sort(key=lambda r: r["job_id"])
            return out
        rows = await ctx.ctl.db(load)
        ctx.priority_cache = (time.monotonic(), now, rows)
        return now, rows
