"""What users and operators change: cancel and signal, hold and release, requeue, preempt, updates of
jobs, nodes and limits. Each checks the caller against the job's owner and the caller's role."""
from __future__ import annotations

import signal as signals
import time
from typing import Any

from ..core.dependency import parse_dependency
from ..core.jobids import JobRef, job_label
from ..core.model import JobSpec
from ..core.states import JobState, parse_state
from ..core.timefmt import format_limit, parse_time_limit
from ..transport.rpc import RequestError
from .access import Caller, deny, may_act_on
from .apicontext import NOT_FINAL, ApiContext
from .events import event_row
from .partitions import PartitionRefused, admit, groups_of
from .requests import expect, filter_list, int_list, one_line, str_list, task_list


async def cancel(ctx: ApiContext, body, caller: Caller):
    ids = int_list(body, "ids")
    tasks = task_list(body)
    users = filter_list(body, "users")
    states = str_list(body, "states")
    names = filter_list(body, "names")
    partitions = filter_list(body, "partitions")
    signum = expect(body, "signal", int)
    if not (ids or tasks or users or states or names or partitions):
        raise RequestError("No job identification provided")
    if signum is not None and signum not in set(signals.valid_signals()):
        raise RequestError(f"invalid signal number {signum}")
    try:
        states = [parse_state(s).value for s in states] if states else NOT_FINAL
    except ValueError as exc:
        raise RequestError(str(exc)) from None
    if ended := [s for s in states if s not in NOT_FINAL]:  # never a walk over the whole history
        raise RequestError(f"Invalid job state specified: {ended[0]} (only jobs not ended can be "
                           f"cancelled or signalled: {', '.join(NOT_FINAL)})")
    errors, refused = [], []
    if not (ids or tasks) and not caller.admin:
        # Filters select the caller's own jobs: naming another user's is one refusal, not one
        # per job of theirs (each a lookup, a log line and a reply row).
        if others := sorted(set(users or ()) - {caller.user}):
            refused.append(f"the jobs of {', '.join(others[:3])}{' and others' if len(others) > 3 else ''}")
            errors.append(f"Kill job error: Access/permission denied: jobs of user(s) {', '.join(others)}")
            if users and caller.user not in users:
                deny(caller, f"{'signal' if signum is not None else 'cancel'} of {refused[0]}")
                return {"done": [], "errors": errors}
        users = [caller.user]
    rows = await ctx.ctl.db(ctx.repo.jobs, ids=ids, users=users, states=states, names=names, partitions=partitions,
                            tasks=tasks)
    found = {j["id"] for j in rows} | {j["array_job_id"] for j in rows}
    found_tasks = {(j["array_job_id"], j["array_task_id"]) for j in rows}
    missing_ids = sorted(set(ids or ()) - found)
    missing_tasks = [t for t in sorted(set(tasks or ())) if t not in found_tasks]
    known_ids, known_tasks = set(), set()
    if missing_ids or missing_tasks:  # ended, or never were: a seek each, not the arrays' tasks
        known_ids, known_tasks = await ctx.ctl.db(ctx.repo.known_jobs, missing_ids, missing_tasks)
    for job_id, task in [(i, None) for i in missing_ids] + missing_tasks:
        label = str(JobRef(job_id, (task,) if task is not None else None))
        if (job_id in known_ids) if task is None else ((job_id, task) in known_tasks):
            errors.append(f"Kill job error on job id {label}: Job/step already completing or completed")
        else:
            errors.append(f"Invalid job id specified: {label}")
    done, pending = [], []
    what = "signal" if signum is not None else "cancel"
    for job in rows:
        if not may_act_on(caller, job["user"], operators=False):
            refused.append(f"job {job_label(job)} (owned by {job['user']})")
            errors.append(f"Kill job error on job id {job_label(job)}: Access/permission denied: "
                          f"{what} of job {job_label(job)} (owned by {job['user']})")
            continue
        state = JobState(job["state"])
        if signum is not None:
            if state == JobState.PENDING:
                errors.append(f"Signal job error on job id {job_label(job)}: job is pending")
            else:
                await ctx.ctl.dispatch.signal_job(job["id"], signum)
                done.append(job["id"])
        elif state == JobState.PENDING:
            pending.append(job["id"])  # all in one transaction, below
        elif state.holds_resources:
            event = ctx.ctl.events.draft(lambda _, i=job["id"], was=state.value: [
                event_row("cancel_requested", i, by=caller.user, state=was)])
            await ctx.ctl.db(ctx.repo.request_end, job["id"], "cancel", f"cancelled by {caller.uid}", events=event)
            event.commit()
            ctx.ctl.client_steps.revoke(job["id"], JobState.CANCELLED.value)  # salloc hears it first
            await ctx.ctl.dispatch.end_job(job["id"], "cancel")
            done.append(job["id"])
    if pending:  # one that started meanwhile is no longer pending: left as it is, as before
        events = ctx.ctl.events.draft(lambda ids: [event_row("cancel_requested", i, by=caller.user,
                                                             state=JobState.PENDING.value) for i in ids])
        cancelled = set(await ctx.ctl.db(ctx.repo.cancel_pendings, pending, time.time(), caller.uid, events=events))
        events.commit()
        for job_id in cancelled:
            ctx.ctl.client_steps.revoke(job_id, JobState.CANCELLED.value)
        done += [j for j in pending if j in cancelled]
    if refused:  # logged once per request, however many jobs it named
        deny(caller, f"{what} of {', '.join(refused[:5])}{f' and {len(refused) - 5} more' if len(refused) > 5 else ''}")
    ctx.ctl.wake()
    return {"done": done, "errors": errors}


async def requeue(ctx: ApiContext, body, caller: Caller):
    """Checkpoint and requeue now (hcontrol requeue): the run ends as REQUEUED, the job waits again."""
    job = await ctx.own_job(body, caller, "requeue")
    if not job.preemptible:
        raise RequestError(f"Requeue of job {job.id} refused: it was submitted with --no-requeue")
    if job.state == JobState.PREEMPTING.value:
        return {"job_id": job.id}  # already on its way back to the queue (a job's own requeue in its grace)
    if job.state != JobState.RUNNING.value:
        raise RequestError(f"Job {job.id} is {job.state}; only a running job can be requeued")
    await ctx.take_rate(caller, 1)  # a new run, as a submission is (a loop made 110,000 a day per job)
    await ctx.ctl.preempt(job.id, "requeue", f"requeued by {caller.user}", by=caller.user)
    return {"job_id": job.id}


async def preempt(ctx: ApiContext, body, caller: Caller):
    """Operators and admins: checkpoint a running job and put it back in the queue, as the scheduler would."""
    if not caller.operator:
        raise deny(caller, "only operators and administrators may preempt jobs")
    job = await ctx.own_job(body, caller, "preemption")
    if job.state != JobState.RUNNING.value:
        raise RequestError(f"Job {job.id} is {job.state}; only a running job can be preempted")
    if not job.preemptible:
        raise RequestError(f"Job {job.id} was submitted with --no-requeue and is never preempted")
    await ctx.ctl.preempt(job.id, "preempt", f"preempted by administrator {caller.user}", by=caller.user)
    return {"job_id": job.id}


async def set_hold(ctx: ApiContext, body, caller: Caller, hold: bool):
    job = await ctx.own_job(body, caller, "hold" if hold else "release")
    await ctx.take_rate(caller, 1)  # a store write and an event row: a loop made 188 a second
    event = ctx.ctl.events.draft(lambda _: [event_row("held" if hold else "released", job.id, by=caller.user)])
    error = await ctx.ctl.db(ctx.repo.set_hold, job.id, hold, admin=caller.operator and job.user != caller.user,
                             events=event)
    if error:
        raise RequestError(error)
    event.commit()
    ctx.ctl.wake()
    return {"job_id": job.id}


async def update_node(ctx: ApiContext, body, caller: Caller):
    """Operators: drain a node (running jobs finish, nothing new starts) or resume it; admins also set it down."""
    if not caller.operator:
        raise deny(caller, "only operators and administrators may change node state")
    name = expect(body, "name", str, required=True)
    state = expect(body, "state", str, required=True).lower()
    reason = expect(body, "reason", str)
    target = {"drain": "drain", "resume": "up", "up": "up", "idle": "up", "down": "down"}.get(state)
    if target is None:
        raise RequestError(f"Invalid node state specified: {state} (use drain, resume or down)")
    if target == "down" and not caller.admin:
        raise deny(caller, f"only administrators may set node {name} down")
    if target != "up" and not reason:
        raise RequestError(f"A reason is required to set node {name} {target} (reason=...)")
    if reason:  # every user sees it (hinfo -R, hcontrol show node)
        one_line("the reason", reason, max_len=150)
    if not await ctx.ctl.db(ctx.repo.set_node_state, name, target, reason and f"{reason} [{caller.user}]"):
        raise RequestError(f"Invalid node name specified: {name}")
    ctx.ctl.events.record("node_state", None, name, state=target, by=caller.user, reason=reason)
    ctx.ctl.wake()
    return {"name": name, "state": target}


async def requeuehold(ctx: ApiContext, body, caller: Caller):
    """Requeue a running job and hold it (a pending job is just held): JobHeldAdmin when an
    administrator does it to another's job, else JobHeldUser."""
    job = await ctx.own_job(body, caller, "requeue")
    if job.state == JobState.PENDING.value:
        return await set_hold(ctx, body, caller, True)
    if not job.preemptible:
        raise RequestError(f"Requeue of job {job.id} refused: it was submitted with --no-requeue")
    if job.state != JobState.RUNNING.value:
        raise RequestError(f"Job {job.id} is {job.state}; only a running or pending job can be requeued held")
    await ctx.take_rate(caller, 1)  # a new run, as requeue
    admin = caller.admin and job.user != caller.user
    if not await ctx.ctl.db(ctx.repo.hold_running, job.id, admin=admin):
        raise RequestError(f"Job {job.id} is no longer running")
    await ctx.ctl.preempt(job.id, "requeue", f"requeued and held by {caller.user}")
    return {"job_id": job.id}


async def update_job(ctx: ApiContext, body, caller: Caller):
    """scontrol update JobId=N TimeLimit= Partition= Dependency= (pending jobs; owner or admin;
    a user may only lower the time limit)."""
    job = await ctx.own_job(body, caller, "update", operators=False)
    await ctx.take_rate(caller, 1)  # as hold: a store write and an event row each
    fields = expect(body, "fields", dict, required=True)
    if not fields or not all(isinstance(k, str) and isinstance(v, str) for k, v in fields.items()):
        raise RequestError("field 'fields' must map job fields to values")
    changes: dict[str, Any] = {}
    # the partition last: its MaxTime applies to the time limit as it will be (fifth audit: moved
    # into a partition with MaxTime, a job kept an unlimited time limit)
    for key, value in sorted(fields.items(), key=lambda kv: kv[0].lower() == "partition"):
        if key.lower() == "timelimit":
            try:
                limit = parse_time_limit(value)
            except ValueError as exc:
                raise RequestError(f"Invalid TimeLimit={value}: {exc}") from None
            old = job.time_limit
            if not caller.admin and old is not None and (limit is None or limit > old):
                raise RequestError(f"Access/permission denied: only an administrator may raise the time limit "
                                   f"of job {job.id} (from {format_limit(old)} to {format_limit(limit)})")
            changes["time_limit"] = limit
        elif key.lower() == "partition":
            probe = JobSpec.from_wire({**job.spec.to_wire(), "partition": value,
                                       "time_limit": changes.get("time_limit", job.time_limit)})
            try:
                changes["partition"], admitted = admit(probe, ctx.ctl.cfg, user=job.user,
                                                       groups=groups_of(job.user, job.gid), admin=caller.admin)
            except (PartitionRefused, ValueError) as exc:
                raise RequestError(str(exc)) from None
            if admitted.time_limit != probe.time_limit:  # none given: the partition's MaxTime
                changes["time_limit"] = admitted.time_limit
        elif key.lower() == "dependency":
            changes["dependency"] = await ctx.checked_dependency(value) if value else None
            own = {job.id, job.array_job_id}
            if value and any(j in own for j, _t in parse_dependency(value).targets):
                raise RequestError(f"Job dependency problem: job {job.id} cannot depend on itself or its array")
        else:
            raise RequestError(f"Update of job {job.id} failed: unknown field {key} "
                               f"(TimeLimit, Partition and Dependency can be changed)")
    error = await ctx.ctl.db(ctx.repo.update_pending, job.id, changes)
    if error:
        raise RequestError(error)
    ctx.ctl.wake()
    return {"job_id": job.id}


async def update_limits(ctx: ApiContext, body, caller: Caller):
    """Admins: hcontrol update Account=NAME / User=NAME with MaxGPUs, MaxPending, MaxJobs, Shares."""
    kind = expect(body, "kind", str, required=True)
    name = expect(body, "name", str, required=True)
    if kind not in ("account", "user") or not name or len(name) > 64:
        raise RequestError("update_limits needs kind account or user and a name (at most 64 characters)")
    one_line(f"the {kind} name", name)
    values = {}
    for key in ("shares", "max_gpus", "max_pending", "max_jobs"):
        value = expect(body, key, int)
        if value is not None:
            if not 0 <= value <= 10**9 or key == "shares" and value < 1:
                raise RequestError(f"invalid {key} {value}: use 0 (no limit) up to 1000000000"
                                   + (", shares at least 1" if key == "shares" else ""))
            values[key] = value
    if not values:
        raise RequestError("nothing to update (MaxGPUs=, MaxPending=, MaxJobs=, Shares=)")
    if not caller.admin:  # before the store is touched
        raise deny(caller, f"only administrators may change the limits of {kind} {name}")
    result = await ctx.ctl.db(ctx.ctl.tenancy.update, ctx.repo.engine, caller, kind, name, values)
    ctx.ctl.wake()
    return result


async def hold(ctx: ApiContext, body, caller: Caller):
    return await set_hold(ctx, body, caller, True)


async def release(ctx: ApiContext, body, caller: Caller):
    return await set_hold(ctx, body, caller, False)
