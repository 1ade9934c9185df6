"""The controller's client API: what hsubmit, hqueue, hcancel, hinfo, hacct and hcontrol call.

The caller's identity is the uid the kernel reports for the socket peer (SO_PEERCRED); nothing
the client sends can change it. Bad input is answered with a specific error and changes nothing.
"""
from __future__ import annotations

import asyncio
import functools
import signal as signals
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Mapping

from ..config import PRIORITY_CLASSES
from ..core.dependency import parse_dependency
from ..core.envfilter import submitted_env
from ..core.jobids import JobRef, job_label, parse_array
from ..core.jobscript import MAX_DEPENDENCY_TEXT, JobScriptError, parse_submission, split_command_line
from ..core.model import JobSpec, attained_service
from ..core.resources import could_ever_fit
from ..core.states import FINAL_STATES, JobState, parse_state
from ..core.timefmt import format_limit, parse_time_limit
from ..core.usertext import TextError, checked
from ..store.events import read_events
from ..store.repository import LISTING_COLUMNS, spec_size
from ..store.views import probe_view
from ..transport.rpc import RequestError, RpcTable
from . import membership
from .access import Caller, deny, may_act_on
from .outputcheck import RecentlyWritable, outputs_problem
from .partitions import PartitionRefused, admit, groups_of
from .requests import expect, int_list, str_list, task_list
from .submitrate import OverRate, SubmitRate
from .telemetry_view import job_telemetry, nodes_telemetry

if TYPE_CHECKING:
    from .service import Controller

NOT_FINAL = [s.value for s in JobState if s not in FINAL_STATES and s not in (JobState.PREEMPTED,
                                                                                JobState.REQUEUED)]


# Rows of one reply (jobs, acct; events): it is built and encoded on the event loop, so a listing of
# half a million jobs took 20 s and 3 GB there. Clients page with "after" (the last id they got).
PAGE_ROWS = 10_000
PARSE_ON_LOOP = 64 * 1024  # a script under this is parsed on the event loop (microseconds)
MAX_EVENTS = 10_000


# What a listing may ask for (`fields`): the job table's columns but the spec, and what _public adds.
# Job listing keys that are not columns: computed by _public, from live telemetry, or by the store.
TELEMETRY_FIELDS = frozenset({"gpu_util", "gpu_mem_used_mb", "cpu_pct", "idle"})
DERIVED_FIELDS = frozenset({"code", "attained_now", "level", "gpu_share_mb"}) | TELEMETRY_FIELDS
LISTING_FIELDS = frozenset(c.name for c in LISTING_COLUMNS) | DERIVED_FIELDS
_PUBLIC_NEEDS = ("state", "attained_gpu_seconds", "start_time", "nodes", "gpus_per_node")
_TELEMETRY_NEEDS = ("id", "attempts")  # with_telemetry: the live run's key
_SHARE_NEEDS = ("id", "gpu_fraction", "gpu_mem_mb")  # the store's gpu_share_mb


def _public(job: dict, mlfq, now: float) -> dict:
    out = dict(job)
    out.pop("spec", None)
    state = JobState(job["state"])
    out["code"] = state.code
    rate = job["nodes"] * job["gpus_per_node"] or job.get("gpu_charge") or 0.0  # sharing: its share
    attained = attained_service(job["attained_gpu_seconds"], rate,
                                job["start_time"] if state.holds_resources and job["start_time"] else None, now)
    out["attained_now"] = attained
    out["level"] = mlfq.level_of(attained)
    return out


def build_api(ctl: Controller) -> RpcTable:
    api = RpcTable()
    writable = RecentlyWritable()
    rate = SubmitRate(ctl.cfg.access.submit_rate, ctl.cfg.access.submit_burst, time.monotonic)
    repo = lambda: ctl.repo  # noqa: E731  (the store opens after the table is built)
    mlfq = ctl.cfg.scheduler.mlfq

    def public(job: dict) -> dict:
        return _public(job, mlfq, time.time())

    async def own_job(body: Any, caller: Caller, action: str, *, operators: bool = True) -> dict:
        """The job (or array task) named in the body, if the caller may `action` it (owner or
        admin, and operators unless `operators` is false)."""
        job_id = await task_job_id(body)
        job = await ctl.db(repo().job, job_id)
        if job is None:
            raise RequestError(f"Invalid job id specified: {job_id}")
        if not may_act_on(caller, job, operators=operators):
            raise deny(caller, f"{action} of job {job_id} (owned by {job['user']})")
        return job

    @api.expose("ping")
    async def ping(body, caller: Caller):
        return {"time": time.time(), "user": caller.user, "uid": caller.uid, "admin": caller.admin,
                "role": caller.role}

    @api.expose("submit")
    async def submit(body, caller: Caller):
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
        too_big = script_too_big(script, option_args, script_args)
        if too_big:
            raise RequestError(too_big)
        await take_rate(caller, 1)  # before the parse: a refused submission costs its parse too
        parse = functools.partial(parse_submission, script, option_args, cwd=cwd, env=env, script_args=script_args,
                                  script_name=script_name, now=time.time(), max_array_size=ctl.cfg.max_array_size)
        try:
            # A big script takes a worker thread (pure Python: the loop still runs every few ms):
            # a 4 MiB one costs ~0.7 s to scan, which on the loop held every other user.
            sub = parse() if len(script or "") < PARSE_ON_LOOP else await asyncio.to_thread(parse)
        except (JobScriptError, ValueError) as exc:
            raise RequestError(str(exc)) from None
        spec = replace(sub.spec, umask=umask)
        too_big = env_too_big(spec.environment)  # what --export keeps of it, as it is stored
        if too_big:
            raise RequestError(too_big)
        if spec.grace > ctl.cfg.max_grace:  # its end would wait that long after a cancel or preemption
            raise RequestError(f"Batch job submission failed: --grace={spec.grace} is above this cluster's "
                               f"max_grace ({ctl.cfg.max_grace} s)")
        allowed = PRIORITY_CLASSES.index(ctl.cfg.scheduler.max_user_priority)
        if not caller.admin and PRIORITY_CLASSES.index(spec.priority) < allowed:
            raise deny(caller, f"--priority={spec.priority} is above what users may ask for "
                               f"({ctl.cfg.scheduler.max_user_priority})")
        try:
            partition, spec = admit(spec, ctl.cfg, user=caller.user, groups=groups_of(caller.user, caller.gid),
                                    admin=caller.admin)
        except PartitionRefused as exc:
            raise RequestError(str(exc)) from None
        outputs = (spec.stdout, spec.stderr, spec.workdir, caller.user, caller.uid, caller.gid)
        if not writable.fresh(outputs, time.monotonic()):
            problem = await asyncio.to_thread(outputs_problem, *outputs)  # a hung mount must not stall the loop
            if problem:
                raise RequestError(problem)
            writable.note(outputs, time.monotonic())
        view = probe_view(spec, job_id=0, user=caller.user, partition=partition, now=0)
        # The last pass's nodes say yes for almost every job without a query; a no is checked
        # against the store before it refuses (a node may have joined since that pass).
        if not ctl.inventory or not could_ever_fit(view, ctl.inventory):
            known = ctl.note_inventory(await ctl.db(repo().load_nodes))
            fit = could_ever_fit(view, known)
            if known and not fit:
                raise RequestError(f"Requested node configuration is not available: {fit.reason}")
        if spec.dependency:
            await checked_dependency(spec.dependency)
        account = ctl.tenancy.account_for(caller, spec.account)
        spec = replace(spec, account=account)
        if sub.test_only:
            return {"test_only": await would_start(spec, partition, caller)}
        tasks = len(parse_array(spec.array, None).indices) if spec.array else 1
        if tasks > 1:
            await take_rate(caller, tasks - 1)  # an array's other tasks

        def record() -> int:  # on the store thread: no other submission counts in between
            ctl.tenancy.check_submission(repo().engine, caller, account, tasks, spec_size(spec.to_wire()))
            return repo().submit(spec, user=caller.user, uid=caller.uid, gid=caller.gid, partition=partition,
                                 now=time.time(), account=account)
        job_id = await ctl.db(record)
        ctl.events.record("submitted", job_id, user=caller.user, partition=partition, nodes=spec.nodes,
                          gpus_per_node=spec.gpus_per_node, priority=spec.priority, hold=spec.hold or None,
                          array=spec.array, account=account)
        if spec.reason_at_submission is not None:
            # It cannot start, and its reason is stored with it: a pass would only load the whole
            # queue again (a burst of held submissions woke one per 50 ms, each reading them all).
            ctl.events.record("waiting", job_id, reason=spec.reason_at_submission)
        else:
            ctl.wake()
        return {"job_id": job_id, "parsable": sub.parsable, "wait": sub.wait}  # directives may set them

    async def take_rate(caller: Caller, jobs: int) -> None:
        try:
            wait = rate.take(caller.uid, jobs)
        except OverRate as exc:
            raise RequestError(str(exc)) from None
        if wait:
            await asyncio.sleep(wait)

    def script_too_big(script: str | None, option_args: list[str], script_args: list[str]) -> str | None:
        """Why a submission's script is refused for its size, before it is parsed (None: it is not)."""
        size = sum(len(a.encode()) for a in (script or "", *option_args, *script_args))
        if size > ctl.cfg.max_script_bytes:
            return (f"Batch job submission failed: the batch script and its arguments are too large "
                    f"({size} bytes; at most {ctl.cfg.max_script_bytes}, the controller's max_script_bytes)")
        return None

    def env_too_big(env: Mapping[str, str]) -> str | None:
        size = sum(len(k.encode()) + len(v.encode()) + 2 for k, v in env.items())
        if size > ctl.cfg.max_env_bytes:
            return (f"Batch job submission failed: the job's environment is too large ({size} bytes in "
                    f"{len(env)} variables; at most {ctl.cfg.max_env_bytes}, the controller's max_env_bytes; "
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

    async def would_start(spec, partition: str, caller: Caller) -> dict:
        """sbatch --test-only: run the policy on the current state with this job added, change nothing."""
        now = time.time()
        snapshot = await ctl.db(repo().load_snapshot, now)
        # the job as it would be stored: begin time, dependency and time limit included
        probe = await ctl.db(repo().probe, spec, user=caller.user, partition=partition, now=now,
                             account=spec.account or "default")
        plan = await ctl.decide(replace(snapshot, jobs=snapshot.jobs + (probe,)))
        for action in plan.actions:
            if action.job_id == -1 and hasattr(action, "placement"):
                return {"start": "now", "nodes": list(action.placement.nodes), "partition": partition}
            if action.job_id == -1:
                return {"start": None, "reason": action.reason, "partition": partition}
        return {"start": None, "reason": "Priority", "partition": partition}

    @api.expose("jobs")
    async def jobs(body, caller: Caller):
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
            need = (set(fields) - DERIVED_FIELDS) | set(_PUBLIC_NEEDS) | set(_SHARE_NEEDS)  # a share's charge
            telemetry = bool(TELEMETRY_FIELDS & set(fields))
            if telemetry:
                need.update(_TELEMETRY_NEEDS)
            if "gpu_share_mb" in fields:
                need.update(_SHARE_NEEDS)
            columns = sorted(need)
        after, limit = page(body)
        rows = await ctl.db(repo().jobs, ids=int_list(body, "ids"), states=states,
                            users=str_list(body, "users"), names=str_list(body, "names"),
                            partitions=str_list(body, "partitions"), columns=columns, tasks=task_list(body),
                            after_id=after, limit=limit + 1)
        more = {"more": len(rows) > limit, "next": rows[limit - 1]["id"] if len(rows) > limit else None}
        listed = map(public, rows[:limit])
        if telemetry:
            listed = map(with_telemetry, listed)
        if fields is None:
            return {"now": time.time(), "jobs": list(listed), **more}
        return {"now": time.time(), "jobs": [{k: p.get(k) for k in fields} for p in listed], **more}

    def page(body: Any) -> tuple[int | None, int]:
        """A listing's page: ids after `after`, at most `limit` (PAGE_ROWS at most) rows; the reply
        says `more` and the `next` after to ask with (cli.common.call_pages)."""
        after, limit = expect(body, "after", int), expect(body, "limit", int, default=PAGE_ROWS)
        if limit <= 0:
            raise RequestError("limit must be positive")
        return after, min(limit, PAGE_ROWS)

    def with_telemetry(job: dict) -> dict:
        """A live run's latest GPU utilization and memory, and its idle flag (hqueue -o %g %G %I)."""
        if JobState(job["state"]).holds_resources and job.get("attempts"):
            job.update(ctl.telemetry.run_fields((job["id"], job["attempts"] - 1)))
        return job

    @api.expose("telemetry")
    async def telemetry(body, caller: Caller):
        """hstat and hinfo --gpus: each node's GPUs with their latest reading and the job holding
        them; with job_id, that job's runs (rollups) and its recent history."""
        job_id = expect(body, "job_id", int)
        if job_id is not None:
            job = await ctl.db(repo().job, job_id)
            if job is None:
                raise RequestError(f"Invalid job id specified: {job_id}")
            runs = await ctl.db(repo().runs, job_ids=[job_id])
            return {"now": time.time(), **job_telemetry(ctl.telemetry, with_telemetry(public(job)), runs)}
        rows = await ctl.db(repo().jobs, states=[s.value for s in JobState if s.holds_resources])
        return {"now": time.time(), **nodes_telemetry(ctl.telemetry, await ctl.db(repo().nodes),
                                                      await ctl.db(repo().load_nodes), await ctl.db(repo().live_ranks),
                                                      [with_telemetry(public(j)) for j in rows],
                                                      {n: link.connected for n, link in ctl.links.items()})}

    @api.expose("show_job")
    async def show_job(body, caller: Caller):
        job_id = await task_job_id(body)
        job = await ctl.db(repo().job, job_id)
        if job is None:
            raise RequestError(f"Invalid job id specified: {job_id}")
        out = public(job)
        # A job's arguments may hold secrets (--api-key=...), as its environment and script may:
        # its owner and admins see them, nobody else.
        hidden = ("environment", "script") if may_act_on(caller, job, operators=False) else (
            "environment", "script", "script_args")
        out["spec"] = {k: v for k, v in job["spec"].items() if k not in hidden}
        out["runs"] = await ctl.db(repo().runs, job_ids=[job_id])
        if job["state"] == JobState.PENDING.value and not job["hold"]:
            out["waiting"] = await ctl.db(repo().why_waiting, job_id)
        return {"now": time.time(), "job": out}

    async def task_job_id(body: Any) -> int:
        """'job_id', or 'array_job_id' with 'task_id' (hcontrol ... 12_4): the job id of that task."""
        task = expect(body, "task_id", int)
        if task is None:
            return expect(body, "job_id", int, required=True)
        array_id = expect(body, "job_id", int, required=True)
        rows = await ctl.db(repo().jobs, tasks=[(array_id, task)])
        if not rows:
            raise RequestError(f"Invalid job id specified: {array_id}_{task}")
        return rows[0]["id"]

    @api.expose("cancel")
    async def cancel(body, caller: Caller):
        ids = int_list(body, "ids")
        tasks = task_list(body)
        users = str_list(body, "users")
        states = str_list(body, "states")
        names = str_list(body, "names")
        partitions = str_list(body, "partitions")
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
        rows = await ctl.db(repo().jobs, ids=ids, users=users, states=states, names=names, partitions=partitions,
                            tasks=tasks)
        found = {j["id"] for j in rows} | {j["array_job_id"] for j in rows}
        found_tasks = {(j["array_job_id"], j["array_task_id"]) for j in rows}
        missing_ids = sorted(set(ids or ()) - found)
        missing_tasks = [t for t in sorted(set(tasks or ())) if t not in found_tasks]
        known_ids, known_tasks = set(), set()
        if missing_ids or missing_tasks:  # ended, or never were: one query for all of them
            for j in await ctl.db(repo().jobs, ids=missing_ids or None, tasks=missing_tasks or None,
                                  columns=["id", "array_job_id", "array_task_id"]):
                known_ids.update((j["id"], j["array_job_id"]))
                known_tasks.add((j["array_job_id"], j["array_task_id"]))
        for job_id, task in [(i, None) for i in missing_ids] + missing_tasks:
            label = str(JobRef(job_id, (task,) if task is not None else None))
            if (job_id in known_ids) if task is None else ((job_id, task) in known_tasks):
                errors.append(f"Kill job error on job id {label}: Job/step already completing or completed")
            else:
                errors.append(f"Invalid job id specified: {label}")
        done, pending = [], []
        what = "signal" if signum is not None else "cancel"
        for job in rows:
            if not may_act_on(caller, job, operators=False):
                refused.append(f"job {job_label(job)} (owned by {job['user']})")
                errors.append(f"Kill job error on job id {job_label(job)}: Access/permission denied: "
                              f"{what} of job {job_label(job)} (owned by {job['user']})")
                continue
            state = JobState(job["state"])
            if signum is not None:
                if state == JobState.PENDING:
                    errors.append(f"Signal job error on job id {job_label(job)}: job is pending")
                else:
                    await ctl.signal_job(job["id"], signum)
                    done.append(job["id"])
            elif state == JobState.PENDING:
                pending.append(job["id"])  # all in one transaction, below
            elif state.holds_resources:
                await ctl.db(repo().request_end, job["id"], "cancel", f"cancelled by {caller.uid}")
                ctl.events.record("cancel_requested", job["id"], by=caller.user, state=state.value)
                await ctl.end_job(job["id"], "cancel")
                done.append(job["id"])
        if pending:  # one that started meanwhile is no longer pending: left as it is, as before
            cancelled = set(await ctl.db(repo().cancel_pendings, pending, time.time(), caller.uid))
            for job_id in (j for j in pending if j in cancelled):
                ctl.events.record("cancel_requested", job_id, by=caller.user, state=JobState.PENDING.value)
                done.append(job_id)
        if refused:  # logged once per request, however many jobs it named
            deny(caller, f"{what} of {', '.join(refused[:5])}{f' and {len(refused) - 5} more' if len(refused) > 5 else ''}")
        ctl.wake()
        return {"done": done, "errors": errors}

    @api.expose("nodes")
    async def nodes(body, caller: Caller):
        return {"now": time.time(), "nodes": await ctl.db(repo().nodes),
                "links": {name: link.last_error for name, link in ctl.links.items()},
                "partitions": [{"name": p, "default": p == ctl.cfg.default_partition,
                                "max_time": ctl.cfg.partition(p).max_time} for p in ctl.cfg.partitions]}

    @api.expose("acct")
    async def acct(body, caller: Caller):
        ids = int_list(body, "ids")
        users = str_list(body, "users")
        tasks = task_list(body)
        since = expect(body, "since", (int, float))  # jobs that had not ended before then (hacct -S)
        after, limit = page(body)
        job_rows = await ctl.db(repo().jobs, ids=ids, users=users, tasks=tasks, after_id=after, limit=limit + 1,
                                ended_since=since)
        more = {"more": len(job_rows) > limit, "next": job_rows[limit - 1]["id"] if len(job_rows) > limit else None}
        job_rows = job_rows[:limit]
        run_rows = await ctl.db(repo().runs, of_jobs=[j["id"] for j in job_rows]) if job_rows else []
        return {"now": time.time(), "runs": run_rows, "jobs": [public(j) for j in job_rows], **more}

    @api.expose("requeue")
    async def requeue(body, caller: Caller):
        """Checkpoint and requeue now (hcontrol requeue): the run ends as REQUEUED, the job waits again."""
        job = await own_job(body, caller, "requeue")
        if not job["preemptible"]:
            raise RequestError(f"Requeue of job {job['id']} refused: it was submitted with --no-requeue")
        if job["state"] != JobState.RUNNING.value:
            raise RequestError(f"Job {job['id']} is {job['state']}; only a running job can be requeued")
        await ctl.preempt(job["id"], "requeue", f"requeued by {caller.user}", by=caller.user)
        return {"job_id": job["id"]}

    @api.expose("preempt")
    async def preempt(body, caller: Caller):
        """Operators and admins: checkpoint a running job and put it back in the queue, as the scheduler would."""
        if not caller.operator:
            raise deny(caller, "only operators and administrators may preempt jobs")
        job = await own_job(body, caller, "preemption")
        if job["state"] != JobState.RUNNING.value:
            raise RequestError(f"Job {job['id']} is {job['state']}; only a running job can be preempted")
        if not job["preemptible"]:
            raise RequestError(f"Job {job['id']} was submitted with --no-requeue and is never preempted")
        await ctl.preempt(job["id"], "preempt", f"preempted by administrator {caller.user}", by=caller.user)
        return {"job_id": job["id"]}

    async def set_hold(body, caller: Caller, hold: bool):
        job = await own_job(body, caller, "hold" if hold else "release")
        error = await ctl.db(repo().set_hold, job["id"], hold, admin=caller.operator and job["user"] != caller.user)
        if error:
            raise RequestError(error)
        ctl.events.record("held" if hold else "released", job["id"], by=caller.user)
        ctl.wake()
        return {"job_id": job["id"]}

    @api.expose("update_node")
    async def update_node(body, caller: Caller):
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
        if reason:
            try:  # every user sees it (hinfo -R, hcontrol show node)
                checked("the reason", reason, max_len=150)
            except TextError as exc:
                raise RequestError(str(exc)) from None
        if not await ctl.db(repo().set_node_state, name, target, reason and f"{reason} [{caller.user}]"):
            raise RequestError(f"Invalid node name specified: {name}")
        ctl.events.record("node_state", None, name, state=target, by=caller.user, reason=reason)
        ctl.wake()
        return {"name": name, "state": target}

    @api.expose("requeuehold")
    async def requeuehold(body, caller: Caller):
        """Requeue a running job and hold it (a pending job is just held): JobHeldAdmin when an
        administrator does it to another's job, else JobHeldUser."""
        job = await own_job(body, caller, "requeue")
        if job["state"] == JobState.PENDING.value:
            return await set_hold(body, caller, True)
        if not job["preemptible"]:
            raise RequestError(f"Requeue of job {job['id']} refused: it was submitted with --no-requeue")
        if job["state"] != JobState.RUNNING.value:
            raise RequestError(f"Job {job['id']} is {job['state']}; only a running or pending job can be requeued held")
        admin = caller.admin and job["user"] != caller.user
        if not await ctl.db(repo().hold_running, job["id"], admin=admin):
            raise RequestError(f"Job {job['id']} is no longer running")
        await ctl.preempt(job["id"], "requeue", f"requeued and held by {caller.user}")
        return {"job_id": job["id"]}

    @api.expose("update_job")
    async def update_job(body, caller: Caller):
        """scontrol update JobId=N TimeLimit= Partition= Dependency= (pending jobs; owner or admin;
        a user may only lower the time limit)."""
        job = await own_job(body, caller, "update", operators=False)
        fields = expect(body, "fields", dict, required=True)
        if not fields or not all(isinstance(k, str) and isinstance(v, str) for k, v in fields.items()):
            raise RequestError("field 'fields' must map job fields to values")
        changes: dict[str, Any] = {}
        for key, value in fields.items():
            if key.lower() == "timelimit":
                try:
                    limit = parse_time_limit(value)
                except ValueError as exc:
                    raise RequestError(f"Invalid TimeLimit={value}: {exc}") from None
                old = job["time_limit"]
                if not caller.admin and old is not None and (limit is None or limit > old):
                    raise RequestError(f"Access/permission denied: only an administrator may raise the time limit "
                                       f"of job {job['id']} (from {format_limit(old)} to {format_limit(limit)})")
                changes["time_limit"] = limit
            elif key.lower() == "partition":
                probe = JobSpec.from_wire({**job["spec"], "partition": value,
                                           "time_limit": changes.get("time_limit", job["time_limit"])})
                try:
                    changes["partition"], _ = admit(probe, ctl.cfg, user=job["user"],
                                                    groups=groups_of(job["user"], job["gid"]), admin=caller.admin)
                except (PartitionRefused, ValueError) as exc:
                    raise RequestError(str(exc)) from None
            elif key.lower() == "dependency":
                changes["dependency"] = await checked_dependency(value) if value else None
                own = {job["id"], job.get("array_job_id")}
                if value and any(j in own for j, _t in parse_dependency(value).targets):
                    raise RequestError(f"Job dependency problem: job {job['id']} cannot depend on itself or its array")
            else:
                raise RequestError(f"Update of job {job['id']} failed: unknown field {key} "
                                   f"(TimeLimit, Partition and Dependency can be changed)")
        error = await ctl.db(repo().update_pending, job["id"], changes)
        if error:
            raise RequestError(error)
        ctl.wake()
        return {"job_id": job["id"]}

    async def checked_dependency(text: str) -> str:
        if len(text) > MAX_DEPENDENCY_TEXT:  # before the parse: its cost grows with the text
            raise RequestError(f"invalid dependency specification: too long (at most {MAX_DEPENDENCY_TEXT} characters)")
        try:
            dep = parse_dependency(text)
        except ValueError as exc:
            raise RequestError(f"invalid dependency specification: {exc}") from None
        if len(dep.text) > 1000:
            raise RequestError("invalid dependency specification: too long (at most 1000 characters)")
        missing = await ctl.db(repo().missing_targets, dep.targets)
        if missing:
            names = ", ".join(str(JobRef(j, (t,) if t is not None else None)) for j, t in missing)
            raise RequestError(f"Job dependency problem: no such job {names}")
        return dep.text
    @api.expose("update_limits")
    async def update_limits(body, caller: Caller):
        """Admins: hcontrol update Account=NAME / User=NAME with MaxGPUs, MaxPending, MaxJobs, Shares."""
        kind = expect(body, "kind", str, required=True)
        name = expect(body, "name", str, required=True)
        if kind not in ("account", "user") or not name or len(name) > 64:
            raise RequestError("update_limits needs kind account or user and a name (at most 64 characters)")
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
        result = await ctl.db(ctl.tenancy.update, repo().engine, caller, kind, name, values)
        ctl.wake()
        return result

    @api.expose("accounts")
    async def accounts(body, caller: Caller):
        return {"accounts": await ctl.db(ctl.tenancy.listing, repo().engine),
                "mine": ctl.tenancy.accounts_of(caller)}

    @api.expose("shares")
    async def shares(body, caller: Caller):
        """hshare: the fair-share tree, like sshare -a."""
        rows = await ctl.db(ctl.tenancy.share_rows, repo().engine, time.time())
        return {"half_life": ctl.cfg.fairshare.half_life, "enabled": ctl.cfg.fairshare.enabled,
                "rows": [vars(r) for r in rows]}


    @api.expose("events")
    async def events(body, caller: Caller):
        """A job's history (its owner and admins), or a node's (anyone, as hinfo shows nodes)."""
        job_id = expect(body, "job_id", int)
        node = expect(body, "node", str)
        limit = expect(body, "limit", int)
        if (job_id is None) == (node is None):
            raise RequestError("give a job id or a node name (one of them)")
        if limit is not None and limit <= 0:
            raise RequestError("limit must be positive")
        limit = min(limit or MAX_EVENTS, MAX_EVENTS)  # the newest; a reply is built on the event loop
        if job_id is not None:
            job = await own_job(body, caller, "the history")  # the job may be gone from the table: say so
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
