"""One node's tasks of a job step, as the job's user: start them, carry their output in whole
lines, report how each ended. srun runs its own node's tasks with this; the step server
(stepd.py) the tasks of the other nodes.

Tasks stay in the caller's process group and cgroup (the job's), so the job's cancel, time limit
and preemption reach them like everything else of the job. A task's output is passed on only in
whole lines (a line longer than MAX_LINE in pieces of that size), and the next read waits until
the last piece was taken: a slow reader slows the task down, nothing is dropped.
"""
from __future__ import annotations

import asyncio
import os
import shutil
import signal
from typing import Awaitable, Callable, Iterable, Mapping, Sequence

READ_CHUNK = 64 * 1024
MAX_LINE = 64 * 1024

Output = Callable[[int, str, bytes], Awaitable[None]]  # (procid, "out" | "err", whole lines)
Ended = Callable[[int, "int | None", "int | None"], Awaitable[None]]  # (procid, exit code, signal)

# $$ of this shell is the task's pid once it execs the command: Slurm's SLURM_TASK_PID
_SHIM = 'SLURM_TASK_PID=$$; export SLURM_TASK_PID; exec "$@"'


def exit_status(returncode: int) -> tuple[int | None, int | None]:
    """asyncio's returncode as (exit code, signal)."""
    return (None, -returncode) if returncode < 0 else (returncode, None)


class NodeTasks:
    def __init__(self, on_output: Output, on_exit: Ended) -> None:
        self.on_output, self.on_exit = on_output, on_exit
        self.procs: dict[int, asyncio.subprocess.Process] = {}
        self.watchers: list[asyncio.Task] = []

    async def start(self, argv: Sequence[str], cwd: str, envs: Iterable[tuple[int, Mapping[str, str]]]) -> None:
        for procid, env in envs:
            self.watchers.append(asyncio.ensure_future(self._run(procid, argv, cwd, dict(env))))
        await asyncio.sleep(0)  # let them spawn before a signal could be sent

    async def _run(self, procid: int, argv: Sequence[str], cwd: str, env: dict[str, str]) -> None:
        if not os.path.isdir(cwd):  # as slurmstepd: the task runs on, in /tmp
            await self.on_output(procid, "err", f"slurmstepd: error: couldn't chdir to `{cwd}': No such file "
                                               f"or directory: going to /tmp instead\n".encode())
            cwd = "/tmp"
        missing = _missing(argv[0], env.get("PATH", os.defpath), cwd)
        if missing is not None:
            await self.on_output(procid, "err", f"slurmstepd: error: execve(): {argv[0]}: {missing}\n".encode())
            await self.on_exit(procid, 2, None)
            return
        try:
            proc = await asyncio.create_subprocess_exec(
                "/bin/sh", "-c", _SHIM, "srun-task", *argv, cwd=cwd, env=env, stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        except OSError as exc:
            await self.on_output(procid, "err", f"slurmstepd: error: execve(): {argv[0]}: {exc.strerror}\n".encode())
            await self.on_exit(procid, 2, None)
            return
        self.procs[procid] = proc
        await asyncio.gather(self._pump(procid, "out", proc.stdout), self._pump(procid, "err", proc.stderr))
        code, sig = exit_status(await proc.wait())
        del self.procs[procid]
        await self.on_exit(procid, code, sig)

    async def _pump(self, procid: int, stream: str, reader: asyncio.StreamReader) -> None:
        buf = b""
        while True:
            data = await reader.read(READ_CHUNK)
            if not data:
                if buf:
                    await self.on_output(procid, stream, buf)
                return
            buf += data
            cut = buf.rfind(b"\n") + 1
            if cut == 0 and len(buf) >= MAX_LINE:
                cut = len(buf)
            if cut:
                out, buf = buf[:cut], buf[cut:]
                await self.on_output(procid, stream, out)

    def signal(self, sig: int) -> int:
        """Send `sig` to every task still running; how many."""
        sent = 0
        for proc in list(self.procs.values()):
            try:
                proc.send_signal(sig)
                sent += 1
            except ProcessLookupError:
                pass
        return sent

    async def wait(self) -> None:
        if self.watchers:
            await asyncio.gather(*self.watchers)

    @property
    def running(self) -> bool:
        return any(not w.done() for w in self.watchers)


def _missing(cmd: str, path: str, cwd: str) -> str | None:
    """Why `cmd` cannot be executed, or None: the message execve's errno would give."""
    if "/" in cmd:
        full = cmd if cmd.startswith("/") else os.path.join(cwd, cmd)
        if not os.path.exists(full):
            return "No such file or directory"
        if os.path.isdir(full) or not os.access(full, os.X_OK):
            return "Permission denied"
        return None
    return None if shutil.which(cmd, path=path) else "No such file or directory"


SIGNAL_NAMES = {signal.SIGKILL: "Killed", signal.SIGTERM: "Terminated", signal.SIGINT: "Interrupt",
                signal.SIGSEGV: "Segmentation fault", signal.SIGABRT: "Aborted", signal.SIGHUP: "Hangup",
                signal.SIGBUS: "Bus error", signal.SIGUSR1: "User defined signal 1",
                signal.SIGUSR2: "User defined signal 2", signal.SIGPIPE: "Broken pipe"}


def describe_end(node: str, procid: int, code: int | None, sig: int | None) -> str | None:
    """srun's error line for a task that did not exit 0 (None for one that did)."""
    if sig:
        return f"{node}: task {procid}: {SIGNAL_NAMES.get(sig, f'Signal {sig}')}"
    if code:
        return f"{node}: task {procid}: Exited with exit code {code}"
    return None
