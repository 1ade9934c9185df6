"""The agent's part in job steps: the step socket where srun and the step servers of this node's
jobs connect, and the relay between them and the controller.

    srun (node A) --step_create--> agent A --> controller: the layout, step id; it sends every
        other node's share of the tasks to that node's agent (step_start), which passes it to the
        job's step server there (job/stepd.py)
    step server (node B) --step_output/step_exit--> agent B --> controller --> agent A --> srun

Who may do what, from the kernel's word (SO_PEERCRED) alone: a step server is the main process
of a live run of its job here (its pid is the run's); srun may create steps only in a job whose
run here belongs to its uid, and signal only the steps it created. The socket is open to every
user (0666) but a uid with no live run here is closed at accept, and each uid has a bounded
number of connections; every body is checked (protocol/steps.py) before it goes on.

Nothing here is kept on disk: a step's routing lives in the controller and in these connections.
An agent restart drops them; step servers connect again and send on (srun's output waits).
"""
from __future__ import annotations

import asyncio
import collections
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import timeouts
from ..protocol import steps as wire
from ..protocol.codec import client_limits
from ..protocol.runspec import check_keys, nonneg_int, valid_signal
from ..transport.rpc import ConnectionLost, RequestError, RpcConnection, RpcError, RpcTable, refusing
from ..transport.unix import GatedServer, bind_socket, peer_credentials
from . import contain, launcher, spool
from .runs import retrieved

if TYPE_CHECKING:
    from .daemon import Agent

log = logging.getLogger(__name__)

MAX_CONNECTIONS_PER_UID = 64
MAX_REQUEST_BYTES = 4 * 1024 * 1024  # srun's environment and command, a task's output chunk
SERVER_WAIT = 60.0  # a step may come before the node's step server has started and connected
CONTROLLER_TIMEOUT = 60.0
MAX_ANNOUNCED = 4096  # (job, attempt) pairs whose "I can resume" was passed on: each once

Key = tuple[int, int]


class Caller:
    """One connection on the step socket, and what it registered."""

    def __init__(self, pid: int, uid: int) -> None:
        self.pid, self.uid = pid, uid
        self.conn: RpcConnection | None = None
        self.serves: Key | None = None  # a step server: its run
        self.steps: set[tuple[int, int]] = set()  # srun: (job, step) it created and still waits for
        self.attempts: dict[tuple[int, int], int] = {}  # srun: each of its steps' run (attempt)

    def __str__(self) -> str:
        return f"pid {self.pid} uid {self.uid}"


def _link_old_path(old: Path, target: str) -> None:
    """The socket's path before it had a directory of its own, for jobs started then (their
    HAI_STEP_SOCKET names it): a link in the spool, root's."""
    try:
        if os.readlink(old) == target:
            return
    except OSError:
        pass
    try:
        os.unlink(old)
    except FileNotFoundError:
        pass
    os.symlink(target, old)


class StepRelay:
    def __init__(self, agent: "Agent") -> None:
        self.agent = agent
        self.servers: dict[Key, Caller] = {}
        self.server_joined = asyncio.Condition()
        self.sruns: dict[tuple[int, int], Caller] = {}
        self.per_uid: collections.Counter[int] = collections.Counter()
        self.connections: set[RpcConnection] = set()
        self.announced: set[tuple[int, int]] = set()
        self.teeing: set[tuple[int, int]] = set()  # (job, step): srun copies its tasks' output for sattach
        self.gate: GatedServer | None = None
        self.user_table = self._user_table()

    # -- the socket --

    def open(self) -> None:
        path = str(spool.step_socket(self.agent.cfg.spool))
        sock = bind_socket(path, 0o666, "agent step socket")
        fd = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            os.fchmod(fd, 0o755)  # every job's user reaches the socket (whatever the umask); none writes here
        finally:
            os.close(fd)
        _link_old_path(Path(self.agent.cfg.spool) / spool.STEP_SOCKET, f"{spool.STEP_DIR}/{spool.STEP_SOCKET}")
        self.gate = GatedServer(sock, self.on_client, refused=self._refused)

    def close(self) -> None:
        if self.gate is not None:
            self.gate.close()
        for conn in list(self.connections):
            asyncio.ensure_future(conn.close())

    def _refused(self, uid: int) -> bool:
        if uid < 0 or self.per_uid[uid] >= MAX_CONNECTIONS_PER_UID:
            return True
        return not any(r.spec is not None and r.spec.uid == uid and not r.status.ended
                       for r in self.agent.runs.runs.values())

    async def on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        pid, uid, _ = peer_credentials(writer)
        caller = Caller(pid, uid)
        conn = RpcConnection(reader, writer, table=self.user_table, context=caller, name=f"step client {caller}",
                             limits=client_limits(MAX_REQUEST_BYTES), frame_timeout=self.agent.cfg.frame_timeout,
                             max_in_flight=16)
        caller.conn = conn
        self.per_uid[uid] += 1
        self.connections.add(conn)
        try:
            await conn.run()
        finally:
            self.connections.discard(conn)
            self.per_uid[uid] -= 1
            if self.per_uid[uid] <= 0:
                del self.per_uid[uid]
            await conn.close()
            self._drop(caller)

    def _drop(self, caller: Caller) -> None:
        if caller.serves is not None and self.servers.get(caller.serves) is caller:
            del self.servers[caller.serves]
        for key in caller.steps:
            if self.sruns.get(key) is caller:
                del self.sruns[key]
                self.teeing.discard(key)
                # srun went away before its tasks ended: as in Slurm, the step goes with it
                asyncio.ensure_future(self._srun_gone(key, caller.attempts.get(key))).add_done_callback(retrieved)

    async def _srun_gone(self, key: tuple[int, int], attempt: int | None) -> None:
        await self._to_controller("step_signal", {"job_id": key[0], "step_id": key[1], "signal": 9})
        if attempt is not None:
            await self._to_controller("step_end", {"job_id": key[0], "attempt": attempt, "step_id": key[1],
                                                   "exit_code": None, "signal": 9, "cancelled": True})

    # -- what srun and the step servers may ask --

    def _live_run(self, job_id: int, uid: int):
        for key, run in self.agent.runs.runs.items():
            if key[0] == job_id and run.spec is not None and not run.status.ended:
                if run.spec.uid != uid:
                    break
                return run
        raise RequestError(f"job {job_id} has no running part owned by you on node {self.agent.cfg.name}")

    async def _to_controller(self, method: str, body: dict) -> Any:
        """The controller's answer; while its link is down (a restart of either daemon), wait for it."""
        try:
            await timeouts.wait_for(self.agent.controller_up.wait(), CONTROLLER_TIMEOUT)
        except asyncio.TimeoutError:
            raise RequestError(f"node {self.agent.cfg.name} has had no link to the controller for "
                               f"{CONTROLLER_TIMEOUT:g} s") from None
        conn = self.agent.controller
        try:
            return await conn.call(method, body, timeout=CONTROLLER_TIMEOUT)
        except RpcError as exc:
            raise RequestError(str(exc)) from None
        except (ConnectionLost, asyncio.TimeoutError) as exc:
            raise RequestError(f"the controller did not answer: {exc or 'timeout'}") from None

    async def _tell_resumable(self, job_id: int, uid: int) -> None:
        try:
            await self._to_controller("job_resumable", {"job_id": job_id, "uid": uid})
        except RequestError as exc:
            log.warning("job %d said it can resume; the controller was not told: %s", job_id, exc)

    def _user_table(self) -> RpcTable:
        table = RpcTable()

        async def step_create(body: Any, caller: Caller) -> dict:
            check_keys("step_create body", body, ("job_id", "request", "argv", "cwd", "env"), ("io",))
            job_id = nonneg_int("job_id", body["job_id"])
            request = wire.step_request(body["request"])
            argv, cwd, env = wire.command(body)
            io = wire.step_io(body.get("io"))
            if io.pty:
                raise RequestError("--pty starts a terminal for salloc's or your own srun only")
            run = self._live_run(job_id, caller.uid)
            reply = await self._to_controller("step_create", {
                "job_id": job_id, "attempt": run.spec.attempt, "uid": caller.uid,
                "request": wire.request_to_wire(request), "argv": argv, "cwd": cwd, "env": env,
                "io": io.to_wire()})
            if "refused" in reply:
                return reply
            step = reply["layout"]["step_id"]
            self.sruns[(job_id, step)] = caller  # before any task can start: their output comes here
            caller.steps.add((job_id, step))
            caller.attempts[(job_id, step)] = run.spec.attempt
            try:
                await self._to_controller("step_launch", {"job_id": job_id, "step_id": step})
            except RequestError:
                self._done(caller, (job_id, step))
                raise
            return {**reply, "node": self.agent.cfg.name}

        async def job_resumable(body: Any, caller: Caller) -> dict:
            """hai_cluster.job in a job's process: the job resumes after a preemption. Answered at
            once (a job never waits on the controller's link); told to the controller behind it."""
            check_keys("job_resumable body", body, ("job_id",))
            job_id = nonneg_int("job_id", body["job_id"])
            key = (job_id, self._live_run(job_id, caller.uid).spec.attempt)
            if key not in self.announced:  # each rank's processes say it: the controller hears it once a run
                if len(self.announced) >= MAX_ANNOUNCED:
                    self.announced.clear()  # a later repeat costs one more call, nothing else
                self.announced.add(key)
                asyncio.ensure_future(self._tell_resumable(job_id, caller.uid)).add_done_callback(retrieved)
            return {"ok": True}

        async def step_done(body: Any, caller: Caller) -> dict:
            """srun has every task's end: the step's routing here can go, and its end is recorded."""
            check_keys("step_done body", body, ("job_id", "step_id"), ("exit_code", "signal", "cancelled"))
            key = (nonneg_int("job_id", body["job_id"]), nonneg_int("step_id", body["step_id"]))
            if self.sruns.get(key) is not caller:
                raise RequestError(f"step {key[0]}.{key[1]} was not created by this srun")
            attempt = caller.attempts.get(key)
            self._done(caller, key)
            end = {"exit_code": body.get("exit_code"), "signal": body.get("signal"),
                   "cancelled": body.get("cancelled", False)}
            return await self._to_controller("step_end", {"job_id": key[0], "attempt": attempt, "step_id": key[1],
                                                          **end}) if attempt is not None else {}

        async def step_serve(body: Any, caller: Caller) -> dict:
            check_keys("step_serve body", body, ("job_id",))
            job_id = nonneg_int("job_id", body["job_id"])
            run = self._live_run(job_id, caller.uid)
            pid = run.status.pid if run.status.pid is not None else launcher.job_record(run.dir).get("pid")
            if not run.spec.step_server:
                raise RequestError(f"job {job_id} runs its script on node {self.agent.cfg.name}, not a step server")
            if pid is None:
                raise RequestError("not yet: the run's start is still being recorded")
            # The run's main process; in an image, the runtime is, and the server one of its own
            if pid != caller.pid and not (run.spec.container_image
                                          and caller.pid in contain.members_recorded(run.dir, pid)):
                raise RequestError(f"pid {caller.pid} is not job {job_id}'s step server")
            async with self.server_joined:
                self.servers[run.spec.key] = caller
                caller.serves = run.spec.key
                self.server_joined.notify_all()
            log.info("job %s.%s: step server pid %d connected", *run.spec.key, caller.pid)
            return {"attempt": run.spec.attempt, "node": self.agent.cfg.name}

        async def step_output(body: Any, caller: Caller) -> dict:
            job, step, task, stream, data = wire.output(body)
            key = self._served(caller, job)
            return await self._to_controller("step_output", {**body, "attempt": key[1]})

        async def step_exit(body: Any, caller: Caller) -> dict:
            job = wire.task_exit(body)[0]
            key = self._served(caller, job)
            return await self._to_controller("step_exit", {**body, "attempt": key[1]})

        async def step_signal(body: Any, caller: Caller) -> dict:
            check_keys("step_signal body", body, ("job_id", "step_id", "signal"))
            key = (nonneg_int("job_id", body["job_id"]), nonneg_int("step_id", body["step_id"]))
            valid_signal("signal", body["signal"])
            if self.sruns.get(key) is not caller:
                raise RequestError(f"step {key[0]}.{key[1]} was not created by this srun")
            return await self._to_controller("step_signal", body)

        async def step_input(body: Any, caller: Caller) -> dict:
            """srun's stdin for its tasks on other nodes (its own node's it writes itself): one chunk,
            the next once this one is in (the reply), as a client's through the controller."""
            check_keys("step_input body", body, ("job_id", "step_id", "task", "data", "eof"))
            key = (nonneg_int("job_id", body["job_id"]), nonneg_int("step_id", body["step_id"]))
            task = None if body["task"] is None else nonneg_int("task", body["task"])
            data, eof = wire.stdin_chunk(body)
            if self.sruns.get(key) is not caller:
                raise RequestError(f"step {key[0]}.{key[1]} was not created by this srun")
            return await self._to_controller("step_input", {"job_id": key[0], "step_id": key[1], "task": task,
                                                            "data": data, "eof": eof})

        async def step_tee_data(body: Any, caller: Caller) -> dict:
            """srun's copy of its own tasks' output and ends, while the controller asked for it (a
            sattach is attached): checked, and passed on. The answer says whether it is still wanted."""
            check_keys("step_tee_data body", body, ("job_id", "step_id", "lost", "events"))
            key = (nonneg_int("job_id", body["job_id"]), nonneg_int("step_id", body["step_id"]))
            lost = nonneg_int("lost", body["lost"])
            events = wire.tee_events(body["events"], key[1])
            if self.sruns.get(key) is not caller:
                raise RequestError(f"step {key[0]}.{key[1]} was not created by this srun")
            attempt = caller.attempts.get(key)
            if key not in self.teeing or attempt is None:
                return {"wanted": False}
            reply = await self._to_controller("step_tee_data", {
                "job_id": key[0], "attempt": attempt, "step_id": key[1], "lost": lost,
                "events": [e.to_wire() for e in events]})
            wanted = isinstance(reply, dict) and reply.get("wanted") is True
            if not wanted:
                self.teeing.discard(key)
            return {"wanted": wanted}

        for fn in (step_create, step_done, step_serve, step_output, step_exit, step_signal, job_resumable,
                   step_input, step_tee_data):
            table.add(fn.__name__, refusing(fn, ValueError))  # SpecError and the like
        return table

    def _done(self, caller: Caller, key: tuple[int, int]) -> None:
        self.teeing.discard(key)
        caller.steps.discard(key)
        caller.attempts.pop(key, None)
        if self.sruns.get(key) is caller:
            del self.sruns[key]

    def _served(self, caller: Caller, job: int) -> Key:
        # the job's registered step server itself: another connection from the run's pid (its
        # code is the user's) does not multiply what may be in flight to the controller
        if caller.serves is None or caller.serves[0] != job or self.servers.get(caller.serves) is not caller:
            raise RequestError(f"this connection is not job {job}'s step server")
        return caller.serves

    # -- what the controller asks (service.py adds these to the agent's table) --

    async def _server(self, key: Key) -> Caller:
        async with self.server_joined:
            try:
                await timeouts.wait_for(self.server_joined.wait_for(lambda: key in self.servers), SERVER_WAIT)
            except asyncio.TimeoutError:
                raise RequestError(f"job {key[0]}'s step server on node {self.agent.cfg.name} did not connect "
                                   f"within {SERVER_WAIT:g} s") from None
            return self.servers[key]

    async def start(self, body: Any) -> dict:
        check_keys("step_start body", body, ("job_id", "attempt", "layout", "argv", "cwd", "env", "master_addr"),
                   ("io", "client"))
        key = (nonneg_int("job_id", body["job_id"]), nonneg_int("attempt", body["attempt"]))
        run = self.agent.runs.get(key)
        if run is None or run.status.ended:
            raise RequestError(f"job {key[0]} is not running on node {self.agent.cfg.name}")
        server = await self._server(key)
        passed = ("layout", "argv", "cwd", "env", "master_addr", "io", "client")
        try:
            return await server.conn.call("start", {k: body[k] for k in passed if k in body}
                                          | {"node": self.agent.cfg.name}, timeout=CONTROLLER_TIMEOUT)
        except RpcError as exc:
            raise RequestError(str(exc)) from None
        except (ConnectionLost, asyncio.TimeoutError) as exc:
            raise RequestError(f"job {key[0]}'s step server on node {self.agent.cfg.name} did not answer: {exc}") from None

    async def signal(self, body: Any) -> dict:
        check_keys("step_signal body", body, ("job_id", "attempt", "step_id", "signal"))
        key = (nonneg_int("job_id", body["job_id"]), nonneg_int("attempt", body["attempt"]))
        server = self.servers.get(key)
        if server is None:
            return {"signalled": 0}
        try:
            return await server.conn.call("signal", {"step_id": body["step_id"], "signal": body["signal"]}, timeout=10)
        except (RpcError, ConnectionLost, asyncio.TimeoutError):
            return {"signalled": 0}

    async def to_server(self, method: str, body: Any) -> dict:
        """A client step's stdin (`input`), its terminal's size (`resize`), or the end of an
        allocation (`release`), from the controller to the run's step server here."""
        fields = {"input": ("step_id", "task", "data", "eof"), "resize": ("step_id", "rows", "cols"),
                  "release": ("exit_code",)}[method]
        check_keys(f"step_{method} body", body, ("job_id", "attempt", *fields))
        key = (nonneg_int("job_id", body["job_id"]), nonneg_int("attempt", body["attempt"]))
        server = self.servers.get(key)
        if server is None:
            raise RequestError(f"job {key[0]} has no step server on node {self.agent.cfg.name}")
        try:  # the step server checks the fields; a terminal that takes no input waits up to the timeout
            return await server.conn.call(method, {k: body[k] for k in fields}, timeout=CONTROLLER_TIMEOUT)
        except RpcError as exc:
            raise RequestError(str(exc)) from None
        except (ConnectionLost, asyncio.TimeoutError) as exc:
            if method == "release":  # it exits as it answers
                return {"released": True}
            raise RequestError(f"job {key[0]}'s step server on node {self.agent.cfg.name} did not answer: "
                               f"{exc or 'timeout'}") from None

    async def tee(self, body: Any) -> dict:
        """The controller starts (a sattach attached) or stops (none is left) the copy of a step's
        tasks on this node, srun's own: srun is asked, and its replay passed back, checked."""
        check_keys("step_tee body", body, ("job_id", "step_id", "on"))
        key = (nonneg_int("job_id", body["job_id"]), nonneg_int("step_id", body["step_id"]))
        if not isinstance(body["on"], bool):
            raise RequestError("on must be true or false")
        srun = self.sruns.get(key)
        if srun is None:
            self.teeing.discard(key)
            return {"srun": False, "events": []}
        if body["on"]:
            self.teeing.add(key)
        else:
            self.teeing.discard(key)
        try:
            reply = await srun.conn.call("tee", {"step_id": key[1], "on": body["on"]}, timeout=10)
            check_keys("srun's tee reply", reply, ("events",))
            events = wire.tee_events(reply["events"], key[1])
        except (RpcError, ConnectionLost, asyncio.TimeoutError, ValueError) as exc:
            self.teeing.discard(key)
            raise RequestError(f"the srun of step {key[0]}.{key[1]} on node {self.agent.cfg.name} cannot copy its "
                               f"tasks' output: {exc or 'no answer'}") from None
        return {"srun": True, "events": [e.to_wire() for e in events]}

    async def deliver(self, kind: str, body: Any) -> dict:
        """A remote task's output or end, to the srun that waits for it here."""
        if kind == "output":
            job, step, task, stream, data = wire.output(body, "attempt")
            message = {"step_id": step, "task": task, "seq": body["seq"], "stream": stream, "data": data}
        else:
            job, step, task, code, sig = wire.task_exit(body, "attempt")
            message = {"step_id": step, "task": task, "exit_code": code, "signal": sig}
        srun = self.sruns.get((job, step))
        if srun is None:
            return {"delivered": False}
        try:
            await srun.conn.push(kind, message)
        except ConnectionLost:
            return {"delivered": False}
        return {"delivered": True}
