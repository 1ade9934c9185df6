"""Submission (hsubmit, sbatch): checks in order of cost, the fit and --test-only probes, the record."""
from __future__ import annotations

import asyncio
import functools
import time
from dataclasses import replace
from typing import Mapping

from ..core.model import PRIORITY_CLASSES
from ..core.envfilter import submitted_env
from ..core.jobids import parse_array
from ..core.jobscript import JobScriptError, parse_submission, split_command_line
from ..core.reasons import PRIORITY
from ..core.resources import could_ever_fit, unknown_features
from ..store.repository import spec_size
from ..store.views import probe_view
from ..transport.rpc import RequestError
from .access import Caller, deny
from .apicontext import PARSE_ON_LOOP, ApiContext
from .events import event_row
from .outputcheck import outputs_problem
from .api_reservations import checked_reservation
from . import interactive as interactive_jobs
from .partitions import PartitionRefused, admit, admit_qos, groups_of, qos_time_limit
from .requests import expect, str_list


async def submit(ctx: ApiContext, body, caller: Caller):
    if isinstance(body, dict) and "argv" in body:  # hsubmit's own arguments, not split yet
        split = split_submission(body)
        if split["script_path"] is not None or not any(o == "--wrap" or o.startswith("--wrap=")
                                                       for o in split["options"]):
            return {"need_script": True, **split}  # the client reads the file (or stdin), asks again
        body = {**body, "option_args": split["options"], "script_args": split["script_args"]}
    script = expect(body, "script", str)
    option_args = str_list(body, "option_args") or []
    script_args = str_list(body, "script_args") or []
    cwd = expect(body, "cwd", str, required=True)
    env = expect(body, "env", dict, default={})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise RequestError("field 'env' must map strings to strings")
    env = submitted_env(env)
    umask = expect(body, "umask", int)
    if umask is not None and not 0 <= umask <= 0o777:
        raise RequestError(f"field 'umask' must be between 0 and 0777, got {umask}")
    script_name = expect(body, "script_name", str)
    # salloc and srun outside a job: an allocation for a client (controller/interactive.py);
    # `immediate`: refused unless it would start now (salloc --immediate)
    interactive = expect(body, "interactive", bool, default=False)
    immediate = expect(body, "immediate", bool, default=False)
    detached = expect(body, "detached", bool, default=False)  # salloc --no-shell: no client holds it
    key = submission_key(body)
    too_big = script_too_big(ctx, script, option_args, script_args)
    if too_big:
        raise RequestError(too_big)
    await ctx.take_rate(caller, 1)  # before the parse: a refused submission costs its parse too
    parse = functools.partial(parse_submission, script, option_args, cwd=cwd, env=env, script_args=script_args,
                              script_name=script_name, now=time.time(), max_array_size=ctx.ctl.cfg.max_array_size,
                              cluster_name=ctx.ctl.cfg.cluster_name)
    try:
        # A big script takes a worker thread (pure Python: the loop still runs every few ms):
        # a 4 MiB one costs ~0.7 s to scan, which on the loop held every other user.
        sub = parse() if len(script or "") < PARSE_ON_LOOP else await asyncio.to_thread(parse)
    except (JobScriptError, ValueError) as exc:
        raise RequestError(str(exc)) from None
    spec = replace(sub.spec, umask=umask)
    if interactive:
        spec = interactive_jobs.allocation_spec(spec, detached=detached)
    too_big = env_too_big(ctx, spec.environment)  # what --export keeps of it, as it is stored
    if too_big:
        raise RequestError(too_big)
    if spec.grace > ctx.ctl.cfg.max_grace:  # its end would wait that long after a cancel or preemption
        raise RequestError(f"Batch job submission failed: --grace={spec.grace} is above this cluster's "
                           f"max_grace ({ctx.ctl.cfg.max_grace} s)")
    groups = groups_of(caller.user, caller.gid)
    account = ctx.ctl.tenancy.account_for(caller, spec.account)
    try:
        given = spec.time_limit
        spec, granted = admit_qos(spec, ctx.ctl.cfg, user=caller.user, account=account, groups=groups,
                                  admin=caller.admin)
        partition, spec = admit(spec, ctx.ctl.cfg, user=caller.user, groups=groups, admin=caller.admin)
        spec = qos_time_limit(spec, ctx.ctl.cfg, given)
        if interactive:
            spec = interactive_jobs.time_limit(spec, ctx.ctl.cfg, given)
    except PartitionRefused as exc:
        raise RequestError(f"Batch job submission failed: {exc}") from None
    if spec.nice < 0 and not caller.admin:
        raise deny(caller, f"--nice={spec.nice}: only administrators may give a negative adjustment")
    allowed = PRIORITY_CLASSES.index(ctx.ctl.cfg.scheduler.max_user_priority)
    if not caller.admin and not granted and PRIORITY_CLASSES.index(spec.priority) < allowed:
        raise deny(caller, f"--priority={spec.priority} is above what users may ask for "
                           f"({ctx.ctl.cfg.scheduler.max_user_priority}); a QOS may give more: hcontrol show qos")
    outputs = (spec.stdout, spec.stderr, spec.workdir, caller.user, caller.uid, caller.gid)
    if not interactive and not ctx.writable.fresh(outputs, time.monotonic()):
        problem = await asyncio.to_thread(outputs_problem, *outputs)  # a hung mount must not stall the loop
        if problem:
            raise RequestError(problem)
        ctx.writable.note(outputs, time.monotonic())
    view = probe_view(spec, job_id=0, user=caller.user, partition=partition, now=0)
    # The last pass's nodes say yes for almost every job without a query; a no is checked
    # against the store before it refuses (a node may have joined since that pass).
    if not ctx.ctl.inventory or not could_ever_fit(view, ctx.ctl.inventory):
        known = ctx.ctl.note_inventory(await ctx.ctl.db(ctx.repo.load_nodes))
        if known and (unknown := unknown_features(view, known)):
            raise RequestError(f"Batch job submission failed: Invalid feature specification: no node has the "
                               f"feature(s) {', '.join(unknown)}")
        fit = could_ever_fit(view, known)
        if known and not fit:
            raise RequestError(f"Batch job submission failed: Requested node configuration is not available: "
                               f"{fit.reason}")
    if spec.dependency:
        await ctx.checked_dependency(spec.dependency)
    spec = replace(spec, account=account)
    if spec.reservation is not None:
        await checked_reservation(ctx, spec.reservation, caller, account)
    if sub.test_only:
        return {"test_only": await would_start(ctx, spec, partition, caller)}
    if immediate:  # salloc --immediate: as Slurm's, refused at once unless it would start now
        probe = await would_start(ctx, spec, partition, caller)
        if probe["start"] != "now":
            raise RequestError("Unable to allocate resources: Immediate execution impossible, insufficient priority")
    tasks = len(parse_array(spec.array, None).indices) if spec.array else 1
    if tasks > 1:
        await ctx.take_rate(caller, tasks - 1)  # an array's other tasks

    def rows(job_id: int) -> list[dict]:
        out = [event_row("submitted", job_id, user=caller.user, partition=partition, nodes=spec.nodes,
                         gpus_per_node=spec.gpus_per_node, priority=spec.priority, hold=spec.hold or None,
                         array=spec.array, account=account)]
        if spec.reason_at_submission is not None:
            out.append(event_row("waiting", job_id, reason=spec.reason_at_submission))
        return out
    events = ctx.ctl.events.draft(rows)

    def record() -> int:  # on the store thread: no other submission counts in between
        ctx.ctl.tenancy.check_submission(ctx.repo.engine, caller, account, tasks, spec_size(spec.to_wire()))
        if interactive:
            interactive_jobs.check_limits(ctx.repo.engine, ctx.ctl.cfg, user=caller.user, account=account, spec=spec)
        return ctx.repo.submit(spec, user=caller.user, uid=caller.uid, gid=caller.gid, partition=partition,
                               now=time.time(), account=account, key=key, events=events)
    job_id = await ctx.ctl.db(record)
    events.commit()
    # A held job cannot start, and its reason is stored with it: a pass would only load the
    # whole queue again (a burst of held submissions woke one per 50 ms, each reading them all).
    # A retried submission (its key known) changed nothing.
    if events.built and spec.reason_at_submission is None:
        ctx.ctl.wake()
    return {"job_id": job_id, "parsable": sub.parsable, "wait": sub.wait}  # directives may set them


def submission_key(body: Mapping) -> str | None:
    """The client's idempotency key (store/submit_keys.py): 16 to 64 letters, digits, '-' or '_'."""
    key = expect(body, "key", str)
    if key is not None and not (16 <= len(key) <= 64 and key.isascii()
                                and all(ch.isalnum() or ch in "-_" for ch in key)):
        raise RequestError("field 'key' must be 16 to 64 letters, digits, '-' or '_'")
    return key


def script_too_big(ctx: ApiContext, script: str | None, option_args: list[str], script_args: list[str]) -> str | None:
    """Why a submission's script is refused for its size, before it is parsed (None: it is not)."""
    size = sum(len(a.encode()) for a in (script or "", *option_args, *script_args))
    if size > ctx.ctl.cfg.max_script_bytes:
        return (f"Batch job submission failed: the batch script and its arguments are too large "
                f"({size} bytes; at most {ctx.ctl.cfg.max_script_bytes}, the controller's max_script_bytes)")
    return None


def env_too_big(ctx: ApiContext, env: Mapping[str, str]) -> str | None:
    size = sum(len(k.encode()) + len(v.encode()) + 2 for k, v in env.items())
    if size > ctx.ctl.cfg.max_env_bytes:
        return (f"Batch job submission failed: the job's environment is too large ({size} bytes in "
                f"{len(env)} variables; at most {ctx.ctl.cfg.max_env_bytes}, the controller's max_env_bytes; "
                f"export fewer with --export)")
    return None


def split_submission(body) -> dict:
    """hsubmit's arguments -> options, script path, script arguments: the client need not
    import the job script parser (a fifth of its start-up) to know which file to read, and a
    --wrap submission takes one round trip."""
    try:
        options, script_path, script_args = split_command_line(str_list(body, "argv") or [])
    except JobScriptError as exc:
        raise RequestError(str(exc)) from None
    return {"options": options, "script_path": script_path, "script_args": script_args}


async def would_start(ctx: ApiContext, spec, partition: str, caller: Caller) -> dict:
    """sbatch --test-only: run the policy on the current state with this job added, change nothing.
    One probe at a time, cluster-wide: each is a whole pass on the policy's thread, and sixteen at
    once from one user held every scheduling pass back by seconds (fifth audit)."""
    async with ctx.probe_lock:
        now = time.time()
        snapshot = await ctx.ctl.db(ctx.repo.load_snapshot, now)
        # the job as it would be stored: begin time, dependency and time limit included
        probe = await ctx.ctl.db(ctx.repo.probe, spec, user=caller.user, partition=partition, now=now,
                                 account=spec.account or "default")
        plan = await ctx.ctl.decide(replace(snapshot, jobs=snapshot.jobs + (probe,)))
    for action in plan.actions:
        if action.job_id == -1 and hasattr(action, "placement"):
            return {"start": "now", "nodes": list(action.placement.nodes), "partition": partition}
        if action.job_id == -1:
            return {"start": None, "reason": action.reason, "partition": partition}
    return {"start": None, "reason": PRIORITY, "partition": partition}
