"""What users read: job listings, one job, accounting, nodes, telemetry, history, accounts and shares."""
from __future__ import annotations

import time
from dataclasses import asdict

from ..core.states import JobState, parse_state
from ..store import reservations as reservation_store
from ..store.events import read_events
from ..store.listing import TooManyValues
from ..transport.rpc import RequestError
from .access import Caller, may_act_on
from .apicontext import (DERIVED_FIELDS, LISTING_FIELDS, MAX_EVENTS, NOT_FINAL, PUBLIC_NEEDS, SHARE_NEEDS,
                         TELEMETRY_FIELDS, TELEMETRY_NEEDS, ApiContext)
from .requests import expect, filter_list, int_list, str_list, task_list
from .telemetry_view import job_telemetry, nodes_telemetry

MAX_NODE_NAME = 64  # nodes.name
CLOCK_FIELDS = frozenset({"attained_now", "level"}) | TELEMETRY_FIELDS  # not the store's alone


async def _listed(ctx: ApiContext, **filters):
    """A page of the store's listing; a listing naming more arrays than one walks is refused."""
    try:
        return await ctx.ctl.db(ctx.repo.jobs_page, **filters)
    except TooManyValues as exc:
        raise RequestError(str(exc)) from None


async def ping(ctx: ApiContext, body, caller: Caller):
    return {"time": time.time(), "user": caller.user, "uid": caller.uid, "admin": caller.admin,
            "role": caller.role, "cluster": ctx.ctl.cfg.cluster_name}


async def jobs(ctx: ApiContext, body, caller: Caller):
    states = str_list(body, "states")
    try:
        states = [parse_state(s).value for s in states] if states else None
    except ValueError as exc:
        raise RequestError(str(exc)) from None
    if expect(body, "all", bool, default=False):
        states = states or None
    else:
        states = states or NOT_FINAL
    fields = str_list(body, "fields")  # only these keys per job (hqueue asks for its columns)
    columns, telemetry = None, True
    if fields is not None:
        if unknown := sorted(set(fields) - LISTING_FIELDS):
            raise RequestError(f"unknown job field(s): {', '.join(unknown)}")
        need = (set(fields) - DERIVED_FIELDS) | set(PUBLIC_NEEDS) | set(SHARE_NEEDS)  # a share's charge
        telemetry = bool(TELEMETRY_FIELDS & set(fields))
        if telemetry:
            need.update(TELEMETRY_NEEDS)
        if "gpu_share_mb" in fields:
            need.update(SHARE_NEEDS)
        columns = sorted(need)
    after, limit = ctx.page(body)
    filters = dict(ids=int_list(body, "ids"), states=states, users=filter_list(body, "users"),
                   names=filter_list(body, "names"), partitions=filter_list(body, "partitions"), columns=columns,
                   tasks=task_list(body), after_id=after, limit=limit + 1)
    key = ("jobs", _frozen(filters), None if fields is None else tuple(fields))
    if fields is not None and not CLOCK_FIELDS & set(fields):
        # What squeue asks: rows that only a write changes, kept whole until the next one
        async def read_listed():
            page = await _listed(ctx, **filters)
            rows, more = _page_and_next(page, limit)
            return ([{k: p.get(k) for k in fields} for p in map(ctx.public, rows)], more), len(rows)
        listed, more = await ctx.listings.get(key, read_listed)
        return {"now": time.time(), "jobs": listed, **more}

    async def read_rows():
        rows_more = _page_and_next(await _listed(ctx, **filters), limit)
        return rows_more, len(rows_more[0])
    rows, more = await ctx.listings.get(key, read_rows)  # the store's rows; the clock's fields fresh
    listed = map(ctx.public, rows)
    if telemetry:
        listed = map(ctx.with_telemetry, listed)
    if fields is None:
        return {"now": time.time(), "jobs": list(listed), **more}
    return {"now": time.time(), "jobs": [{k: p.get(k) for k in fields} for p in listed], **more}


def _frozen(value):
    """A request's filters as a cache key (lists as tuples)."""
    if isinstance(value, dict):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    return value


def _page_and_next(page, limit: int) -> tuple[list[dict], dict]:
    """A page's first `limit` rows (it was asked one more, to tell whether more follow) and its
    `more` and `next`: after its last row, or where the store stopped examining rows."""
    if len(page.rows) > limit:
        return page.rows[:limit], {"more": True, "next": page.rows[limit - 1]["id"]}
    if page.resume_after is not None:
        return page.rows, {"more": True, "next": page.resume_after}
    return page.rows, {"more": False, "next": None}


async def telemetry(ctx: ApiContext, body, caller: Caller):
    """hstat and hinfo --gpus: each node's GPUs with their latest reading and the job holding
    them; with job_id, that job's runs (rollups) and its recent history."""
    job_id = expect(body, "job_id", int)
    if job_id is not None:
        job = await ctx.ctl.db(ctx.repo.job, job_id)
        if job is None:
            raise RequestError(f"Invalid job id specified: {job_id}")
        runs = await ctx.ctl.db(ctx.repo.runs, job_ids=[job_id])
        return {"now": time.time(), **job_telemetry(ctx.ctl.telemetry, ctx.with_telemetry(ctx.public(job)), runs)}
    rows = await ctx.ctl.db(ctx.repo.jobs, states=[s.value for s in JobState if s.holds_resources])
    node_rows, views, ranks = (await ctx.ctl.db(ctx.repo.nodes), await ctx.ctl.db(ctx.repo.load_nodes),
                               await ctx.ctl.db(ctx.repo.live_ranks))
    return {"now": time.time(), **nodes_telemetry(ctx.ctl.telemetry, node_rows, views, ranks,
                                                  [ctx.with_telemetry(ctx.public(j)) for j in rows],
                                                  {n: link.connected for n, link in ctx.ctl.links.items()})}


async def show_job(ctx: ApiContext, body, caller: Caller):
    job_id = await ctx.task_job_id(body)
    job = await ctx.ctl.db(ctx.repo.job, job_id)
    if job is None:
        raise RequestError(f"Invalid job id specified: {job_id}")
    out = ctx.with_telemetry(ctx.public(job))  # IdleFor= (the idle clock) with its live run's telemetry
    # A job's arguments may hold secrets (--api-key=...), as its environment and script may:
    # its owner and admins see them, nobody else.
    hidden = ("environment", "script") if may_act_on(caller, job["user"], operators=False) else (
        "environment", "script", "script_args")
    out["spec"] = {k: v for k, v in job["spec"].items() if k not in hidden}
    out["runs"] = await ctx.ctl.db(ctx.repo.runs, job_ids=[job_id])
    # the steps of its newest run (those of earlier runs are in hacct)
    out["steps"] = await ctx.ctl.db(ctx.repo.steps.of_runs, [out["runs"][-1]["id"]]) if out["runs"] else []
    if job["state"] == JobState.PENDING.value and not job["hold"]:
        out["waiting"] = await ctx.ctl.db(ctx.repo.why_waiting, job_id)
    return {"now": time.time(), "job": out}


async def nodes(ctx: ApiContext, body, caller: Caller):
    now = time.time()
    rows = await ctx.ctl.db(ctx.repo.nodes)
    reserved: dict[str, str] = {}  # sinfo's maint / resv: the nodes of reservations open now
    for r in await ctx.ctl.db(reservation_store.listing, ctx.repo.engine, now):
        if r.active(now):
            for name in r.nodes:
                if reserved.get(name) != "MAINT":
                    reserved[name] = "MAINT" if "MAINT" in r.flags else "RESV"
    for row in rows:
        row["reserved"] = reserved.get(row["name"])
    return {"now": now, "nodes": rows,
            "links": {name: link.last_error for name, link in ctx.ctl.links.items()},
            "partitions": [{"name": p, "default": p == ctx.ctl.cfg.default_partition,
                            "max_time": ctx.ctl.cfg.partition(p).max_time} for p in ctx.ctl.cfg.partitions]}


async def acct(ctx: ApiContext, body, caller: Caller):
    ids = int_list(body, "ids")
    users = filter_list(body, "users")
    tasks = task_list(body)
    since = expect(body, "since", (int, float))  # jobs that had not ended before then (hacct -S)
    fields = str_list(body, "fields")  # only these keys per job (sacct asks for what it prints)
    columns = None
    if fields is not None:
        if unknown := sorted(set(fields) - LISTING_FIELDS):
            raise RequestError(f"unknown job field(s): {', '.join(unknown)}")
        columns = sorted((set(fields) - DERIVED_FIELDS) | set(PUBLIC_NEEDS) | set(SHARE_NEEDS))
    after, limit = ctx.page(body)
    kept = fields is not None and not CLOCK_FIELDS & set(fields)  # the jobs' keys too, not only the rows

    async def read():  # kept until the store's next write (listing_cache.py)
        page = await _listed(ctx, ids=ids, users=users, tasks=tasks, after_id=after, limit=limit + 1,
                             ended_since=since, columns=columns)
        job_rows, more = _page_and_next(page, limit)
        run_rows = await ctx.ctl.db(ctx.repo.runs, of_jobs=[j["id"] for j in job_rows]) if job_rows else []
        step_rows = await ctx.ctl.db(ctx.repo.steps.of_runs, [r["id"] for r in run_rows]) if run_rows else []
        if kept:
            job_rows = [{k: p.get(k) for k in fields} for p in map(ctx.public, job_rows)]
        return (job_rows, more, run_rows, step_rows), len(job_rows) + len(run_rows) + len(step_rows)
    job_rows, more, run_rows, step_rows = await ctx.listings.get(
        ("acct", _frozen((ids, users, tasks, since, after, limit, fields))), read)
    if not kept:
        job_rows = [ctx.public(j) for j in job_rows]
        if fields is not None:
            job_rows = [{k: p.get(k) for k in fields} for p in job_rows]
    return {"now": time.time(), "runs": run_rows, "steps": step_rows, "jobs": job_rows, **more}


STEP_JOB_KEYS = ("id", "array_job_id", "array_task_id", "name", "user", "partition", "start_time", "nodelist",
                 "interactive")
LIVE = [s.value for s in JobState if s.holds_resources]


async def steps(ctx: ApiContext, body, caller: Caller):
    """hqueue -s: a page of the jobs holding nodes, each with its open steps (its batch step is
    the job's run itself: its start and first node)."""
    after, limit = ctx.page(body)
    page = await _listed(ctx, ids=int_list(body, "ids"), states=LIVE, users=filter_list(body, "users"),
                         partitions=filter_list(body, "partitions"), tasks=task_list(body),
                         after_id=after, limit=limit + 1)
    job_rows, more = _page_and_next(page, limit)
    step_rows = await ctx.ctl.db(ctx.repo.steps.open_of, [j["id"] for j in job_rows]) if job_rows else []
    return {"now": time.time(), "jobs": [{k: j.get(k) for k in STEP_JOB_KEYS} for j in job_rows],
            "steps": step_rows, **more}


async def events(ctx: ApiContext, body, caller: Caller):
    """A job's history (its owner and admins), or a node's (anyone, as hinfo shows nodes)."""
    job_id = expect(body, "job_id", int)
    node = expect(body, "node", str)
    limit = expect(body, "limit", int)
    if (job_id is None) == (node is None):
        raise RequestError("give a job id or a node name (one of them)")
    if limit is not None and limit <= 0:
        raise RequestError("limit must be positive")
    if node is not None and len(node) > MAX_NODE_NAME:
        raise RequestError(f"Node name too long ({len(node)} characters; at most {MAX_NODE_NAME})")
    limit = min(limit or MAX_EVENTS, MAX_EVENTS)  # the newest; a reply is built on the event loop
    if job_id is not None:
        job = await ctx.own_job(body, caller, "the history")  # the job may be gone from the table: say so
        job_id = job.id
    await ctx.ctl.flush_events()
    rows = await ctx.ctl.db(read_events, ctx.repo.engine, job_id=job_id, node=node, limit=limit)
    if node is not None and not rows and node not in {n["name"] for n in await ctx.ctl.db(ctx.repo.nodes)}:
        raise RequestError(f"Node {node} not found")  # a removed node's history is still shown
    return {"now": time.time(), "events": rows}


async def accounts(ctx: ApiContext, body, caller: Caller):
    return {"accounts": await ctx.ctl.db(ctx.ctl.tenancy.listing, ctx.repo.engine),
            "mine": ctx.ctl.tenancy.accounts_of(caller)}


async def qos(ctx: ApiContext, body, caller: Caller):
    """hcontrol show qos: the [[qos]] tables (sacctmgr show qos), the default marked."""
    return {"default": ctx.ctl.cfg.default_qos, "qos": [asdict(q) for q in ctx.ctl.cfg.qos]}


async def shares(ctx: ApiContext, body, caller: Caller):
    """hshare: the fair-share tree, like sshare -a."""
    rows = await ctx.ctl.db(ctx.ctl.tenancy.current_rows, ctx.repo.engine, time.time())
    return {"half_life": ctx.ctl.cfg.fairshare.half_life, "enabled": ctx.ctl.cfg.fairshare.enabled,
            "rows": [vars(r) for r in rows]}


MAX_EXPLAINED = 100  # jobs one `hcontrol show scheduler` may ask about


async def scheduler(ctx: ApiContext, body, caller: Caller):
    """hcontrol show scheduler [JOB...]: what the MLFQ learned of job sizes (the keys with the most
    ended jobs behind them) and, for each job named that the latest pass saw, its level and why."""
    from ..scheduling.learned import key_summaries, standing  # the policy's code: only here
    job_ids = int_list(body, "job_ids") or []
    if len(job_ids) > MAX_EXPLAINED:  # each is a walk over the model's bins, on the event loop
        raise RequestError(f"field 'job_ids' has too many entries ({len(job_ids)}; at most {MAX_EXPLAINED})")
    cfg = ctx.ctl.cfg.scheduler
    model = ctx.ctl.sizes.model
    snap = ctx.ctl.last_snapshot
    seen = {j.id: j for j in snap.jobs} if snap is not None and job_ids else {}
    jobs = []
    for job_id in job_ids:
        job = seen.get(job_id)
        if job is None:
            jobs.append({"job_id": job_id, "text": "not pending or running in the latest scheduling pass"})
        elif cfg.policy != "mlfq":
            jobs.append({"job_id": job_id, "text": f"the {cfg.policy} policy has no levels"})
        else:
            jobs.append({"job_id": job_id, **standing(cfg.mlfq, model, job, snap.now)})
    return {"policy": cfg.policy, "order": cfg.mlfq.order, "restart_cost": cfg.mlfq.restart_cost,
            "learned_from": model.seen, "keys": [asdict(k) for k in key_summaries(model)], "jobs": jobs}
