"""How the agent starts a run's shepherd: forked by the shepherd zygote (zygote.py; `[agent]
shepherd_start = "fork"`, the default), or as a fresh interpreter, `python -m
hai_cluster.agent.shepherd RUN_DIR` ("exec"). Either way the shepherd gets the same run dir,
launch report pipe and log, and daemonizes the same way; what follows (the launch report, the
spool) does not know how it was started.

A launch never fails because of the zygote: if it is dead, hung or refuses, that launch goes the
exec way, the zygote is replaced (at once if it had served, else at most every RESPAWN_AFTER
seconds: one that cannot start must not be restarted for every launch), and a warning is logged
once until a zygote serves again. A run is never started twice: the zygote's child acknowledges
the request itself before it does anything else, and a request the agent gave up on (its end shut
down) cannot be acknowledged any more, so its child exits (zygote.py).
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from .. import timeouts
from ..core.envfilter import helper_env
from . import spool

log = logging.getLogger(__name__)

MODES = ("fork", "exec")
ZYGOTE_MODULE = "hai_cluster.agent.zygote"
READY_TIMEOUT = 15.0  # the zygote's start: an interpreter and the shepherd's imports, on a busy node
ACK_TIMEOUT = 5.0  # a fork and one message
RESPAWN_AFTER = 5.0


class ZygoteFailed(Exception):
    """The zygote is unusable: dead, hung, or answering nonsense."""


class Refused(Exception):
    """The zygote refused this request (it is fine; this run goes the exec way)."""


def room_for(runs_dir: str | os.PathLike) -> int:
    """The zygote's blank argument: room for `-m hai_cluster.agent.shepherd RUN_DIR` in its
    argument area, for run dirs <runs_dir>/<job>.<attempt> with ids of up to 30 digits."""
    return len(str(runs_dir)) + 64 + max(0, len(spool.SHEPHERD_MODULE) - len(ZYGOTE_MODULE))


class ShepherdStarter:
    def __init__(self, mode: str = "fork", room: int = 4096, ack_timeout: float = ACK_TIMEOUT,
                 ready_timeout: float = READY_TIMEOUT, respawn_after: float = RESPAWN_AFTER) -> None:
        if mode not in MODES:
            raise ValueError(f"shepherd start mode must be one of {', '.join(MODES)}, got {mode!r}")
        self.mode, self.room = mode, room
        self.ack_timeout, self.ready_timeout, self.respawn_after = ack_timeout, ready_timeout, respawn_after
        self.proc: subprocess.Popen | None = None  # the zygote
        self.sock: socket.socket | None = None
        self.ready = False
        self.spawned_at = -respawn_after
        self.warned = False
        self.lock = asyncio.Lock()
        self.counts = {"fork": 0, "exec": 0}  # how the shepherds were started (tests, benchmarks)

    @property
    def zygote_pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.sock is not None else None

    def open(self) -> None:
        """Start the zygote (fork mode): it imports while the agent finishes its own start."""
        if self.mode == "fork":
            self._spawn()

    def close(self) -> None:
        """The zygote exits when its socket closes; the shepherds it forked outlive it (their own
        sessions, nothing waits for them)."""
        self._drop(kill=False)

    def _drop(self, kill: bool) -> None:
        """Close our end of the zygote's socket (it exits then) and reap it; `kill`: one that is
        unusable may not read its socket any more (never its children, the shepherds)."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.proc is not None:
            if kill:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(1.0)
            self.proc = None

    async def start(self, run_dir: Path, report_w: int, log_fd: int) -> asyncio.subprocess.Process | None:
        """Start run_dir's shepherd with the report pipe's write end and its log (the caller keeps
        and closes both). Returns the process to reap for an exec (its first fork exits at once),
        None for a fork (the zygote reaps)."""
        if self.mode == "fork":
            async with self.lock:
                try:
                    await self._fork(run_dir, report_w, log_fd)
                    self.counts["fork"] += 1
                    return None
                except Refused as exc:
                    log.warning("%s: the shepherd zygote refused the run (%s); starting its shepherd "
                                "with a fresh interpreter", run_dir, exc)
                except ZygoteFailed as exc:
                    self._failed(str(exc))
                except asyncio.CancelledError:  # mid-request: its answer would be taken for the next one's
                    self._failed("a launch was cancelled while it forked", respawn=False)
                    raise
        self.counts["exec"] += 1
        return await asyncio.create_subprocess_exec(
            *spool.shepherd_argv(run_dir), stdin=asyncio.subprocess.DEVNULL, stdout=log_fd, stderr=log_fd,
            pass_fds=(report_w,),
            env={**helper_env(os.environ), "HAI_REPORT_FD": str(report_w)})

    # -- the zygote --

    def _spawn(self) -> None:
        self.spawned_at = time.monotonic()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            # Same interpreter, cwd and environment as an exec'd shepherd; its own session, so that
            # no terminal's or process group's signal meant for the agent reaches it.
            self.proc = subprocess.Popen([sys.executable, "-m", ZYGOTE_MODULE, " " * self.room],
                                         stdin=theirs, stdout=subprocess.DEVNULL, env=helper_env(os.environ),
                                         start_new_session=True)
        except OSError as exc:
            ours.close()
            self._failed(f"cannot start it: {exc}", respawn=False)
            return
        finally:
            theirs.close()
        ours.setblocking(False)
        self.sock, self.ready = ours, False
        log.debug("shepherd zygote started: pid %d", self.proc.pid)

    async def _fork(self, run_dir: Path, report_w: int, log_fd: int) -> None:
        if self.sock is None and time.monotonic() - self.spawned_at >= self.respawn_after:
            self._spawn()
        if self.sock is None:
            raise ZygoteFailed("not running")
        if not self.ready:
            hello = await self._reply(self.ready_timeout, "its start", acked=False)
            if "ready" not in hello:
                raise ZygoteFailed(str(hello.get("error") or f"unexpected greeting {hello!r}"))
            self.ready = True
            log.info("shepherd zygote pid %d ready: shepherds are forked from it", self.proc.pid)
            self.warned = False
        request = json.dumps({"run_dir": str(run_dir)}).encode()
        try:
            socket.send_fds(self.sock, [request], [report_w, log_fd])
        except OSError as exc:  # EPIPE: it died; EAGAIN: it does not read
            raise ZygoteFailed(f"cannot send it the request: {exc}") from None
        reply = await self._reply(self.ack_timeout, "the fork", acked=True)
        if "forked" in reply:
            return
        if "error" in reply:
            raise Refused(str(reply["error"]))
        raise ZygoteFailed(f"unexpected reply {reply!r}")

    async def _reply(self, timeout: float, what: str, acked: bool) -> dict:
        """The next message; `acked`: it may come from a child, which must not go on once we gave up."""
        try:
            data = await timeouts.wait_for(self._recv(), timeout)
        except asyncio.TimeoutError:
            data = self._give_up() if acked else None
            if data is None:
                raise ZygoteFailed(f"no answer within {timeout:g} s, waiting for {what}") from None
            self._failed(f"it answered only after {timeout:g} s")  # the run goes on; the zygote is replaced
        except OSError as exc:
            raise ZygoteFailed(f"reading its socket failed: {exc}") from None
        if not data:
            status = self.proc.poll()
            raise ZygoteFailed("it exited" + (f" (status {status})" if status is not None else ""))
        try:
            reply = json.loads(data)
        except ValueError:
            reply = None
        if not isinstance(reply, dict):
            raise ZygoteFailed(f"unreadable reply {data[:200]!r}")
        return reply

    async def _recv(self) -> bytes:
        """The next message, taken off the socket only when this task runs: a timeout that
        cancels the wait never drops a message already read (loop.sock_recv reads in a callback,
        and a cancel between that and our turn lost it: a child that had acknowledged then ran
        beside the shepherd started in its place). _give_up finds such a message queued."""
        loop = asyncio.get_running_loop()
        fd = self.sock.fileno()
        while True:
            try:
                return self.sock.recv(65536)
            except BlockingIOError:
                pass
            readable = loop.create_future()
            loop.add_reader(fd, lambda: readable.done() or readable.set_result(None))
            try:
                await readable
            finally:
                loop.remove_reader(fd)

    def _give_up(self) -> bytes | None:
        """After a timeout: shut our end, so that no child can acknowledge from now on, then take
        what was acknowledged before that (the shepherd of such a request is on its way)."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
            data = self.sock.recv(65536)
        except OSError:  # BlockingIOError: nothing was queued
            return None
        return data or None

    def _failed(self, reason: str, respawn: bool = True) -> None:
        """Replace an unusable zygote (kill it: never its children, the shepherds)."""
        if not self.warned:
            log.warning("shepherd zygote unusable (%s): starting shepherds with a fresh interpreter "
                        "until a new zygote serves", reason)
            self.warned = True
        else:
            log.debug("shepherd zygote unusable: %s", reason)
        self._drop(kill=True)
        served, self.ready = self.ready, False
        # at once for one that had served (killed, say); one that died starting waits a while
        if respawn and (served or time.monotonic() - self.spawned_at >= self.respawn_after):
            self._spawn()
