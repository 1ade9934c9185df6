"""The controller's client API: what hsubmit, hqueue, hcancel, hinfo, hacct and hcontrol call.

The caller's identity is the uid the kernel reports for the socket peer (SO_PEERCRED); nothing
the client sends can change it. Bad input is answered with a specific error and changes nothing.
"""
from __future__ import annotations

import pwd
import signal as signals
import time
from dataclasses import dataclass, replace
from typing import Any

from ..config import PRIORITY_CLASSES
from ..core.jobscript import JobScriptError, parse_submission, split_command_line
from ..core.model import JobView
from ..core.resources import could_ever_fit
from ..core.states import FINAL_STATES, JobState, parse_state
from ..store.events import read_events
from ..store.repository import LISTING_COLUMNS, required_runtime
from ..transport.rpc import RequestError, RpcTable
from . import membership
from .service import Controller

NOT_FINAL = [s.value for s in JobState if s not in FINAL_STATES and s not in (JobState.PREEMPTED,
                                                                                JobState.REQUEUED)]


@dataclass(frozen=True)
class Caller:
    uid: int
    gid: int
    pid: int
    user: str
    admin: bool


def caller_from_creds(pid: int, uid: int, gid: int, admins: tuple[str, ...]) -> Caller:
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = str(uid)
    return Caller(uid=uid, gid=gid, pid=pid, user=user, admin=uid == 0 or user in admins)


def _expect(body: Any, key: str, typ: type | tuple, *, required: bool = False, default: Any = None) -> Any:
    if not isinstance(body, dict):
        raise RequestError("request body must be a map")
    if key not in body or body[key] is None:
        if required:
            raise RequestError(f"missing field {key!r}")
        return default
    value = body[key]
    if not isinstance(value, typ) or isinstance(value, bool) and typ is int:
        raise RequestError(f"field {key!r} has the wrong type")
    return value


def _int_list(body: Any, key: str) -> list[int] | None:
    values = _expect(body, key, list)
    if values is not None and not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise RequestError(f"field {key!r} must be a list of job ids")
    return values


def _str_list(body: Any, key: str) -> list[str] | None:
    values = _expect(body, key, list)
    if values is not None and not all(isinstance(v, str) for v in values):
        raise RequestError(f"field {key!r} must be a list of strings")
    return values


# What a listing may ask for (`fields`): the job table's columns but the spec, and what _public adds.
LISTING_FIELDS = frozenset(c.name for c in LISTING_COLUMNS) | {"code", "attained_now", "level"}
_PUBLIC_NEEDS = ("state", "attained_gpu_seconds", "start_time", "nodes", "gpus_per_node")


def _public(job: dict, mlfq, now: float) -> dict:
    out = dict(job)
    out.pop("spec", None)
    state = JobState(job["state"])
    out["code"] = state.code
    attained = job["attained_gpu_seconds"]
    if state.holds_resources and job["start_time"]:
        attained += job["nodes"] * job["gpus_per_node"] * max(0.0, now - job["start_time"])
    out["attained_now"] = attained
    out["level"] = mlfq.level_of(attained)
    return out


def build_api(ctl: Controller) -> RpcTable:
    api = RpcTable()
    repo = lambda: ctl.repo  # noqa: E731  (the store opens after the table is built)
    mlfq = ctl.cfg.scheduler.mlfq

    def public(job: dict) -> dict:
        return _public(job, mlfq, time.time())

    async def own_job(body: Any, caller: Caller) -> dict:
        job_id = _expect(body, "job_id", int, required=True)
        job = await ctl.db(repo().job, job_id)
        if job is None:
            raise RequestError(f"Invalid job id specified: {job_id}")
        if job["user"] != caller.user and not caller.admin:
            raise RequestError(f"Access/permission denied for job {job_id}")
        return job

    @api.expose("ping")
    async def ping(body, caller: Caller):
        return {"time": time.time(), "user": caller.user, "uid": caller.uid, "admin": caller.admin}

    @api.expose("submit")
    async def submit(body, caller: Caller):
        script = _expect(body, "script", str)
        option_args = _str_list(body, "option_args") or []
        script_args = _str_list(body, "script_args") or []
        cwd = _expect(body, "cwd", str, required=True)
        env = _expect(body, "env", dict, default={})
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise RequestError("field 'env' must map strings to strings")
        script_name = _expect(body, "script_name", str)
        try:
            sub = parse_submission(script, option_args, cwd=cwd, env=env, script_args=script_args,
                                   script_name=script_name, now=time.time())
        except (JobScriptError, ValueError) as exc:
            raise RequestError(str(exc)) from None
        spec = sub.spec
        allowed = PRIORITY_CLASSES.index(ctl.cfg.scheduler.max_user_priority)
        if not caller.admin and PRIORITY_CLASSES.index(spec.priority) < allowed:
            raise RequestError(f"Access/permission denied: --priority={spec.priority} is above what users may "
                               f"ask for ({ctl.cfg.scheduler.max_user_priority})")
        partition = spec.partition or ctl.cfg.default_partition
        if partition not in ctl.cfg.partitions:
            raise RequestError(f"invalid partition specified: {partition}")
        known = tuple(n for n in await ctl.db(repo().load_nodes) if n.cpus > 0)  # inventory seen
        if known:
            view = JobView(id=0, user=caller.user, state=JobState.PENDING, submit_time=0, nodes=spec.nodes,
                           gpus_per_node=spec.gpus_per_node, cpus_per_task=spec.cpus_per_task,
                           mem_mb=spec.mem_mb, partition=partition, runtime=required_runtime(spec))
            fit = could_ever_fit(view, known)
            if not fit:
                raise RequestError(f"Requested node configuration is not available: {fit.reason}")
        if sub.test_only:
            return {"test_only": await would_start(spec, partition, caller)}
        job_id = await ctl.db(repo().submit, spec, user=caller.user, uid=caller.uid, gid=caller.gid,
                              partition=partition, now=time.time())
        ctl.events.record("submitted", job_id, user=caller.user, partition=partition, nodes=spec.nodes,
                          gpus_per_node=spec.gpus_per_node, priority=spec.priority, hold=spec.hold or None)
        ctl.wake()
        return {"job_id": job_id, "parsable": sub.parsable, "wait": sub.wait}  # directives may set them

    @api.expose("split_submission")
    async def split_submission(body, caller: Caller):
        """hsubmit's arguments -> options, script path, script arguments: the client need not
        import the job script parser (a fifth of its start-up) to know which file to read."""
        try:
            options, script_path, script_args = split_command_line(_str_list(body, "argv") or [])
        except JobScriptError as exc:
            raise RequestError(str(exc)) from None
        return {"options": options, "script_path": script_path, "script_args": script_args}

    async def would_start(spec, partition: str, caller: Caller) -> dict:
        """sbatch --test-only: run the policy on the current state with this job added, change nothing."""
        now = time.time()
        snapshot = await ctl.db(repo().load_snapshot, now)
        probe = JobView(id=-1, user=caller.user, state=JobState.PENDING, submit_time=now, nodes=spec.nodes,
                        gpus_per_node=spec.gpus_per_node, cpus_per_task=spec.cpus_per_task, mem_mb=spec.mem_mb,
                        partition=partition, priority=spec.priority, hold=spec.hold, pending_since=now,
                        preemptible=spec.requeue, runtime=required_runtime(spec))
        plan = await ctl.decide(replace(snapshot, jobs=snapshot.jobs + (probe,)))
        for action in plan.actions:
            if action.job_id == -1 and hasattr(action, "placement"):
                return {"start": "now", "nodes": list(action.placement.nodes), "partition": partition}
            if action.job_id == -1:
                return {"start": None, "reason": action.reason, "partition": partition}
        return {"start": None, "reason": "Priority", "partition": partition}

    @api.expose("jobs")
    async def jobs(body, caller: Caller):
        states = _str_list(body, "states")
        try:
            states = [parse_state(s).value for s in states] if states else None
        except ValueError as exc:
            raise RequestError(str(exc)) from None
        if _expect(body, "all", bool, default=False):
            states = states or None
        else:
            states = states or NOT_FINAL
        fields = _str_list(body, "fields")  # only these keys per job (hqueue asks for its columns)
        columns = None
        if fields is not None:
            if unknown := sorted(set(fields) - LISTING_FIELDS):
                raise RequestError(f"unknown job field(s): {', '.join(unknown)}")
            columns = sorted((set(fields) - {"code", "attained_now", "level"}) | set(_PUBLIC_NEEDS))
        rows = await ctl.db(repo().jobs, ids=_int_list(body, "ids"), states=states,
                            users=_str_list(body, "users"), names=_str_list(body, "names"),
                            partitions=_str_list(body, "partitions"), columns=columns)
        if fields is None:
            return {"now": time.time(), "jobs": [public(j) for j in rows]}
        return {"now": time.time(), "jobs": [{k: p[k] for k in fields} for p in map(public, rows)]}

    @api.expose("show_job")
    async def show_job(body, caller: Caller):
        job_id = _expect(body, "job_id", int, required=True)
        job = await ctl.db(repo().job, job_id)
        if job is None:
            raise RequestError(f"Invalid job id specified: {job_id}")
        out = public(job)
        out["spec"] = {k: v for k, v in job["spec"].items() if k not in ("environment", "script")}
        out["runs"] = await ctl.db(repo().runs, job_ids=[job_id])
        return {"now": time.time(), "job": out}

    @api.expose("cancel")
    async def cancel(body, caller: Caller):
        ids = _int_list(body, "ids")
        users = _str_list(body, "users")
        states = _str_list(body, "states")
        names = _str_list(body, "names")
        partitions = _str_list(body, "partitions")
        signum = _expect(body, "signal", int)
        if not (ids or users or states or names or partitions):
            raise RequestError("No job identification provided")
        if signum is not None and signum not in set(signals.valid_signals()):
            raise RequestError(f"invalid signal number {signum}")
        try:
            states = [parse_state(s).value for s in states] if states else NOT_FINAL
        except ValueError as exc:
            raise RequestError(str(exc)) from None
        rows = await ctl.db(repo().jobs, ids=ids, users=users, states=states, names=names, partitions=partitions)
        errors = []
        found = {j["id"] for j in rows}
        for missing in sorted(set(ids or ()) - found):
            known = await ctl.db(repo().job, missing)
            if known is None:
                errors.append(f"Invalid job id specified: {missing}")
            else:
                errors.append(f"Kill job error on job id {missing}: Job/step already completing or completed")
        done = []
        for job in rows:
            if job["user"] != caller.user and not caller.admin:
                errors.append(f"Kill job error on job id {job['id']}: Access/permission denied")
                continue
            state = JobState(job["state"])
            if signum is not None:
                if state == JobState.PENDING:
                    errors.append(f"Signal job error on job id {job['id']}: job is pending")
                else:
                    await ctl.signal_job(job["id"], signum)
                    done.append(job["id"])
            elif state == JobState.PENDING:
                if await ctl.db(repo().cancel_pending, job["id"], time.time(), caller.uid):
                    ctl.events.record("cancel_requested", job["id"], by=caller.user, state=state.value)
                    done.append(job["id"])
            elif state.holds_resources:
                await ctl.db(repo().request_end, job["id"], "cancel", f"cancelled by {caller.uid}")
                ctl.events.record("cancel_requested", job["id"], by=caller.user, state=state.value)
                await ctl.end_job(job["id"], "cancel")
                done.append(job["id"])
        ctl.wake()
        return {"done": done, "errors": errors}

    @api.expose("nodes")
    async def nodes(body, caller: Caller):
        return {"now": time.time(), "nodes": await ctl.db(repo().nodes),
                "links": {name: link.last_error for name, link in ctl.links.items()}}

    @api.expose("acct")
    async def acct(body, caller: Caller):
        ids = _int_list(body, "ids")
        users = _str_list(body, "users")
        run_rows = await ctl.db(repo().runs, job_ids=ids, users=users)
        job_rows = await ctl.db(repo().jobs, ids=ids, users=users)
        return {"now": time.time(), "runs": run_rows, "jobs": [public(j) for j in job_rows]}

    @api.expose("requeue")
    async def requeue(body, caller: Caller):
        """Checkpoint and requeue now (hcontrol requeue): the run ends as REQUEUED, the job waits again."""
        job = await own_job(body, caller)
        if not job["preemptible"]:
            raise RequestError(f"Requeue of job {job['id']} refused: it was submitted with --no-requeue")
        if job["state"] != JobState.RUNNING.value:
            raise RequestError(f"Job {job['id']} is {job['state']}; only a running job can be requeued")
        await ctl.preempt(job["id"], "requeue", f"requeued by {caller.user}", by=caller.user)
        return {"job_id": job["id"]}

    @api.expose("preempt")
    async def preempt(body, caller: Caller):
        """Admins: checkpoint a running job and put it back in the queue, as the scheduler would."""
        if not caller.admin:
            raise RequestError("Access/permission denied: only administrators may preempt jobs")
        job = await own_job(body, caller)
        if job["state"] != JobState.RUNNING.value:
            raise RequestError(f"Job {job['id']} is {job['state']}; only a running job can be preempted")
        if not job["preemptible"]:
            raise RequestError(f"Job {job['id']} was submitted with --no-requeue and is never preempted")
        await ctl.preempt(job["id"], "preempt", f"preempted by administrator {caller.user}", by=caller.user)
        return {"job_id": job["id"]}

    async def set_hold(body, caller: Caller, hold: bool):
        job = await own_job(body, caller)
        error = await ctl.db(repo().set_hold, job["id"], hold, admin=caller.admin and job["user"] != caller.user)
        if error:
            raise RequestError(error)
        ctl.events.record("held" if hold else "released", job["id"], by=caller.user)
        ctl.wake()
        return {"job_id": job["id"]}

    @api.expose("update_node")
    async def update_node(body, caller: Caller):
        """Admins: drain a node (running jobs finish, nothing new starts), resume it, or set it down."""
        if not caller.admin:
            raise RequestError("Access/permission denied: only administrators may change node state")
        name = _expect(body, "name", str, required=True)
        state = _expect(body, "state", str, required=True).lower()
        reason = _expect(body, "reason", str)
        target = {"drain": "drain", "resume": "up", "up": "up", "idle": "up", "down": "down"}.get(state)
        if target is None:
            raise RequestError(f"Invalid node state specified: {state} (use drain, resume or down)")
        if target != "up" and not reason:
            raise RequestError(f"A reason is required to set node {name} {target} (reason=...)")
        if not await ctl.db(repo().set_node_state, name, target, reason and f"{reason} [{caller.user}]"):
            raise RequestError(f"Invalid node name specified: {name}")
        ctl.events.record("node_state", None, name, state=target, by=caller.user, reason=reason)
        ctl.wake()
        return {"name": name, "state": target}

    @api.expose("events")
    async def events(body, caller: Caller):
        """A job's history (its owner and admins), or a node's (anyone, as hinfo shows nodes)."""
        job_id = _expect(body, "job_id", int)
        node = _expect(body, "node", str)
        limit = _expect(body, "limit", int)
        if (job_id is None) == (node is None):
            raise RequestError("give a job id or a node name (one of them)")
        if limit is not None and limit <= 0:
            raise RequestError("limit must be positive")
        if job_id is not None:
            job = await own_job(body, caller)  # the job may be gone from the table: say so
            job_id = job["id"]
        await ctl.flush_events()
        rows = await ctl.db(read_events, repo().engine, job_id=job_id, node=node, limit=limit)
        if node is not None and not rows and node not in {n["name"] for n in await ctl.db(repo().nodes)}:
            raise RequestError(f"Node {node} not found")  # a removed node's history is still shown
        return {"now": time.time(), "events": rows}

    membership.expose(api, ctl)  # node_add, node_remove
    api.add("hold", lambda body, caller: set_hold(body, caller, True))
    api.add("release", lambda body, caller: set_hold(body, caller, False))

    return api
