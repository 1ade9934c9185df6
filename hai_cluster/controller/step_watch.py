"""sattach's requests to the controller: attach to a running step (its output teed by
step_tee.py), send it input, or read where its tasks are (--layout). Only the job's owner and
root; the words are those Slurm's slurmctld answers sattach with. An attacher's stdin reaches the
tasks of a client's step as srun's does, a chunk per request; its end (EOF) is not passed on: the
step's stdin stays srun's to close.

A batch job's step (srun in its script): the other nodes' tasks' output passes through here
anyway; srun's own node's tasks' is asked for while the step has an attacher (`step_tee` to that
node's agent, which asks srun: cli/srun_tee.py), and no longer once the last one has gone. Its
tasks read srun's stdin in the script: sattach sends them none."""
from __future__ import annotations

import asyncio
import logging
from typing import Any

from ..core.states import FINAL_STATES, JobState
from ..core.steps import StepIO, task_nodes
from ..protocol import steps as wire
from ..protocol.runspec import check_keys
from ..transport.rpc import RequestError, RpcError
from .access import Caller
from .client_steps import _id as wire_id, delegating
from .nodes import AGENT_ERRORS
from .step_tee import MAX_WATCHERS, Watcher, _watch
from .steps import CLIENT_ORIGIN, LiveStep
from . import step_tee

log = logging.getLogger(__name__)
TEE_TIMEOUT = 30.0  # the origin's agent asks srun (10 s at most) and answers


def _unknown(key: tuple[int, int], why: str = "Invalid job id specified") -> RequestError:
    return RequestError(f"Could not get job step info: {why}")


def _layout(nodes: tuple[str, ...], counts: list[int]) -> dict:
    return {"nodes": list(nodes), "counts": list(counts), "tasks": task_nodes(nodes, counts)}


class StepWatches:
    def __init__(self, ctl) -> None:
        self.ctl = ctl

    async def _step(self, body: Any, caller: Caller) -> tuple[tuple[int, int], Any]:
        """The job of step JOB.STEP, checked as Slurm's sattach is answered: a job nobody knows,
        or a step that is not running, is "Invalid job id specified"; an ended job's steps are
        completed; only the owner and root go further."""
        key = (wire_id("job_id", body["job_id"]), wire_id("step_id", body["step_id"]))
        job = await self.ctl.db(self.ctl.repo.job_record, key[0])
        if job is None:
            raise _unknown(key)
        if caller.uid not in (0, job.uid):
            raise _unknown(key, "Access/permission denied")
        if JobState(job.state) in FINAL_STATES or job.end_request is not None:
            raise _unknown(key, "Job/step already completing or completed")
        return key, job

    async def layout(self, body: Any, caller: Caller) -> dict:
        """sattach --layout: where a running step's tasks are (any step, a batch job's too)."""
        check_keys("step_layout body", body, ("job_id", "step_id"))
        key, job = await self._step(body, caller)
        row = await self.ctl.db(self.ctl.repo.steps.open_step, *key)
        if row is None:
            raise _unknown(key)
        nodes = tuple(row["nodelist"].split(","))
        return _layout(nodes, [int(c) for c in row["counts"].split(",")])

    async def watch(self, body: Any, caller: Caller) -> dict:
        check_keys("step_watch body", body, ("job_id", "step_id"), ("input",))
        if not isinstance(body.get("input", False), bool):
            raise RequestError("input must be true or false")
        link = caller.link
        if link is None or getattr(link, "conn", None) is None:
            raise RequestError("this connection cannot attach to steps")
        key, job = await self._step(body, caller)
        live = await self.ctl.steps._live(key)  # after a controller restart (or a batch step's last remote task): from its row
        if live is None:
            raise _unknown(key)
        batch = live.origin != CLIENT_ORIGIN
        if batch and body.get("input"):
            raise RequestError(f"Could not attach to step {key[0]}.{key[1]}: it is a step of a batch job, whose "
                               f"tasks read its srun's stdin in the batch script; sattach sends input (--input-filter, "
                               f"--pty) to the steps of salloc and srun allocations only: attach without them to "
                               f"see its output")
        if live.start is not None:
            raise RequestError(f"Could not attach to step {key[0]}.{key[1]}: it has not started yet")
        w = _watch(live)
        self._room(key, w, link)
        if batch:
            await self._copy(key, live)
            try:
                if self.ctl.steps.live.get(key) is not live:  # it ended meanwhile
                    raise _unknown(key)
                self._room(key, w, link)  # others may have attached meanwhile
            except RequestError:
                self.left({key})
                raise
        watcher = Watcher(conn=link.conn, key=key, uid=caller.uid)
        link.conn.write_timeout = None  # a step's output may come after a long quiet spell
        for message in step_tee.replay(live):  # the replay, before anything new
            watcher.put("output", message, len(message["data"]))
        w.watchers.append(watcher)
        link.watches.append(watcher)
        watcher.writer = asyncio.ensure_future(watcher.run())
        io = live.io or StepIO()
        nodes = tuple(live.nodes)
        row = await self.ctl.db(self.ctl.repo.steps.open_step, *key)
        counts = [int(c) for c in row["counts"].split(",")] if row else []
        if batch:  # its tasks' stdin is srun's: none is sent
            return {**_layout(nodes, counts), "pty": False, "input": "none", "batch": True}
        return {**_layout(nodes, counts), "pty": io.pty,
                "input": io.input if isinstance(io.input, int) else str(io.input)}

    @staticmethod
    def _room(key: tuple[int, int], w, link) -> None:
        w.watchers = [x for x in w.watchers if not x.closed]
        if len(w.watchers) >= MAX_WATCHERS:
            raise RequestError(f"Could not attach to step {key[0]}.{key[1]}: it already has {MAX_WATCHERS} "
                               f"attached clients")
        if link.watches:
            raise RequestError("this connection is already attached to a step")

    async def _copy(self, key: tuple[int, int], live: LiveStep) -> None:
        """A batch job's step: its srun's own tasks' output is copied to us from now on (if it is
        not yet), and their recent output merged into the replay."""
        w = _watch(live)
        async with w.lock:
            if live.teeing:
                return
            live.teeing = True  # srun's first copies may come before its answer does
            try:
                reply = await self.ctl.steps._call(live.origin, "step_tee",
                                                   {"job_id": key[0], "step_id": key[1], "on": True}, TEE_TIMEOUT)
                check_keys("step_tee reply", reply, ("srun", "events"))
                events = wire.tee_events(reply["events"], key[1])
            except (RpcError, *AGENT_ERRORS, ValueError) as exc:
                live.teeing = False
                raise RequestError(f"Could not attach to step {key[0]}.{key[1]}: node {live.origin}: {exc}") from None
            if not reply["srun"]:  # its srun has gone: the step is ending
                live.teeing = False
                raise _unknown(key)
            step_tee.merge(live, events)

    def left(self, keys) -> None:
        """Attachers went (their connections closed): a batch step with none left stops its copy."""
        for key in keys:
            live = self.ctl.steps.live.get(key)
            if live is not None and live.teeing and not step_tee.watched(live):
                self.ctl.spawn(self._uncopy(key, live))

    async def _uncopy(self, key: tuple[int, int], live: LiveStep) -> None:
        async with _watch(live).lock:
            if not live.teeing or step_tee.watched(live):
                return
            live.teeing = False
            try:
                await self.ctl.steps._call(live.origin, "step_tee", {"job_id": key[0], "step_id": key[1], "on": False},
                                           TEE_TIMEOUT)
            except (RpcError, *AGENT_ERRORS) as exc:  # its next copy is answered "not wanted"
                log.debug("step %d.%d: stopping its copy on %s: %s", *key, live.origin, exc)

    def run_ended(self, job_id: int, attempt: int, node: str) -> None:
        """A run's end on a node: the batch steps srun ran there are over (its srun went with
        it), though that srun could not say so: their attachers hear the end."""
        for key, live in list(self.ctl.steps.live.items()):
            if key[0] == job_id and live.attempt == attempt and live.origin == node:
                del self.ctl.steps.live[key]
                step_tee.ended(live, key, "CANCELLED", None, None)

    async def input(self, body: Any, caller: Caller) -> dict:
        """An attacher's stdin to the step's tasks (all, or --input-filter's one), as srun's."""
        check_keys("watch_input body", body, ("job_id", "step_id", "task", "data"))
        key = (wire_id("job_id", body["job_id"]), wire_id("step_id", body["step_id"]))
        data, _eof = wire.stdin_chunk({"data": body["data"], "eof": False})
        task = None if body["task"] is None else wire_id("task", body["task"])
        link = caller.link
        if not any(w.key == key and not w.closed for w in getattr(link, "watches", ())):
            raise RequestError(f"this connection is not attached to step {key[0]}.{key[1]}")
        live = self.ctl.steps.live.get(key)
        if live is None or live.origin != CLIENT_ORIGIN:  # a batch step's tasks read srun's stdin
            return {"reached": 0}
        io = live.io or StepIO()
        if io.pty:
            task = 0
        if task is None:
            nodes = sorted(set(live.remote.values()))
        else:
            nodes = [live.remote[task]] if task in live.remote else []
        message = {"job_id": key[0], "attempt": live.attempt, "step_id": key[1], "task": task, "data": data,
                   "eof": False}
        results = await asyncio.gather(*(self.ctl.client_steps._to_node(n, "step_input", message) for n in nodes),
                                       return_exceptions=True)
        return {"reached": sum(r.get("reached", 0) for r in results if isinstance(r, dict))}


# -- the API's handlers (controller/api.py) --

HANDLERS = delegating("step_watches", {"step_watch": "watch", "step_layout": "layout", "watch_input": "input"})
