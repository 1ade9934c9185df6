"""Following a batch job's output from the submit host (`sattach JOB.batch`): the job's --output
file is read on its first node (agent/follow.py) and its bytes come through the controller to the
follower's connection, so the submit host needs no file system in common with the node.

    sattach --output_follow {job, offset}--> controller --output_follow--> the first node's agent
    agent (tail as the user) --output_data--> controller --offer "follow_data"--> sattach
    the job's run ends: tail's last bytes, then "follow_end" {state, exit code} once it is recorded

Only the job's owner (and root) may follow it. Each follow starts at the byte the follower asks
for (sattach: 0, the file's beginning; after a controller restart or a requeue, the byte it has
reached), so nothing is lost or repeated across either: a job that ended while its follower was
away (offset > 0) is read to its file's end (output_rest) and then ended, unless its node is gone
too (then the follower is told). A pending job is answered with its state, and a running one
whose node is not connected (yet) with why (the follower asks again later).
Bounds: MAX_FOLLOWERS per job and one follow per connection; the bytes are offered, not queued
(RpcConnection.offer): one that finds no room is answered "busy" and the agent reads nothing more
from the file until it is taken.
"""
from __future__ import annotations

import asyncio
import secrets
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..core.patterns import resolve_output_path
from ..core.states import FINAL_STATES, JobState
from ..protocol.runspec import check_keys, nonneg_int
from ..transport.rpc import ConnectionLost, RequestError
from .access import Caller
from .client_steps import _id, delegating
from .dispatch import output_names
from .nodes import NodeUnavailable

if TYPE_CHECKING:
    from .service import Controller

log = logging.getLogger(__name__)

MAX_FOLLOWERS = 8  # per job
MAX_DATA = 64 * 1024  # one output_data message
OFFER_WAIT = 20.0  # under the agent's 60 s call timeout: its answer always comes
OFFER_BUFFERED = 1 << 20
END_WAIT = 60.0  # the run's end is recorded this long after tail's last bytes, at most
START_TIMEOUT = 30.0


@dataclass(eq=False)
class Follower:
    conn: Any
    job_id: int
    node: str
    follow_id: int


def _output_file(job: Any) -> str:
    """The --output file of the job's last run, as that run's launch named it (dispatch.rank_spec)."""
    return resolve_output_path(job.spec.stdout, job.spec.workdir, **output_names(job, job.nodelist_names[0]))


class OutputFollows:
    def __init__(self, ctl: "Controller") -> None:
        self.ctl = ctl
        self.by_id: dict[int, Follower] = {}

    async def follow(self, body: Any, caller: Caller) -> dict:
        check_keys("output_follow body", body, ("job_id", "offset"))
        job_id, offset = _id("job_id", body["job_id"]), nonneg_int("offset", body["offset"])
        link = caller.link
        if link is None or getattr(link, "conn", None) is None:
            raise RequestError("this connection cannot follow output")
        job = await self.ctl.db(self.ctl.repo.job_record, job_id)
        if job is None:
            raise RequestError("Could not get job step info: Invalid job id specified")
        if caller.uid not in (0, job.uid):
            raise RequestError("Could not get job step info: Access/permission denied")
        if job.spec.interactive:
            raise RequestError(f"Could not get job step info: job {job_id} is an allocation of salloc or srun: it "
                               f"has no batch step (attach to its steps: sattach {job_id}.STEP)")
        state = JobState(job.state)
        if state in FINAL_STATES:
            if offset == 0 or not job.nodelist:  # a follower that was away asks for the rest
                raise RequestError("Could not get job step info: Job/step already completing or completed")
            return await self._start(link, job, job.nodelist_names[0], "output_rest", {
                "job_id": job_id, "offset": offset, "path": _output_file(job), "user": job.user, "uid": job.uid,
                "gid": job.gid}, wait=False)  # an ended job's node may never come back
        if state != JobState.RUNNING:
            return {"state": job.state}
        ranks = [r for r in await self.ctl.db(self.ctl.repo.live_ranks, job_id=job_id) if r.rank == 0]
        if not ranks:
            return {"state": JobState.PENDING.value}  # between runs
        return await self._start(link, job, ranks[0].node, "output_follow",
                                 {"job_id": job_id, "attempt": ranks[0].attempt, "offset": offset})

    async def _start(self, link: Any, job: Any, node: str, method: str, body: dict, wait: bool = True) -> dict:
        """Registers the follower and starts its tail on `node`: its bytes and end come as
        output_data; a reply without "node" tells the follower to ask again later (with `wait`:
        the node is not connected, or the run's start or end is still being recorded)."""
        if getattr(link, "follow", None) is not None:
            raise RequestError("this connection already follows a job's output")
        if sum(1 for f in self.by_id.values() if f.job_id == job.id) >= MAX_FOLLOWERS:
            raise RequestError(f"job {job.id}'s output already has {MAX_FOLLOWERS} followers")
        fid = secrets.randbits(52)  # never one a tail of an earlier controller's follow still sends
        while fid in self.by_id:
            fid = secrets.randbits(52)
        follower = Follower(link.conn, job.id, node, fid)
        self.by_id[fid] = follower
        link.follow = follower
        link.conn.write_timeout = None  # a job may print nothing for hours
        try:
            link_ = self.ctl.links.get(node)
            if link_ is None:
                raise RequestError(f"node {node} is unknown")
            reply = await link_.call(method, {**body, "follow_id": fid}, timeout=START_TIMEOUT)
        except Exception as exc:  # noqa: BLE001 - any failure is the follower's answer
            self._forget(follower, link)
            if wait and (isinstance(exc, NodeUnavailable) or "; try again" in str(exc)):
                return {"state": job.state, "waiting": str(exc).removesuffix("; try again")}
            raise RequestError(f"the output of job {job.id} cannot be followed: {exc}") from None
        return {"state": job.state, "node": node, "path": str(reply.get("path", ""))}

    def _forget(self, follower: Follower, link: Any = None) -> None:
        self.by_id.pop(follower.follow_id, None)
        if link is not None and getattr(link, "follow", None) is follower:
            link.follow = None

    async def data(self, body: Any, node: str) -> dict:
        """A chunk of the file from its node's tail; its end (eof) once the job's process is gone."""
        check_keys("output_data body", body, ("follow_id", "data", "eof"), ("error",))
        fid = nonneg_int("follow_id", body["follow_id"])
        data, eof = body["data"], body["eof"]
        if not isinstance(data, bytes) or len(data) > MAX_DATA or not isinstance(eof, bool):
            raise RequestError(f"data must be at most {MAX_DATA} bytes and eof true or false")
        f = self.by_id.get(fid)
        if f is None or f.node != node or f.conn.closed:
            if f is not None and f.node == node:
                self.by_id.pop(fid, None)
            return {"delivered": False}
        try:
            if data and not await f.conn.offer("follow_data", {"job_id": f.job_id, "data": data}, OFFER_WAIT,
                                               OFFER_BUFFERED):
                return {"delivered": False, "busy": True}
        except ConnectionLost:
            self.by_id.pop(fid, None)
            return {"delivered": False}
        if eof:
            error = body.get("error")
            self.ctl.spawn(self._end(f, error if isinstance(error, str) else None))
        return {"delivered": True}

    async def _end(self, f: Follower, error: str | None) -> None:
        """tail is done: the job's run ended (or the file could not be read). The follower hears
        the job's state once the run's end is recorded: final, or pending again (requeued)."""
        deadline = time.monotonic() + END_WAIT
        job = None
        while time.monotonic() < deadline and not f.conn.closed:
            job = await self.ctl.db(self.ctl.repo.job_record, f.job_id)
            if job is None or job.state not in (JobState.RUNNING.value, JobState.COMPLETING.value) \
                    or error is not None:
                break
            await asyncio.sleep(0.5)
        self.by_id.pop(f.follow_id, None)
        end = {"job_id": f.job_id, "state": job.state if job else "UNKNOWN",
               "exit_code": job.exit_code if job else None, "signal": job.exit_signal if job else None,
               "error": error}
        try:
            await f.conn.push("follow_end", end)
        except Exception:  # noqa: BLE001 - a follower that is gone hears nothing
            pass

    def drop(self, link: Any) -> None:
        """The follower's connection closed: its tail on the node is stopped."""
        f = getattr(link, "follow", None)
        if f is None:
            return
        link.follow = None
        if self.by_id.pop(f.follow_id, None) is None:
            return
        node = self.ctl.links.get(f.node)
        if node is not None:
            self.ctl.spawn(self._unfollow(node, f))

    @staticmethod
    async def _unfollow(node, f: Follower) -> None:
        try:
            await node.call("output_unfollow", {"follow_id": f.follow_id}, timeout=10)
        except Exception as exc:  # noqa: BLE001 - its tail ends with the job, or when its data is refused
            log.debug("output_unfollow %d on %s: %s", f.follow_id, f.node, exc)


HANDLERS = delegating("follows", {"output_follow": "follow"})
