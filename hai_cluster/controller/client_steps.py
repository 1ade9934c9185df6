"""Interactive clients: salloc and srun outside a job, on the controller's own socket.

A client has no node agent, so the controller is its relay. Its connection (SO_PEERCRED, as
every request) holds what it created: the steps it runs (their tasks' output and ends are pushed
to it as events, steps.py `_to_client`) and the allocations it waits on. Only the job's owner
may start a step in an allocation, send it input, resize its terminal, signal it or release it.

    srun --step_create--> controller: the layout (core/steps.py), the step's id and record
         --step_launch--> controller --step_start--> every node's agent --> its step server
    step server --step_output/step_exit--> agent --> controller --push--> srun
    srun --step_input/step_resize--> controller --> the nodes of the tasks that read it
    srun --step_attach--> (after a controller restart) the step's output comes to it again
    salloc, srun --allocation--> the job's state (and, once it runs, the variables salloc sets)
         --release--> the first node's step server exits with the client's code: the job ends

Bounds: a step's output waits for the client to read it, one chunk per task (the task waits
behind it); a client's stdin is one chunk of 64 KiB per request, and the client sends the next
only once that one is in (the reply). When a client's connection closes, its running steps are
killed and recorded as cancelled, and the allocations it held are ended (as Slurm ends an
allocation whose salloc is gone); a controller that is stopping ends nothing.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ..core.hostlist import compress
from ..core.jobids import MAX_ID
from ..core.jobenv import allocation_variables
from ..core.states import FINAL_STATES, JobState
from ..core.steps import Allocation, StepError, StepIO, plan_step, step_end_state, step_name
from ..protocol import steps as wire
from ..protocol.runspec import SpecError, check_keys, nonneg_int, valid_signal
from ..transport.rpc import RequestError
from . import api_control, step_tee
from .access import Caller
from ..store import interactive as interactive_store
from .dispatch import rank_spec
from .errors import StoreUnavailable
from .nodes import AGENT_ERRORS
from .steps import CLIENT_ORIGIN, FORWARD_TIMEOUT, RETRY, LiveStep, _remote

if TYPE_CHECKING:
    from .apicontext import ApiContext
    from .service import Controller

log = logging.getLogger(__name__)

MAX_STEPS_PER_CLIENT = 64  # steps one connection runs at once
MAX_HELD_PER_CLIENT = 64  # allocations one connection holds
# A created step holds its command and environment until its launch: few of them per user, for
# a short while (srun launches at once), whatever number of connections the user opens.
MAX_UNLAUNCHED_PER_UID = 4
CLIENT_LAUNCH_WAIT = 10.0
RELEASE_TIMEOUT = 30.0
# An allocation no client has held for [interactive] abandoned_after seconds (after a controller
# restart its salloc or srun holds it again within seconds) is abandoned: its client died while
# the controller was down, or a lost reply left the job without one. It is ended, as Slurm ends
# an allocation whose salloc is gone. salloc --no-shell's (detached) are held by nobody on purpose.
SWEEP_EVERY = 30.0


def _id(name: str, value: Any) -> int:
    n = nonneg_int(name, value)
    if n > MAX_ID:
        raise RequestError(f"{name} must be a job or step id, got {n}")
    return n


@dataclass(eq=False)
class ClientLink:
    """One client connection (Caller.link): its steps and the allocations it holds."""
    conn: Any = None
    steps: set[tuple[int, int]] = field(default_factory=set)
    held: set[int] = field(default_factory=set)
    watches: list = field(default_factory=list)  # sattach: its attachment (step_tee.Watcher)
    follow: Any = None  # sattach JOB.batch: the output it follows (follow.Follower)


def _link(caller: Caller) -> ClientLink:
    if not isinstance(caller.link, ClientLink) or caller.link.conn is None:
        raise RequestError("this connection cannot run interactive steps")
    return caller.link


class ClientSteps:
    def __init__(self, ctl: "Controller") -> None:
        self.ctl = ctl
        self.api: "ApiContext | None" = None  # set by api.build_api: a gone client's jobs are cancelled through it
        self.holders: dict[int, set[ClientLink]] = {}  # job -> the connections holding it

    def _hold(self, link: ClientLink, job_id: int) -> None:
        link.held.add(job_id)
        self.holders.setdefault(job_id, set()).add(link)

    def _unhold(self, link: ClientLink, job_id: int) -> None:
        link.held.discard(job_id)
        holders = self.holders.get(job_id)
        if holders is not None:
            holders.discard(link)
            if not holders:
                del self.holders[job_id]

    def revoke(self, job_id: int, state: str) -> None:
        """The allocation is being ended (scancel): its holders hear it now, before its processes
        are signalled, as slurmctld tells salloc (salloc -K signals its command then)."""
        for link in list(self.holders.get(job_id, ())):
            if link.conn is not None and not link.conn.closed:
                asyncio.ensure_future(_push(link.conn, "revoked", {"job_id": job_id, "state": state}))

    def tell(self, job_id: int, text: str) -> None:
        """A line for the terminals of the allocation's holders (salloc, srun --pty): the
        controller's own words, e.g. an idle warning (controller/reclaim.py)."""
        for link in list(self.holders.get(job_id, ())):
            if link.conn is not None and not link.conn.closed:
                asyncio.ensure_future(_push(link.conn, "notice", {"job_id": job_id, "text": text}))

    @property
    def hub(self):
        return self.ctl.steps

    async def _allocation(self, job_id: int, caller: Caller, what: str):
        """The interactive job `job_id` of the caller (its owner only: it reaches the job's processes)."""
        job = await self.ctl.db(self.ctl.repo.job_record, job_id)
        if job is None or job.uid != caller.uid:
            raise RequestError(f"{what} for job {job_id}: Invalid job id specified")
        if not job.spec.interactive:
            raise RequestError(f"{what} for job {job_id}: it is a batch job; srun outside a job reaches only "
                               f"allocations of salloc or srun (run srun in the job's script)")
        return job

    # -- steps --

    async def create(self, body: Any, caller: Caller) -> dict:
        link = _link(caller)
        check_keys("step_create body", body, ("job_id", "request", "argv", "cwd", "env", "io"))
        job_id = _id("job_id", body["job_id"])
        request = wire.step_request(body["request"])
        argv, cwd, env = wire.command(body)
        io = wire.step_io(body["io"])
        size = sum(len(a.encode()) for a in argv) + sum(len(k.encode()) + len(v.encode()) + 2 for k, v in env.items())
        if size > self.ctl.cfg.max_env_bytes:
            raise RequestError(f"Unable to create step for job {job_id}: its command and environment are too large "
                               f"({size} bytes; at most {self.ctl.cfg.max_env_bytes}, the controller's max_env_bytes)")
        if len(link.steps) >= MAX_STEPS_PER_CLIENT:
            raise RequestError(f"Unable to create step for job {job_id}: this connection already runs "
                               f"{MAX_STEPS_PER_CLIENT} steps")
        if sum(1 for s in self.hub.live.values() if s.start is not None and s.uid == caller.uid) \
                >= MAX_UNLAUNCHED_PER_UID:
            raise RequestError(f"Unable to create step for job {job_id}: {MAX_UNLAUNCHED_PER_UID} steps of yours "
                               f"are created and not launched yet")
        job = await self._allocation(job_id, caller, "Unable to create step")
        if job.state != JobState.RUNNING.value or job.end_request is not None:
            raise RequestError(f"Unable to create step for job {job_id}: Job/step already completing or completed")
        ranks = {r.node: r for r in await self.ctl.db(self.ctl.repo.live_ranks, job_id=job_id)}
        nodes = tuple(job.nodelist_names)
        attempts = {r.attempt for r in ranks.values()}
        if any(n not in ranks for n in nodes) or len(attempts) != 1:
            raise RequestError(f"Unable to create step for job {job_id}: Job/step already completing or completed")
        attempt = attempts.pop()
        alloc = Allocation(job_id, nodes, job.spec.tasks_per_node, job.spec.cpus_per_task,
                           tuple(tuple(ranks[n].gpus) for n in nodes))
        try:
            layout, warnings = plan_step(alloc, request, 0)
        except StepError as exc:
            return {"refused": str(exc), "warnings": list(exc.warnings)}
        step_id = await self.ctl.db(self.ctl.repo.steps.begin, job_id, attempt, name=step_name(argv),
                                    nodes=layout.nodes, counts=layout.counts,
                                    cpus=layout.ntasks * layout.cpus_per_task, origin=CLIENT_ORIGIN, now=time.time())
        if step_id is None:
            raise RequestError(f"Unable to create step for job {job_id}: Job/step already completing or completed")
        layout = replace(layout, step_id=step_id)
        master = self.ctl.addresses.get(layout.nodes[0], layout.nodes[0])
        key = (job_id, step_id)
        live = LiveStep(CLIENT_ORIGIN, attempt, layout.nodes, _remote(layout.nodes, layout.counts, CLIENT_ORIGIN),
                        client=link, io=io, uid=caller.uid)
        live.start = {"job_id": job_id, "attempt": attempt, "layout": layout.to_wire(), "argv": argv, "cwd": cwd,
                      "env": env, "master_addr": master, "io": io.to_wire(), "client": True}
        self.hub.live[key] = live
        self._attach(link, key, live)
        self.ctl.events.record("step_start", job_id, CLIENT_ORIGIN, step=f"{job_id}.{step_id}", name=step_name(argv),
                               tasks=layout.ntasks, nodes=compress(list(layout.nodes)))
        asyncio.get_running_loop().call_later(CLIENT_LAUNCH_WAIT, lambda: self.ctl.spawn(self._unlaunched(key, live)))
        return {"layout": layout.to_wire(), "warnings": warnings, "master_addr": master}

    @staticmethod
    def _attach(link: ClientLink, key: tuple[int, int], live: LiveStep) -> None:
        live.client = link
        link.steps.add(key)
        link.conn.write_timeout = None  # its own step's output: it may read it as slowly as it likes
        live.attached.set()

    async def attach(self, body: Any, caller: Caller) -> dict:
        """A client that lost its connection (a controller restart) takes its running step again:
        the output that waited comes, its keys and window size go out again."""
        link = _link(caller)
        check_keys("step_attach body", body, ("job_id", "step_id", "io"))
        key = (_id("job_id", body["job_id"]), _id("step_id", body["step_id"]))
        io = wire.step_io(body["io"])
        job = await self._allocation(key[0], caller, "Attach")
        live = await self.hub._live(key) if job.state == JobState.RUNNING.value else None
        if live is None or live.origin != CLIENT_ORIGIN:
            raise RequestError(f"step {key[0]}.{key[1]} is not running")
        if len(link.steps) >= MAX_STEPS_PER_CLIENT:
            raise RequestError(f"this connection already runs {MAX_STEPS_PER_CLIENT} steps")
        old = live.client
        if old is not None and old is not link:
            old.steps.discard(key)  # the earlier connection lets go (its close no longer kills the step)
        live.io = io
        self._attach(link, key, live)
        return {"attached": True}

    async def _unlaunched(self, key: tuple[int, int], live: LiveStep) -> None:
        if self.hub.live.get(key) is live and live.start is not None:
            await self._end(key, live, None, 9, True)

    def _step(self, body: Any, caller: Caller, extra: tuple[str, ...] = ()) -> tuple[tuple[int, int], LiveStep]:
        check_keys("body", body, ("job_id", "step_id", *extra))
        key = (_id("job_id", body["job_id"]), _id("step_id", body["step_id"]))
        live = self.hub.live.get(key)
        if live is None or live.client is not _link(caller):
            raise RequestError(f"step {key[0]}.{key[1]} is not a running step of this srun")
        return key, live

    async def launch(self, body: Any, caller: Caller) -> dict:
        key, live = self._step(body, caller)
        if live.start is None:
            raise RequestError(f"step {key[0]}.{key[1]} is not waiting for its launch")
        try:
            return await self.hub.start_remote(key, live)
        except RequestError:
            caller.link.steps.discard(key)
            await self.ctl.db(self.ctl.repo.steps.end, key[0], live.attempt, key[1], origin=CLIENT_ORIGIN,
                              state=JobState.FAILED.value, exit_code=1, exit_signal=None, now=time.time())
            raise

    async def input(self, body: Any, caller: Caller) -> dict:
        """A chunk of the client's stdin to the tasks that read it (core.steps.StepIO)."""
        key, live = self._step(body, caller, ("data", "eof"))
        data, eof = wire.stdin_chunk(body)
        io = live.io or StepIO()
        if io.pty or io.input != "all":
            task = 0 if io.pty else io.input
            nodes = [live.remote[task]] if task in live.remote else []
        else:
            task, nodes = None, sorted(set(live.remote.values()))
        message = {"job_id": key[0], "attempt": live.attempt, "step_id": key[1], "task": task, "data": data,
                   "eof": eof}
        results = await asyncio.gather(*(self._to_node(n, "step_input", message) for n in nodes),
                                       return_exceptions=True)
        return {"reached": sum(r.get("reached", 0) for r in results if isinstance(r, dict))}

    async def _to_node(self, node: str, method: str, body: dict) -> Any:
        """A client's keys to a node: across a short break of its link (this controller just
        started, its agent restarts) tried again, as the tasks' output is the other way."""
        deadline = time.monotonic() + FORWARD_TIMEOUT
        while True:
            try:
                return await self.hub._call(node, method, body, FORWARD_TIMEOUT)
            except AGENT_ERRORS:
                if time.monotonic() >= deadline:
                    raise
            await asyncio.sleep(RETRY)

    async def resize(self, body: Any, caller: Caller) -> dict:
        key, live = self._step(body, caller, ("rows", "cols"))
        rows, cols = wire.window(body)
        node = live.remote.get(0)
        if live.io is None or not live.io.pty or node is None:
            return {"resized": False}
        try:
            return await self.hub._call(node, "step_resize", {"job_id": key[0], "attempt": live.attempt,
                                                              "step_id": key[1], "rows": rows, "cols": cols}, 10.0)
        except Exception as exc:  # noqa: BLE001 - a lost resize is no error of the client's
            log.debug("job %d: resize not delivered: %s", key[0], exc)
            return {"resized": False}

    async def signal(self, body: Any, caller: Caller) -> dict:
        key, live = self._step(body, caller, ("signal",))
        sig = valid_signal("signal", body["signal"])
        return {"signalled": await self.hub._signal_nodes(key[0], live.attempt, key[1], live.nodes, sig)}

    async def done(self, body: Any, caller: Caller) -> dict:
        """The client has every task's end (or gives up on them): the step's end is recorded."""
        key, live = self._step(body, caller, ("exit_code", "signal", "cancelled"))
        code = body["exit_code"]
        if code is not None and (not isinstance(code, int) or isinstance(code, bool) or not 0 <= code <= 255):
            raise RequestError("exit_code must be 0-255 or nil")
        sig = None if body["signal"] in (None, 0) else valid_signal("signal", body["signal"])
        if not isinstance(body["cancelled"], bool):
            raise RequestError("cancelled must be true or false")
        return {"recorded": await self._end(key, live, code, sig, body["cancelled"])}

    async def _end(self, key: tuple[int, int], live: LiveStep, code: int | None, sig: int | None,
                   cancelled: bool) -> bool:
        state = step_end_state(code, sig, cancelled)
        # the record first: a store that refuses it leaves the step routed, to be ended again
        ended = await self.ctl.db(self.ctl.repo.steps.end, key[0], live.attempt, key[1], origin=CLIENT_ORIGIN,
                                  state=state, exit_code=code, exit_signal=sig, now=time.time())
        if self.hub.live.get(key) is live:
            del self.hub.live[key]
        if live.client is not None:
            live.client.steps.discard(key)
        step_tee.ended(live, key, state, code, sig)
        if ended:
            self.ctl.events.record("step_end", key[0], CLIENT_ORIGIN, step=f"{key[0]}.{key[1]}", state=state,
                                   exit_code=f"{code or 0}:{sig or 0}")
        return ended

    # -- allocations --

    async def allocation(self, body: Any, caller: Caller) -> dict:
        """An interactive job's state for the client waiting on it (salloc, srun); with `hold`
        (the default) this connection holds it from now on (its close ends the job). With `env`,
        once it runs, the variables salloc sets."""
        link = _link(caller)
        check_keys("allocation body", body, ("job_id",), ("hold", "env"))
        hold, want_env = body.get("hold", True), body.get("env", False)
        if not isinstance(hold, bool) or not isinstance(want_env, bool):
            raise RequestError("hold and env must be true or false")
        job = await self._allocation(_id("job_id", body["job_id"]), caller, "Allocation")
        if hold and JobState(job.state) not in FINAL_STATES:
            if job.id not in link.held and len(link.held) >= MAX_HELD_PER_CLIENT:
                raise RequestError(f"this connection already holds {MAX_HELD_PER_CLIENT} allocations")
            self._hold(link, job.id)
        out = {"state": job.state, "reason": job.end_reason, "nodelist": job.nodelist_names,
               "exit_code": job.exit_code, "ending": job.end_request is not None}
        if job.state == JobState.RUNNING.value and want_env:
            ranks = sorted((r for r in await self.ctl.db(self.ctl.repo.live_ranks, job_id=job.id)),
                           key=lambda r: r.rank)
            if ranks:
                spec = rank_spec(job, ranks[0].attempt, 0, job.nodelist_names, ranks[0].gpus, self.ctl.addresses,
                                 cluster_name=self.ctl.cfg.cluster_name)
                out["env"] = allocation_variables(spec.environment)
        elif JobState(job.state) in FINAL_STATES or job.state == JobState.PENDING.value:
            row = await self.ctl.db(self.ctl.repo.job, job.id)
            out["reason"] = row.get("reason") if row else None
        return out

    async def release(self, body: Any, caller: Caller, ctx: "ApiContext") -> dict:
        """The client's command (or step) ended with `exit_code`: the allocation ends, COMPLETED or
        FAILED by it, as Slurm's salloc ends it. A pending one is cancelled; where the first node's
        step server cannot be told, the job is cancelled."""
        link = _link(caller)
        check_keys("release body", body, ("job_id", "exit_code"))
        job = await self._allocation(_id("job_id", body["job_id"]), caller, "Release")
        code = body["exit_code"]
        if not isinstance(code, int) or isinstance(code, bool) or not 0 <= code <= 255:
            raise RequestError("exit_code must be 0-255")
        self._unhold(link, job.id)
        if job.state == JobState.RUNNING.value and job.end_request is None:
            ranks = [r for r in await self.ctl.db(self.ctl.repo.live_ranks, job_id=job.id) if r.rank == 0]
            if ranks:
                try:
                    await self.hub._call(ranks[0].node, "step_release", {"job_id": job.id, "attempt": ranks[0].attempt,
                                                                        "exit_code": code}, RELEASE_TIMEOUT)
                    return {"released": "released"}
                except Exception as exc:  # noqa: BLE001 - any failure: the allocation is cancelled instead
                    log.warning("job %d: release through node %s failed (%s); cancelling it", job.id,
                                ranks[0].node, exc)
        if JobState(job.state) in FINAL_STATES:
            return {"released": "ended"}
        await api_control.cancel(ctx, {"ids": [job.id]}, caller)
        return {"released": "cancelled"}

    # -- a client that went away --

    async def sweep(self) -> None:
        """End the allocations nobody holds (abandoned_after); runs for the controller's life."""
        grace = self.ctl.cfg.interactive.abandoned_after
        up = time.monotonic()
        while True:
            await asyncio.sleep(min(SWEEP_EVERY, grace / 2))
            if self.ctl.stopping or self.api is None or time.monotonic() - up < grace:
                continue
            try:
                live = await self.ctl.db(interactive_store.live_allocations, self.ctl.repo.engine,
                                         time.time() - grace)
                abandoned = []
                for job_id in (j for j in live if j not in self.holders):
                    job = await self.ctl.db(self.ctl.repo.job_record, job_id)
                    if job is not None and not job.spec.detached and job.id not in self.holders:
                        abandoned.append(job)
            except StoreUnavailable:
                continue
            for job in abandoned:
                log.info("job %d: no salloc or srun has held this allocation for %g s; ending it", job.id, grace)
                owner = Caller(uid=job.uid, gid=job.gid, pid=0, user=job.user)
                try:
                    await api_control.cancel(self.api, {"ids": [job.id]}, owner)
                except (RequestError, StoreUnavailable) as exc:
                    log.warning("ending abandoned allocation %d failed: %s", job.id, exc)

    async def gone(self, link: ClientLink, caller: Caller) -> None:
        """Its connection closed: its steps are killed and its allocations ended, unless the
        controller itself is stopping (a restart must keep every session)."""
        ctx = self.api
        self.ctl.step_watches.left(step_tee.drop(link))
        self.ctl.follows.drop(link)
        if self.ctl.stopping or not self.ctl.started or ctx is None:
            for job_id in list(link.held):
                self._unhold(link, job_id)
            return
        for key in list(link.steps):
            live = self.hub.live.get(key)
            if live is None or live.client is not link:
                continue
            live.client = None
            await self.hub._signal_nodes(key[0], live.attempt, key[1], live.nodes, 9)
            await self._end(key, live, None, 9, True)
        held = sorted(link.held)
        for job_id in held:
            self._unhold(link, job_id)
        if held:
            log.info("uid %d: the client holding allocation(s) %s went away; ending them", caller.uid,
                     ", ".join(map(str, held)))
            try:
                await api_control.cancel(ctx, {"ids": held}, caller)
            except RequestError as exc:
                log.warning("ending the allocations of a client that went away failed: %s", exc)


async def _push(conn, name: str, body: dict) -> None:
    try:
        await conn.push(name, body)
    except Exception:  # noqa: BLE001 - a client that is gone hears nothing
        pass


# -- the API's handlers (controller/api.py) --

async def step_create(ctx: "ApiContext", body, caller: Caller):
    await ctx.take_rate(caller, 1)  # a step's record and event, as a submission's
    return await _guarded(ctx.ctl.client_steps.create(body, caller))


async def release_allocation(ctx: "ApiContext", body, caller: Caller):
    return await _guarded(ctx.ctl.client_steps.release(body, caller, ctx))


async def _guarded(coro):
    """A body that fails its checks is answered with what was wrong (no traceback in the log)."""
    try:
        return await coro
    except SpecError as exc:
        raise RequestError(str(exc)) from None


def delegating(service: str, methods: dict[str, str]) -> dict:
    """API handlers (method -> handler) that pass (body, caller) to ctx.ctl.<service>.<its method>,
    a body that fails its checks answered as an error."""
    def handler(name: str):
        async def handle(ctx: "ApiContext", body, caller: Caller):
            return await _guarded(getattr(getattr(ctx.ctl, service), name)(body, caller))
        return handle
    return {method: handler(name) for method, name in methods.items()}


HANDLERS = {"step_create": step_create, "release_allocation": release_allocation,
            **delegating("client_steps", {"step_attach": "attach", "step_launch": "launch", "step_input": "input",
                                          "step_resize": "resize", "step_signal": "signal", "step_done": "done",
                                          "allocation": "allocation"})}
