"""One node's tasks of a job step, as the job's user: start them, carry their output in whole
lines, report how each ended. srun runs its own node's tasks with this; the step server
(stepd.py) the tasks of the other nodes.

Tasks stay in the caller's process group and cgroup (the job's), so the job's cancel, time limit
and preemption reach them like everything else of the job. A task's output is passed on only in
whole lines (a line longer than MAX_LINE in pieces of that size; `unbuffered`, srun -u: as it
comes), and the next read waits until the last piece was taken: a slow reader slows the task down,
nothing is dropped.

A step started from a client (salloc's srun, srun outside a job) may also have stdin: the tasks
read what the client sends (`write_input`), or, for `srun --pty`, task 0 runs on a terminal
(terminal.py) in a session of its own (a terminal's job control needs one): a stop of the job
hangs its terminal up, as closing a terminal does.
"""
from __future__ import annotations

import asyncio
import os
import shutil
import signal
from typing import Awaitable, Callable, Iterable, Mapping, Sequence

from . import terminal

READ_CHUNK = 64 * 1024
MAX_LINE = 64 * 1024

Output = Callable[[int, str, bytes], Awaitable[None]]  # (procid, "out" | "err", whole lines)
Ended = Callable[[int, "int | None", "int | None"], Awaitable[None]]  # (procid, exit code, signal)

# $$ of this shell is the task's pid once it execs the command: Slurm's SLURM_TASK_PID
_SHIM = 'SLURM_TASK_PID=$$; export SLURM_TASK_PID; exec "$@"'


def exit_status(returncode: int) -> tuple[int | None, int | None]:
    """asyncio's returncode as (exit code, signal)."""
    return (None, -returncode) if returncode < 0 else (returncode, None)


def descendants(pid: int) -> list[int]:
    """The processes below `pid` (children, theirs, ...), from /proc: one walk of the table."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            out.append(child)
            todo.append(child)
    return out


class NodeTasks:
    def __init__(self, on_output: Output, on_exit: Ended, *, unbuffered: bool = False) -> None:
        self.on_output, self.on_exit = on_output, on_exit
        self.unbuffered = unbuffered
        self.procs: dict[int, asyncio.subprocess.Process] = {}
        self.watchers: list[asyncio.Task] = []
        self.stdin: frozenset[int] = frozenset()  # tasks whose stdin is a pipe write_input feeds (else /dev/null)
        self.pty: int | None = None  # the task on a terminal
        self.master: int | None = None  # its terminal's master side, while it runs
        self.starting = 0  # tasks not yet spawned (or failed to): input waits for them
        self.spawned = asyncio.Event()

    async def start(self, argv: Sequence[str], cwd: str, envs: Iterable[tuple[int, Mapping[str, str]]], *,
                    stdin: Iterable[int] = (), pty: int | None = None, size: tuple[int, int] = (24, 80)) -> None:
        """`stdin`: these tasks read what write_input sends; `pty`: that task runs on a terminal
        of `size` (rows, columns)."""
        self.stdin, self.pty = frozenset(stdin), pty
        envs = list(envs)
        self.starting = len(envs)
        if not envs:
            self.spawned.set()
        for procid, env in envs:
            run = self._run_pty(procid, argv, cwd, dict(env), size) if procid == pty else \
                self._run(procid, argv, cwd, dict(env))
            self.watchers.append(asyncio.ensure_future(run))
        await asyncio.sleep(0)  # let them spawn before a signal could be sent

    def _started(self) -> None:
        """One more task spawned, or failed to."""
        self.starting -= 1
        if self.starting <= 0:
            self.spawned.set()

    async def _cannot_start(self, procid: int, argv: Sequence[str], cwd: str, env: Mapping[str, str]) -> str | None:
        """Slurmstepd's complaint and the task's end when argv[0] cannot run; the directory to
        run in otherwise."""
        if not os.path.isdir(cwd):  # as slurmstepd: the task runs on, in /tmp
            await self.on_output(procid, "err", f"slurmstepd: error: couldn't chdir to `{cwd}': No such file "
                                               f"or directory: going to /tmp instead\n".encode())
            cwd = "/tmp"
        missing = _missing(argv[0], env.get("PATH", os.defpath), cwd)
        if missing is not None:
            self._started()
            await self.on_output(procid, "err", f"slurmstepd: error: execve(): {argv[0]}: {missing}\n".encode())
            await self.on_exit(procid, 2, None)
            return None
        return cwd

    async def _run_pty(self, procid: int, argv: Sequence[str], cwd: str, env: dict[str, str],
                       size: tuple[int, int]) -> None:
        cwd = await self._cannot_start(procid, argv, cwd, env)
        if cwd is None:
            return
        master, slave = terminal.open_pty(*size)
        try:
            proc = await asyncio.create_subprocess_exec(
                "/bin/sh", "-c", _SHIM, "srun-task", *argv, cwd=cwd, env=env, stdin=slave, stdout=slave,
                stderr=slave, start_new_session=True, preexec_fn=terminal.become_session_leader_of_tty)
        except OSError as exc:
            os.close(master)
            self._started()
            await self.on_output(procid, "err", f"slurmstepd: error: execve(): {argv[0]}: {exc.strerror}\n".encode())
            await self.on_exit(procid, 2, None)
            return
        finally:
            os.close(slave)  # the task holds it now: EIO on the master once every holder closed it
        self.procs[procid], self.master = proc, master
        self._started()
        exited = asyncio.Event()
        pumping = asyncio.ensure_future(terminal.pump(master, lambda data: self.on_output(procid, "out", data),
                                                      exited))
        code, sig = exit_status(await proc.wait())
        exited.set()
        await pumping
        del self.procs[procid]
        self.master = None
        os.close(master)  # hangs up what the task left behind on its terminal
        await self.on_exit(procid, code, sig)

    async def _run(self, procid: int, argv: Sequence[str], cwd: str, env: dict[str, str]) -> None:
        cwd = await self._cannot_start(procid, argv, cwd, env)
        if cwd is None:
            return
        try:
            proc = await asyncio.create_subprocess_exec(
                "/bin/sh", "-c", _SHIM, "srun-task", *argv, cwd=cwd, env=env,
                stdin=asyncio.subprocess.PIPE if procid in self.stdin else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        except OSError as exc:
            self._started()
            await self.on_output(procid, "err", f"slurmstepd: error: execve(): {argv[0]}: {exc.strerror}\n".encode())
            await self.on_exit(procid, 2, None)
            return
        self.procs[procid] = proc
        self._started()
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
            cut = len(buf) if self.unbuffered else buf.rfind(b"\n") + 1
            if cut == 0 and len(buf) >= MAX_LINE:
                cut = len(buf)
            if cut:
                out, buf = buf[:cut], buf[cut:]
                await self.on_output(procid, stream, out)

    async def write_input(self, procid: int | None, data: bytes, eof: bool) -> int:
        """The client's stdin, to task `procid` (None: every task here), as fast as they take it;
        `eof`: then their stdin ends (a terminal has no end: Ctrl-D is a byte like any other).
        How many tasks it reached: a task that ended or closed its stdin takes nothing more."""
        await self.spawned.wait()
        targets = [(p, proc) for p, proc in self.procs.items() if procid is None or p == procid]
        reached = 0
        for p, proc in targets:
            try:
                if p == self.pty:
                    if self.master is None:
                        continue
                    if data:
                        await terminal.write_all(self.master, data)
                elif proc.stdin is None:  # /dev/null: it reads nothing of it
                    continue
                else:
                    if data:
                        proc.stdin.write(data)
                        await proc.stdin.drain()
                    if eof:
                        proc.stdin.close()
                reached += 1
            except (OSError, RuntimeError):  # the task's end of the pipe is gone
                pass
        return reached

    def resize(self, rows: int, cols: int) -> bool:
        """The client's window changed: the terminal's too (its foreground processes get SIGWINCH)."""
        if self.master is None:
            return False
        try:
            terminal.set_size(self.master, rows, cols)
        except OSError:
            return False
        return True

    def signal(self, sig: int) -> int:
        """Send `sig` to every task still running; how many. A terminal's task gets it in its
        foreground process group too (where Ctrl-C would send it)."""
        sent = 0
        for procid, proc in list(self.procs.items()):
            if sig == signal.SIGKILL and procid != self.pty:
                # a step killed (its client gone, srun -K): what the task started goes too, not
                # only the shell that ran it (a pty's task: its session is hung up instead)
                for pid in descendants(proc.pid):
                    try:
                        os.kill(pid, sig)
                    except OSError:
                        pass
            try:
                proc.send_signal(sig)
                sent += 1
            except ProcessLookupError:
                continue
            if procid == self.pty and self.master is not None:
                try:
                    group = os.tcgetpgrp(self.master)
                    if group != proc.pid:
                        os.killpg(group, sig)
                except OSError:
                    pass
        return sent

    def hang_up(self) -> None:
        """The job is stopping: a terminal's session is hung up (an interactive shell ignores
        SIGTERM but not SIGHUP, and passes it to its jobs)."""
        proc = self.procs.get(self.pty) if self.pty is not None else None
        if proc is not None and self.master is not None:
            try:
                terminal.hang_up(self.master, proc.pid)
            except OSError:
                pass

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
