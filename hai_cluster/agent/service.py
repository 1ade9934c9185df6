"""The agent's RPC methods. Each one checks its body completely before touching anything: the
agent is root, and a malformed request must end as a RequestError, never as a half-done action.
"""
from __future__ import annotations

import logging
import pwd
import socket
import time
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from ..transport.rpc import RequestError, RpcTable, refusing
from .gpushare import ShareError
from .fencing import EpochGate
from .runs import RunError
from ..protocol.runspec import TERMINATE_REASONS, RunSpec, SpecError, check_keys, nonneg_int, valid_signal

if TYPE_CHECKING:
    from .daemon import Agent

log = logging.getLogger(__name__)

PROTOCOL = 1


def _empty(method: str, body: Any) -> None:
    if body is not None and body != {}:
        check_keys(f"{method} body", body, ())


def _run_key(method: str, body: Any, *more: str) -> tuple[tuple[int, int], dict]:
    check_keys(f"{method} body", body, ("job_id", "attempt", *more))
    return (nonneg_int("job_id", body["job_id"]), nonneg_int("attempt", body["attempt"])), body


def check_user(agent: "Agent", spec: RunSpec) -> None:
    node = agent.cfg.name
    if spec.uid == 0 and not agent.cfg.allow_root_jobs:
        raise RequestError(f"refusing to run job {spec.job_id} as uid 0 (root): root jobs are disabled "
                           f"on node {node} (set agent.allow_root_jobs = true to allow them)")
    try:
        pw = pwd.getpwuid(spec.uid)
    except KeyError:
        raise RequestError(f"uid {spec.uid} does not exist on node {node}") from None
    if pw.pw_name != spec.user:
        raise RequestError(f"uid {spec.uid} is user {pw.pw_name!r} on node {node}, not {spec.user!r}")


IDLE_NOTICE_KEYS = ("idle_for", "threshold", "window", "grace", "action", "time", "message")


def check_idle_notice(notice: Any) -> dict:
    """The idle notice exactly as the controller sends it: numbers, a known action, a short message."""
    check_keys("idle_notice.notice", notice, IDLE_NOTICE_KEYS)
    for k in ("idle_for", "threshold", "window", "grace", "time"):
        v = notice[k]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1e11:
            raise SpecError(f"idle_notice.notice.{k} must be a number of at least 0")
    if notice["action"] not in ("cancel", "requeue"):
        raise SpecError(f"idle_notice.notice.action must be cancel or requeue, got {notice['action']!r}")
    if not isinstance(notice["message"], str) or len(notice["message"]) > 500:
        raise SpecError("idle_notice.notice.message must be a string of at most 500 characters")
    return notice


def build_table(agent: "Agent") -> RpcTable:
    table = RpcTable()
    runs = agent.runs

    async def hello(body: Any, ctx: Any) -> dict:
        check_keys("hello body", body, ("controller",))
        if not isinstance(body["controller"], str):
            raise SpecError("hello.controller must be a string")
        log.info("hello from controller %r (%s)", body["controller"], ctx)
        agent.hello_from(str(ctx))
        return {"node": agent.cfg.name, "hostname": socket.gethostname(), "protocol": PROTOCOL,
                "cpus": agent.cpus, "mem_mb": agent.mem_mb, "gpu_backend": agent.gpu_backend,
                "features": list(agent.cfg.features),
                "gpus": [asdict(g) for g in agent.gpus], "runs": runs.statuses(),
                "health": agent.health.current.to_wire() if agent.health.current else None,
                **agent.isolation.hello()}

    async def start_run(body: Any, ctx: Any) -> dict:
        check_keys("start_run body", body, ("spec",))
        spec = RunSpec.from_wire(body["spec"])
        check_user(agent, spec)
        log.info("start_run job %s.%s rank %d as %s (uid %d), runtime %s", spec.job_id, spec.attempt,
                 spec.rank, spec.user, spec.uid, agent.isolation.runtime_for(spec))
        # a fractional GPU's run is completed by the shares first: its MPS daemon, its limits
        prepare = agent.shares.prepare if spec.gpu_share is not None else None
        try:
            started, status = await runs.start(spec, prepare)
        except ShareError as exc:
            raise RequestError(f"job {spec.job_id}: {exc}") from None
        log.info("job %s.%s: %s, state %s%s", spec.job_id, spec.attempt,
                 "started" if started else "already known", status.state,
                 f" ({status.reason}: {status.message})" if status.reason else "")
        return {"started": started, "status": status.to_wire()}

    async def terminate_run(body: Any, ctx: Any) -> dict:
        key, body = _run_key("terminate_run", body, "reason")
        if body["reason"] not in TERMINATE_REASONS:
            raise SpecError(f"terminate_run.reason must be one of {', '.join(TERMINATE_REASONS)}, "
                            f"got {body['reason']!r}")
        found = runs.terminate(key, body["reason"])
        log.info("terminate_run job %s.%s (%s): %s", *key, body["reason"], "found" if found else "unknown")
        return {"found": found}

    async def signal_run(body: Any, ctx: Any) -> dict:
        key, body = _run_key("signal_run", body, "signal")
        sig = valid_signal("signal_run.signal", body["signal"])
        delivered = runs.signal(key, sig)
        log.info("signal_run job %s.%s signal %d: %s", *key, sig, "delivered" if delivered else "not delivered")
        return {"delivered": delivered}

    async def idle_notice(body: Any, ctx: Any) -> dict:
        """The controller's idle warning for a run (controller/reclaim.py): written into its control
        dir, or taken away (notice null) once its GPUs are busy again."""
        key, body = _run_key("idle_notice", body, "notice")
        notice = body["notice"]
        if notice is not None:
            notice = check_idle_notice(notice)
        found = runs.idle_notice(key, notice)
        log.info("idle_notice job %s.%s: %s %s", *key, "written" if notice else "cleared",
                 "" if found else "(no such live run)")
        return {"found": found}

    async def list_runs(body: Any, ctx: Any) -> dict:
        _empty("list_runs", body)
        return {"runs": runs.statuses()}

    async def forget_run(body: Any, ctx: Any) -> dict:
        key, _ = _run_key("forget_run", body)
        forgotten = runs.forget(key)
        if forgotten:
            log.info("forgot job %s.%s", *key)
        return {"forgotten": forgotten}

    async def ping(body: Any, ctx: Any) -> dict:
        _empty("ping", body)
        return {"time": time.time()}

    async def step_start(body: Any, ctx: Any) -> dict:
        return await agent.steps.start(body)

    async def step_signal(body: Any, ctx: Any) -> dict:
        return await agent.steps.signal(body)

    async def step_output(body: Any, ctx: Any) -> dict:
        return await agent.steps.deliver("output", body)

    async def step_exit(body: Any, ctx: Any) -> dict:
        return await agent.steps.deliver("exit", body)

    async def step_input(body: Any, ctx: Any) -> dict:
        return await agent.steps.to_server("input", body)

    async def step_resize(body: Any, ctx: Any) -> dict:
        return await agent.steps.to_server("resize", body)

    async def step_release(body: Any, ctx: Any) -> dict:
        return await agent.steps.to_server("release", body)

    async def step_tee(body: Any, ctx: Any) -> dict:
        return await agent.steps.tee(body)

    async def adopt(body: Any, ctx: Any) -> dict:
        # sshd's PAM program (adopt_pam.py) on this node, not the controller: no epoch
        return agent.adopter.adopt(body, ctx)

    async def output_follow(body: Any, ctx: Any) -> dict:
        return await agent.follows.start(body)

    async def output_rest(body: Any, ctx: Any) -> dict:
        return await agent.follows.rest(body)

    async def output_unfollow(body: Any, ctx: Any) -> dict:
        return agent.follows.stop(body)

    epochs = EpochGate(agent.cfg.spool)  # commands of a superseded controller are refused
    for fn in (hello, start_run, terminate_run, signal_run, idle_notice, list_runs, forget_run, ping,
               step_start, step_signal, step_output, step_exit, step_input, step_resize, step_release,
               step_tee, output_follow, output_rest, output_unfollow):
        table.add(fn.__name__, refusing(epochs.wrap(fn.__name__, fn), SpecError, RunError))
    table.add("adopt", refusing(adopt, SpecError))
    return table
