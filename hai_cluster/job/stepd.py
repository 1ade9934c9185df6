"""The step server: what a job runs on each of its nodes after the first (`python -m
hai_cluster.job.stepd`, as the job's user, in the job's cgroup and environment). The batch script
runs once, on the first node; `srun` there asks for a step, and the controller has the agent of
every other node of the step pass its share of the tasks to this server, which starts them
(job/tasks.py) and sends their output and ends back the same way.

It talks to its node's agent over $HAI_STEP_SOCKET, which knows it by its pid (the run's main
process). It lives as long as the job holds the node: a stop of the job (cancel, preemption, time
limit) signals it with everything else of the job; it then waits for its tasks (they got the
signal too; a task on a terminal is hung up) so that what they print while they checkpoint still
reaches srun, and exits. If the agent restarts, it connects again and sends what was waiting; the
tasks wait meanwhile.

In an allocation of salloc or srun (JobSpec.interactive) every node runs it, the first too, and
the steps come from a client through the controller: they may have stdin and a terminal
(`input`, `resize`). The first node's server ends the allocation: `release` kills what is left of
its steps and exits with the client's exit code, which is then the job's.
"""
from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import Any

from ..core.steps import layout_from_wire, task_environment
from ..protocol import steps as wire
from ..protocol.runspec import SpecError, check_keys, nonneg_int, valid_signal
from ..transport.rpc import ConnectionLost, RequestError, RpcConnection, RpcError, RpcTable
from . import preempt_signal
from .tasks import NodeTasks

RECONNECT = 0.5  # seconds between attempts to reach the agent
BUSY_RETRY = 0.5  # seconds before a chunk its reader had no room for is offered again
REGISTER_TRIES = 120  # the agent may not have recorded our pid yet when we first ask


class StepServer:
    def __init__(self, job_id: int, socket_path: str) -> None:
        self.job_id, self.path = job_id, socket_path
        self.conn: RpcConnection | None = None
        self.connected = asyncio.Event()
        self.steps: dict[int, NodeTasks] = {}
        self.stopping = False
        self.node_env = dict(os.environ)
        self.exit_code = 0
        self.released = asyncio.Event()

    def table(self) -> RpcTable:
        table = RpcTable()

        async def start(body: Any, ctx: Any) -> dict:
            try:
                check_keys("start body", body, ("layout", "argv", "cwd", "env", "master_addr", "node"),
                           ("io", "client"))
                layout = layout_from_wire(body["layout"])
                argv, cwd, env = wire.command(body)
                io = wire.step_io(body.get("io"))
            except (SpecError, ValueError) as exc:
                raise RequestError(str(exc)) from None
            if layout.job_id != self.job_id or layout.step_id in self.steps:
                raise RequestError(f"step {layout.job_id}.{layout.step_id} is not this server's to start")
            if self.stopping:
                raise RequestError(f"job {self.job_id} is ending on this node")
            mine = layout.on(body["node"])
            tasks = NodeTasks(self._sender(layout.step_id), self._exit_sender(layout.step_id),
                              unbuffered=io.unbuffered)
            self.steps[layout.step_id] = tasks
            master = body["master_addr"] if isinstance(body["master_addr"], str) else ""
            # A client's environment is the submit host's: the job's own variables come from here
            base = {**self.node_env, **env} if body.get("client") is True else env
            await tasks.start(argv, cwd, [(t.procid, task_environment(base, self.node_env, layout, t, master))
                                          for t in mine],
                              stdin=[t.procid for t in mine if io.reads_input(t.procid)],
                              pty=0 if io.pty and any(t.procid == 0 for t in mine) else None,
                              size=(io.rows, io.cols))
            asyncio.ensure_future(self._forget(layout.step_id, tasks))
            return {"started": len(mine)}

        async def signal_step(body: Any, ctx: Any) -> dict:
            try:
                check_keys("signal body", body, ("step_id", "signal"))
                step, sig = nonneg_int("step_id", body["step_id"]), valid_signal("signal", body["signal"])
            except SpecError as exc:
                raise RequestError(str(exc)) from None
            tasks = self.steps.get(step)
            return {"signalled": tasks.signal(sig) if tasks else 0}

        async def input_step(body: Any, ctx: Any) -> dict:
            try:
                check_keys("input body", body, ("step_id", "task", "data", "eof"))
                step = nonneg_int("step_id", body["step_id"])
                task = None if body["task"] is None else nonneg_int("task", body["task"])
                data, eof = wire.stdin_chunk(body)
            except SpecError as exc:
                raise RequestError(str(exc)) from None
            tasks = self.steps.get(step)
            return {"reached": await tasks.write_input(task, data, eof) if tasks else 0}

        async def resize(body: Any, ctx: Any) -> dict:
            try:
                check_keys("resize body", body, ("step_id", "rows", "cols"))
                step = nonneg_int("step_id", body["step_id"])
                rows, cols = wire.window(body)
            except SpecError as exc:
                raise RequestError(str(exc)) from None
            tasks = self.steps.get(step)
            return {"resized": tasks.resize(rows, cols) if tasks else False}

        async def release(body: Any, ctx: Any) -> dict:
            try:
                check_keys("release body", body, ("exit_code",))
                code = body["exit_code"]
                if not isinstance(code, int) or isinstance(code, bool) or not 0 <= code <= 255:
                    raise SpecError("exit_code must be 0-255")
            except SpecError as exc:
                raise RequestError(str(exc)) from None
            self.exit_code = code
            for tasks in self.steps.values():  # as Slurm's: steps still running go with the allocation
                tasks.hang_up()
                tasks.signal(signal.SIGKILL)
            self.released.set()
            return {"released": True}

        table.add("start", start)
        table.add("signal", signal_step)
        table.add("input", input_step)
        table.add("resize", resize)
        table.add("release", release)
        return table

    async def _forget(self, step: int, tasks: NodeTasks) -> None:
        await tasks.wait()
        self.steps.pop(step, None)

    def _sender(self, step: int):
        seqs: dict[int, int] = {}  # per task: its stdout and stderr share one count

        async def send(procid: int, stream: str, data: bytes) -> None:
            for i in range(0, len(data), wire.MAX_OUTPUT_CHUNK):
                seq = seqs.get(procid, 0)
                seqs[procid] = seq + 1
                await self.call("step_output", {"job_id": self.job_id, "step_id": step, "task": procid, "seq": seq,
                                                "stream": stream, "data": data[i:i + wire.MAX_OUTPUT_CHUNK]})
        return send

    def _exit_sender(self, step: int):
        async def send(procid: int, code: int | None, sig: int | None) -> None:
            await self.call("step_exit", {"job_id": self.job_id, "step_id": step, "task": procid,
                                          "exit_code": code, "signal": sig})
        return send

    async def call(self, method: str, body: dict) -> None:
        """Deliver to the agent, waiting out its restarts (the tasks wait behind this)."""
        while True:
            await self.connected.wait()
            conn = self.conn
            try:
                reply = await conn.call(method, body, timeout=None)
                if isinstance(reply, dict) and reply.get("busy"):  # its reader (an interactive srun) is behind
                    await asyncio.sleep(BUSY_RETRY)
                    continue
                return
            except ConnectionLost:
                await asyncio.sleep(RECONNECT)
            except RpcError as exc:  # refused: nobody to deliver it to any more; drop it
                print(f"hai stepd: {method} for job {self.job_id} refused: {exc}", file=sys.stderr)
                return

    async def serve(self) -> None:
        table = self.table()
        while True:
            try:
                reader, writer = await asyncio.open_unix_connection(self.path)
            except OSError:
                await asyncio.sleep(RECONNECT)
                continue
            conn = RpcConnection(reader, writer, table=table, name="agent")
            runner = asyncio.ensure_future(conn.run())
            try:
                await self._register(conn)
                self.conn = conn
                self.connected.set()
                await conn.wait_closed()
            except (ConnectionLost, RpcError, OSError) as exc:
                print(f"hai stepd: job {self.job_id}: {exc}", file=sys.stderr)
            finally:
                self.connected.clear()
                self.conn = None
                await conn.close()
                runner.cancel()
            await asyncio.sleep(RECONNECT)

    async def _register(self, conn: RpcConnection) -> None:
        for _ in range(REGISTER_TRIES):
            try:
                await conn.call("step_serve", {"job_id": self.job_id}, timeout=10)
                return
            except RpcError as exc:
                if "not yet" not in str(exc):
                    raise
            await asyncio.sleep(0.25)
        raise RpcError(f"the agent did not take job {self.job_id}'s step server")

    async def stop(self) -> None:
        """The job is being stopped: its tasks got the signal too; let what they print get out."""
        self.stopping = True
        for tasks in list(self.steps.values()):
            tasks.hang_up()
        for tasks in list(self.steps.values()):
            await tasks.wait()


async def amain() -> int:
    job = os.environ.get("SLURM_JOB_ID", "")
    path = os.environ.get("HAI_STEP_SOCKET", "")
    if not job.isdigit() or not path:
        print("hai stepd: not in a hai-cluster job (SLURM_JOB_ID and HAI_STEP_SOCKET unset)", file=sys.stderr)
        return 2
    server = StepServer(int(job), path)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    # A stop reaches every process of the job with the job's signal (--signal, e.g. submitit's
    # USR2), not only SIGTERM: it must not kill this server before its tasks' ends are reported
    # (srun would wait for them until the grace period ran out). Other user signals sent to the
    # whole job (hcancel -s USR1) are for the tasks: ignored here.
    own = ({preempt_signal()} & signal.valid_signals()) - {signal.SIGKILL, signal.SIGSTOP}
    stops = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP} | own
    for sig in stops:
        loop.add_signal_handler(sig, stop.set)
    for sig in {signal.SIGUSR1, signal.SIGUSR2} - stops:
        loop.add_signal_handler(sig, lambda: None)
    serving = asyncio.ensure_future(server.serve())
    released = asyncio.ensure_future(server.released.wait())
    await asyncio.wait([asyncio.ensure_future(stop.wait()), released], return_when=asyncio.FIRST_COMPLETED)
    await server.stop()
    if released.done():
        await asyncio.sleep(0.2)  # the answer to `release` on its way out
    serving.cancel()
    return server.exit_code


def main() -> None:
    sys.exit(asyncio.run(amain()))


if __name__ == "__main__":
    main()
