"""Job steps in the controller: lay out an srun's tasks on the job's allocation (core/steps.py),
have every other node's agent start its share, and route the tasks' output and ends to the agent
of the node where srun waits. agent/steps.py has the whole path.

These are requests the agents make on their link (the controller serves them there, context:
the node's name). The controller trusts the agent's word on who asked (it checked the kernel's),
and checks the rest against the store: the job runs, this attempt, on that node, for that uid.
A step's routing lives in memory, and its record in the store (store/steps.py: its id, command,
nodes, task counts, times and end, for hacct and hqueue -s): a restarted controller rebuilds an
open step's routing from its row when the step's next message comes.

A step may also come from a client with no agent of its own (salloc's srun, srun outside a job:
client_steps.py); its tasks are all on step servers, and their output and ends are pushed to the
client's connection here, as fast as it reads them.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from .. import timeouts
from ..core.states import JobState
from ..core.hostlist import compress
from ..core.steps import (Allocation, StepError, plan_step, step_end_state, step_name,
                          task_nodes)
from ..protocol import steps as wire
from ..protocol.runspec import check_keys, nonneg_int, valid_signal
from ..transport.rpc import ConnectionLost, RequestError, RpcError, RpcTable, refusing
from .nodes import AGENT_ERRORS
from . import step_tee

if TYPE_CHECKING:
    from .service import Controller

log = logging.getLogger(__name__)

START_TIMEOUT = 90.0  # a node's agent may wait up to a minute for its step server to connect
FORWARD_TIMEOUT = 120.0  # srun's agent forwards only as fast as srun reads
LAUNCH_WAIT = 60.0  # srun's agent asks for the launch right after the layout: one that never does went away
RETRY = 0.5  # seconds between tries while srun's agent is unreachable
REATTACH_WAIT = 60.0  # a client's step: how long its output waits for the client to attach again
# A client's step output is offered, not queued: at most this much unread by the client, and a
# chunk waits this long for room before its step server is told to offer it again ("busy"; under
# the agent's 60 s wait for the controller, so the answer always reaches the step server).
CLIENT_BUFFERED = 1 << 20
CLIENT_PUSH_WAIT = 20.0


CLIENT_ORIGIN = "(client)"  # run_steps.origin of a client's step: no node's agent ends it


@dataclass
class LiveStep:
    origin: str  # the node where srun runs (CLIENT_ORIGIN: a client's)
    attempt: int
    nodes: tuple[str, ...]
    remote: dict[int, str] = field(default_factory=dict)  # tasks on other nodes not yet ended: their node
    start: dict | None = None  # what the other nodes are sent, until step_launch sends it
    client: Any = None  # a client's step: its connection (client_steps.ClientLink), None while it has none
    io: Any = None  # a client's step: its StepIO
    attached: asyncio.Event = field(default_factory=asyncio.Event)  # a client's step: its client is there
    uid: int | None = None  # a client's step: its owner (the unlaunched steps a user may have)
    watch: Any = None  # its sattach clients and recent output (step_tee.StepWatch)
    local: frozenset[int] = frozenset()  # a batch job's step: the tasks srun runs itself, on its origin
    teeing: bool = False  # a batch job's step: its srun copies them to us (while a sattach is attached)


def _remote(nodes, counts, origin: str) -> dict[int, str]:
    """The tasks not on srun's node: their node, by rank."""
    return {procid: name for procid, name in enumerate(task_nodes(nodes, counts)) if name != origin}


def _local(nodes, counts, origin: str) -> frozenset[int]:
    """The tasks on srun's node (srun runs them itself)."""
    return frozenset(procid for procid, name in enumerate(task_nodes(nodes, counts)) if name == origin)


class StepHub:
    def __init__(self, ctl: "Controller") -> None:
        self.ctl = ctl
        self.live: dict[tuple[int, int], LiveStep] = {}  # (job, step)

    def table(self) -> RpcTable:
        table = RpcTable()
        for name, fn in (("step_create", self.create), ("step_launch", self.launch), ("step_output", self.output),
                         ("step_exit", self.task_ended), ("step_signal", self.signal), ("step_end", self.end),
                         ("job_resumable", self.resumable), ("step_input", self.input),
                         ("step_tee_data", self.tee_data),
                         ("output_data", self.ctl.follows.data)):  # a batch job's output (follow.py)
            table.add(name, refusing(fn, ValueError))  # SpecError and the like
        return table

    async def resumable(self, body: Any, node: str) -> dict:
        """A job's processes said, through their node's step socket, that the job resumes after a
        preemption (hai_cluster.job announces it): time-slicing may take it from now on."""
        check_keys("job_resumable body", body, ("job_id", "uid"))
        job_id, uid = (nonneg_int(k, body[k]) for k in ("job_id", "uid"))
        before = await self.ctl.db(self.ctl.repo.job_record, job_id)
        resumes = await self.ctl.db(self.ctl.repo.announce_resumable, job_id, uid)
        if resumes == "announced" and before is not None and before.resumes is None:
            self.ctl.events.record("resumable", job_id, node, how="announced")
            self.ctl.wake()
        return {"resumes": resumes}

    async def create(self, body: Any, node: str) -> dict:
        check_keys("step_create body", body, ("job_id", "attempt", "uid", "request", "argv", "cwd", "env"), ("io",))
        job_id, attempt, uid = (nonneg_int(k, body[k]) for k in ("job_id", "attempt", "uid"))
        request = wire.step_request(body["request"])
        argv, cwd, env = wire.command(body)
        io = wire.step_io(body.get("io"))  # srun's -i: which tasks read its stdin
        job = await self.ctl.db(self.ctl.repo.job_record, job_id)
        if job is None or job.uid != uid:
            raise RequestError(f"Unable to create step for job {job_id}: Invalid job id specified")
        if job.state != JobState.RUNNING.value or job.end_request is not None:
            raise RequestError(f"Unable to create step for job {job_id}: Job/step already completing or completed")
        ranks = {r.node: r for r in await self.ctl.db(self.ctl.repo.live_ranks, job_id=job_id)
                 if r.attempt == attempt}
        nodes = tuple(job.nodelist_names)
        if node not in ranks or any(n not in ranks for n in nodes):
            raise RequestError(f"Unable to create step for job {job_id}: Job/step already completing or completed")
        alloc = Allocation(job_id, nodes, job.spec.tasks_per_node, job.spec.cpus_per_task,
                           tuple(tuple(ranks[n].gpus) for n in nodes))
        try:
            layout, warnings = plan_step(alloc, request, 0)  # its id once it is known to fit
        except StepError as exc:  # an answer, not an error: srun prints its warnings first
            return {"refused": str(exc), "warnings": list(exc.warnings)}
        remote = [n for n in layout.nodes if n != node]
        if nodes[0] in remote and not job.spec.interactive:  # the batch script's node has no step server
            raise RequestError(f"Unable to create step for job {job_id}: a step on {nodes[0]} (the batch "
                               f"script's node) can only be started from there")
        step_id = await self.ctl.db(self.ctl.repo.steps.begin, job_id, attempt, name=step_name(argv),
                                    nodes=layout.nodes, counts=layout.counts,
                                    cpus=layout.ntasks * layout.cpus_per_task, origin=node,
                                    now=time.time())
        if step_id is None:
            raise RequestError(f"Unable to create step for job {job_id}: Job/step already completing or completed")
        layout = replace(layout, step_id=step_id)
        master = self.ctl.addresses.get(layout.nodes[0], layout.nodes[0])
        live = LiveStep(node, attempt, layout.nodes, _remote(layout.nodes, layout.counts, node), io=io,
                        local=_local(layout.nodes, layout.counts, node))
        self.live[(job_id, step_id)] = live
        live.start = {"job_id": job_id, "attempt": attempt, "layout": layout.to_wire(), "argv": argv,
                      "cwd": cwd, "env": env, "master_addr": master, "io": io.to_wire()}
        self.ctl.events.record("step_start", job_id, node, step=f"{job_id}.{step_id}", name=step_name(argv),
                               tasks=layout.ntasks, nodes=compress(list(layout.nodes)))
        asyncio.get_running_loop().call_later(
            LAUNCH_WAIT, lambda: self.ctl.spawn(self._unlaunched((job_id, step_id), live)))
        return {"layout": layout.to_wire(), "warnings": warnings, "master_addr": master}

    async def _unlaunched(self, key: tuple[int, int], live: LiveStep) -> None:
        """A step whose launch never came (srun's agent died in between): its routing goes, and
        its record ends, so neither is kept for the rest of the job."""
        if self.live.get(key) is not live or live.start is None:
            return
        del self.live[key]
        await self.ctl.db(self.ctl.repo.steps.end, key[0], live.attempt, key[1], origin=live.origin,
                          state=JobState.CANCELLED.value, exit_code=None, exit_signal=None, now=time.time())
        log.info("job %d: step %d.%d was never launched; forgotten", key[0], key[0], key[1])

    async def launch(self, body: Any, node: str) -> dict:
        """The second half of a step's creation: srun's agent is ready for the tasks' output, so
        now the other nodes start theirs."""
        check_keys("step_launch body", body, ("job_id", "step_id"))
        key = (nonneg_int("job_id", body["job_id"]), nonneg_int("step_id", body["step_id"]))
        live = self.live.get(key)
        if live is None or live.origin != node or live.start is None:
            raise RequestError(f"step {key[0]}.{key[1]} is not waiting for its launch")
        return await self.start_remote(key, live)

    async def start_remote(self, key: tuple[int, int], live: LiveStep) -> dict:
        """Have every node of the step but srun's own start its tasks."""
        start, live.start = live.start, None
        remote = [n for n in live.nodes if n != live.origin]
        results = await asyncio.gather(*(self._call(n, "step_start", start, START_TIMEOUT) for n in remote),
                                       return_exceptions=True)
        failed = [(n, r) for n, r in zip(remote, results) if isinstance(r, BaseException)]
        if failed:
            self.live.pop(key, None)
            await self._signal_nodes(key[0], live.attempt, key[1], remote, 9)
            n, exc = failed[0]
            raise RequestError(f"Unable to create step for job {key[0]}: node {n}: {exc}")
        if not live.remote and live.origin != CLIENT_ORIGIN:
            self.live.pop(key, None)
        return {"launched": len(remote)}

    async def _call(self, node: str, method: str, body: dict, timeout: float) -> Any:
        link = self.ctl.links.get(node)
        if link is None:
            raise RequestError(f"node {node} is unknown")
        return await link.call(method, body, timeout=timeout)

    async def _live(self, key: tuple[int, int]) -> LiveStep | None:
        """The step's routing; after a controller restart, rebuilt from the store (its tasks on
        other nodes are taken as running: those that had ended send nothing more)."""
        live = self.live.get(key)
        if live is not None:
            return live
        row = await self.ctl.db(self.ctl.repo.steps.open_step, *key)
        if key in self.live:  # rebuilt meanwhile by another message of the step (or its client's attach)
            return self.live[key]
        if row is None:
            return None
        nodes = tuple(row["nodelist"].split(","))
        counts = [int(c) for c in row["counts"].split(",")]
        live = self.live[key] = LiveStep(row["origin"], row["attempt"], nodes, _remote(nodes, counts, row["origin"]),
                                         local=_local(nodes, counts, row["origin"]))
        return live

    async def _route(self, body: Any, node: str, procid: int) -> LiveStep:
        key = (body["job_id"], body["step_id"])
        live = await self._live(key)
        if live is None or live.attempt != body.get("attempt") or node not in live.nodes or node == live.origin:
            raise RequestError(f"step {key[0]}.{key[1]} is not running on node {node}")
        if live.remote.get(procid) != node:
            raise RequestError(f"task {procid} of step {key[0]}.{key[1]} is not a running task of node {node}")
        return live

    async def output(self, body: Any, node: str) -> dict:
        procid = wire.output(body, "attempt")[2]
        live = await self._route(body, node, procid)
        if live.origin != CLIENT_ORIGIN:  # kept for a sattach, as a client's step's (_to_client)
            await step_tee.tee(live, "output", {k: body[k] for k in ("step_id", "task", "seq", "stream", "data")})
        return await self._forward(live, "step_output", body)

    async def task_ended(self, body: Any, node: str) -> dict:
        procid = wire.task_exit(body, "attempt")[2]
        live = await self._route(body, node, procid)
        if live.origin != CLIENT_ORIGIN:
            await step_tee.tee(live, "exit", {k: body[k] for k in ("step_id", "task", "exit_code", "signal")})
        reply = await self._forward(live, "step_exit", body)
        live.remote.pop(procid, None)
        # a client's step ends its own (client_steps.py); an attached one's goes with its end
        if not live.remote and live.origin != CLIENT_ORIGIN and not step_tee.held(live):
            self.live.pop((body["job_id"], body["step_id"]), None)
        return reply

    async def tee_data(self, body: Any, node: str) -> dict:
        """srun's copy of its own tasks' output and ends (a batch job's step, while a sattach is
        attached: step_watch.py asked for it), teed as the other nodes' are. The answer says
        whether it is still wanted."""
        check_keys("step_tee_data body", body, ("job_id", "attempt", "step_id", "lost", "events"))
        job_id, attempt, step_id, lost = (nonneg_int(k, body[k]) for k in ("job_id", "attempt", "step_id", "lost"))
        events = wire.tee_events(body["events"], step_id)
        live = self.live.get((job_id, step_id))
        if live is None or live.origin != node or live.attempt != attempt or not live.teeing:
            return {"wanted": False}
        if any(e.message["task"] not in live.local for e in events):
            raise RequestError(f"step {job_id}.{step_id} has no such task on node {node}")
        step_tee.lost(live, lost)
        for e in events:
            await step_tee.tee(live, e.kind, e.message, at=e.at)
        return {"wanted": live.teeing}  # until the last attacher has gone (not "has come": it may be on its way)

    async def _forward(self, live: LiveStep, method: str, body: dict) -> dict:
        """To srun's agent; across a short break of its link (an agent restart), tried again."""
        if live.origin == CLIENT_ORIGIN:
            return await self._to_client(live, method, body)
        deadline = time.monotonic() + FORWARD_TIMEOUT
        while True:
            try:
                return await self._call(live.origin, method, body, FORWARD_TIMEOUT)
            except RpcError as exc:
                log.debug("step output to %s refused: %s", live.origin, exc)
                return {"delivered": False}
            except AGENT_ERRORS as exc:
                if time.monotonic() >= deadline:  # srun's node is gone: nobody to read it
                    log.info("job %s: step output to %s dropped: %s", body.get("job_id"), live.origin, exc)
                    return {"delivered": False}
            await asyncio.sleep(RETRY)

    async def _to_client(self, live: LiveStep, method: str, body: dict) -> dict:
        """A task's output or end, pushed to the client's connection as the agent's relay pushes
        it to srun (the same event), only as fast as the client reads (RpcConnection.offer): a
        chunk that finds no room is answered "busy" and its step server offers it again later, so
        a client that stops reading costs CLIENT_BUFFERED here, not a queue. A client that is
        gone, or never came back after a controller restart, gets nothing."""
        if method == "step_output":
            message = {k: body[k] for k in ("step_id", "task", "seq", "stream", "data")}
            kind = "output"
        else:
            message = {k: body[k] for k in ("step_id", "task", "exit_code", "signal")}
            kind = "exit"
        await step_tee.tee(live, kind, message)
        link = live.client
        if link is None or link.conn is None or link.conn.closed:
            # after a controller restart (or a break of the client's link) it comes back and
            # attaches again: the task waits for it, a while
            live.attached.clear()
            try:
                await timeouts.wait_for(live.attached.wait(), REATTACH_WAIT)
            except asyncio.TimeoutError:
                return {"delivered": False}
            link = live.client
            if link is None or link.conn is None or link.conn.closed:
                return {"delivered": False}
        try:
            if not await link.conn.offer(kind, message, CLIENT_PUSH_WAIT, CLIENT_BUFFERED):
                return {"delivered": False, "busy": True}  # the step server offers it again
        except ConnectionLost:
            return {"delivered": False}
        return {"delivered": True}

    async def input(self, body: Any, node: str) -> dict:
        """srun's stdin (srun in a batch script) to its tasks on other nodes: all that read it, or
        task `task` (-i N); srun's agent checked that this srun made the step."""
        check_keys("step_input body", body, ("job_id", "step_id", "task", "data", "eof"))
        key = (nonneg_int("job_id", body["job_id"]), nonneg_int("step_id", body["step_id"]))
        task = None if body["task"] is None else nonneg_int("task", body["task"])
        data, eof = wire.stdin_chunk(body)
        live = await self._live(key)
        if live is None or live.origin != node:
            raise RequestError(f"step {key[0]}.{key[1]} is not running from node {node}")
        nodes = sorted(set(live.remote.values())) if task is None else \
            ([live.remote[task]] if task in live.remote else [])
        message = {"job_id": key[0], "attempt": live.attempt, "step_id": key[1], "task": task, "data": data,
                   "eof": eof}
        results = await asyncio.gather(*(self._call(n, "step_input", message, FORWARD_TIMEOUT) for n in nodes),
                                       return_exceptions=True)
        return {"reached": sum(r.get("reached", 0) for r in results if isinstance(r, dict))}

    async def end(self, body: Any, node: str) -> dict:
        """srun's agent reports the step's end: its worst exit code, or that srun went first."""
        check_keys("step_end body", body, ("job_id", "attempt", "step_id", "exit_code", "signal", "cancelled"))
        job_id, attempt, step_id = (nonneg_int(k, body[k]) for k in ("job_id", "attempt", "step_id"))
        code = None if body["exit_code"] is None else nonneg_int("exit_code", body["exit_code"])
        sig = None if body["signal"] in (None, 0) else valid_signal("signal", body["signal"])
        if not isinstance(body["cancelled"], bool):
            raise RequestError("cancelled must be true or false")
        state = step_end_state(code, sig, body["cancelled"])
        ended = await self.ctl.db(self.ctl.repo.steps.end, job_id, attempt, step_id, origin=node, state=state,
                                  exit_code=code, exit_signal=sig, now=time.time())
        if ended:
            live = self.live.pop((job_id, step_id), None)  # a task that ended unreported keeps none behind
            if live is not None:
                step_tee.ended(live, (job_id, step_id), state, code, sig)
            self.ctl.events.record("step_end", job_id, node, step=f"{job_id}.{step_id}", state=state,
                                   exit_code=f"{code or 0}:{sig or 0}")
        return {"recorded": ended}

    async def signal(self, body: Any, node: str) -> dict:
        check_keys("step_signal body", body, ("job_id", "step_id", "signal"))
        job_id, step_id = nonneg_int("job_id", body["job_id"]), nonneg_int("step_id", body["step_id"])
        sig = valid_signal("signal", body["signal"])
        live = await self._live((job_id, step_id))
        if live is None or live.origin != node:
            return {"signalled": 0}
        return {"signalled": await self._signal_nodes(job_id, live.attempt, step_id,
                                                      [n for n in live.nodes if n != node], sig)}

    async def _signal_nodes(self, job_id: int, attempt: int, step_id: int, nodes, sig: int) -> int:
        body = {"job_id": job_id, "attempt": attempt, "step_id": step_id, "signal": sig}
        results = await asyncio.gather(*(self._call(n, "step_signal", body, 10.0) for n in nodes),
                                       return_exceptions=True)
        return sum(r.get("signalled", 0) for r in results if isinstance(r, dict))
