"""A batch job's output, read on its first node for a user following it from the submit host
(`sattach JOB.batch`; the controller's side: controller/follow.py).

The file is the job's --output (its path as the launch expanded it). It is read by `tail`
running as the job's user, with the user's groups, never by the agent itself: whatever path the
user made it, the reader can open only what the user could open and read anyway, and the bytes
go back to that user (or root). `tail -c +N -f --pid=P` starts at byte N, follows the file while
the job's main process P lives, and exits after the last bytes once it is gone.

Bounds: one tail per follower (the controller admits at most MAX_FOLLOWERS per job); its output
is read a chunk at a time and the next is read only once the controller has taken this one (it
answers "busy" while the follower reads slowly): a stopped follower stops tail, by its pipe, not
a queue here. A controller that goes away (a restart) ends the follow: the follower asks again,
from the byte it has.
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal
from typing import TYPE_CHECKING, Any

from ..protocol.runspec import check_keys, nonneg_int
from ..transport.rpc import ConnectionLost, RequestError, RpcError
from . import launcher
from .runs import retrieved

if TYPE_CHECKING:
    from .daemon import Agent

log = logging.getLogger(__name__)

CHUNK = 64 * 1024
MAX_FOLLOWS = 64  # tails on one node at once
BUSY_RETRY = 0.5
CALL_TIMEOUT = 60.0


class OutputFollows:
    def __init__(self, agent: "Agent") -> None:
        self.agent = agent
        self.procs: dict[int, asyncio.subprocess.Process] = {}  # follow id -> its tail

    async def start(self, body: Any) -> dict:
        check_keys("output_follow body", body, ("job_id", "attempt", "follow_id", "offset"))
        key = (nonneg_int("job_id", body["job_id"]), nonneg_int("attempt", body["attempt"]))
        fid, offset = nonneg_int("follow_id", body["follow_id"]), nonneg_int("offset", body["offset"])
        run, node = self.agent.runs.get(key), self.agent.cfg.name
        if run is None or run.spec is None:
            raise RequestError(f"job {key[0]} is not running on node {node}")
        if run.status.ended:  # the controller has not recorded it yet ("try again": the follower waits)
            raise RequestError(f"job {key[0]}'s end on node {node} is being recorded; try again")
        pid = run.status.pid if run.status.pid is not None else launcher.job_record(run.dir).get("pid")
        if not isinstance(pid, int):
            raise RequestError(f"job {key[0]}'s start on node {node} is being recorded; try again")
        spec = run.spec
        await self._tail(fid, ["-c", f"+{offset + 1}", f"--pid={pid}", "-f", "--", spec.stdout],
                         spec.user, spec.uid, spec.gid, key[0])
        return {"path": spec.stdout, "node": self.agent.cfg.name}

    async def rest(self, body: Any) -> dict:
        """The file of a run that has ended (and that this agent may have forgotten) from byte
        `offset` to its end: a follower that was away (a controller restart) while the job ended.
        The controller names the file and its user, as it names them in the run's spec."""
        check_keys("output_rest body", body, ("job_id", "follow_id", "offset", "path", "user", "uid", "gid"))
        job_id, fid = nonneg_int("job_id", body["job_id"]), nonneg_int("follow_id", body["follow_id"])
        offset, uid, gid = nonneg_int("offset", body["offset"]), nonneg_int("uid", body["uid"]), \
            nonneg_int("gid", body["gid"])
        path, user = body["path"], body["user"]
        if not (isinstance(path, str) and path.startswith("/") and len(path) <= 4096 and "\0" not in path):
            raise RequestError("path must be an absolute path")
        if not (isinstance(user, str) and 0 < len(user) <= 64):
            raise RequestError("user must be a user name")
        await self._tail(fid, ["-c", f"+{offset + 1}", "--", path], user, uid, gid, job_id)
        return {"path": path, "node": self.agent.cfg.name}

    async def _tail(self, fid: int, args: list[str], user: str, uid: int, gid: int, job_id: int) -> None:
        if fid in self.procs:
            raise RequestError(f"follow {fid} is already running")
        if len(self.procs) >= MAX_FOLLOWS:
            raise RequestError(f"node {self.agent.cfg.name} already follows {MAX_FOLLOWS} outputs")
        ids: dict[str, Any] = {}
        if os.geteuid() == 0:  # as the job's user, with the user's groups (the file is theirs)
            try:
                groups = os.getgrouplist(user, gid)
            except KeyError:
                groups = [gid]
            ids = {"user": uid, "group": gid, "extra_groups": groups}
        try:
            proc = await asyncio.create_subprocess_exec(
                "tail", *args, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, cwd="/", env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"},
                start_new_session=True, **ids)
        except OSError as exc:
            raise RequestError(f"the output of job {job_id} cannot be read on node {self.agent.cfg.name}: "
                               f"{exc.strerror or exc}") from None
        self.procs[fid] = proc
        # its bytes go to the controller that asked (a later one does not know this follow)
        asyncio.ensure_future(self._pump(fid, proc, self.agent.controller)).add_done_callback(retrieved)

    def stop(self, body: Any) -> dict:
        check_keys("output_unfollow body", body, ("follow_id",))
        fid = nonneg_int("follow_id", body["follow_id"])
        return {"stopped": self._kill(fid)}

    def _kill(self, fid: int) -> bool:
        proc = self.procs.pop(fid, None)
        if proc is None or proc.returncode is not None:
            return False
        try:
            proc.send_signal(signal.SIGKILL)
        except ProcessLookupError:
            pass
        return True

    async def _pump(self, fid: int, proc: asyncio.subprocess.Process, conn) -> None:
        try:
            while True:
                data = await proc.stdout.read(CHUNK)
                body: dict[str, Any] = {"follow_id": fid, "data": data, "eof": not data}
                if not data:
                    await proc.wait()
                    err = (await proc.stderr.read(2048)).decode(errors="replace").strip()
                    if proc.returncode and err:
                        body["error"] = "; ".join(err.splitlines())[:300]
                if not await self._send(conn, body) or not data:
                    return
        finally:
            self._kill(fid)
            if proc.returncode is None:
                await proc.wait()

    async def _send(self, conn, body: dict) -> bool:
        """To the controller, as fast as the follower takes it; False: nobody follows any more."""
        while True:
            if conn is None or conn.closed:
                return False
            try:
                reply = await conn.call("output_data", body, timeout=CALL_TIMEOUT)
            except (RpcError, ConnectionLost, asyncio.TimeoutError):
                return False
            if isinstance(reply, dict) and reply.get("busy"):
                await asyncio.sleep(BUSY_RETRY)
                continue
            return isinstance(reply, dict) and bool(reply.get("delivered"))

    def close(self) -> None:
        for fid in list(self.procs):
            self._kill(fid)

