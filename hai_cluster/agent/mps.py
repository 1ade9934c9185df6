"""The one place that calls NVIDIA's MPS control executable (`nvidia-cuda-mps-control`).

One control daemon per (card, user): its pipe and log directories are <run_dir>/gpu<N>-<uid>/pipe
and .../log, owned by the user, and it runs as the user (an MPS server serves one user at a time).
The daemon creates `control` (and nvidia-cuda-mps-control.pid) in its pipe directory; they tell
the agent, across its own restarts, whether the daemon runs. The executable's path comes from the
agent config ([sharing] mps_control), so tests point it at a script that records what it was asked.

The user's jobs can write pipe/ and log/, so root never uses a path through them: run_dir and
gpu<N>-<uid>/ are root's (0755, the user cannot rename or replace what is in them), everything
below is opened relative to their fds without following links (hai_cluster.safefs), ownership is
set with fchown on the opened directory, and the pid file is read non-blocking, a regular file of
the user's only, a few bytes at most.
"""
from __future__ import annotations

import contextlib
import logging
import os
import select
import stat
import subprocess
import threading
import time
from pathlib import Path
from typing import Iterator

from .. import safefs
from ..safefs import UnsafePath

log = logging.getLogger(__name__)

TIMEOUT = 30.0
OUTPUT_CAP = 4096  # bytes of the control program's output kept (for the error message)
QUIT_WAIT = 10.0  # seconds a quitting daemon is given to go before a new one may be started
PIPE, LOG, PID_FILE = "pipe", "log", "nvidia-cuda-mps-control.pid"


class MpsError(Exception):
    pass


class MpsControl:
    def __init__(self, executable: str, run_dir: str) -> None:
        self.executable, self.run_dir = executable, Path(run_dir)
        # Runs start on the agent's thread pool: two sharing runs of one user starting at once on
        # one card must not both find no daemon and start two (nor one stop what one starts). A
        # lock per (card, uid): the control program runs as that user, who can stall it (SIGSTOP)
        # up to TIMEOUT; other users' daemons must not wait for it.
        self._locks: dict[tuple[int, int], threading.Lock] = {}
        self._locks_lock = threading.Lock()
        self.ensured = 0  # daemons handed out so far (ensure): what quit's `unless_ensured_since` compares

    def _lock(self, card: int, uid: int) -> threading.Lock:
        with self._locks_lock:
            return self._locks.setdefault((card, uid), threading.Lock())

    def _handed_out(self) -> None:
        with self._locks_lock:
            self.ensured += 1

    def base(self, card: int, uid: int) -> Path:
        return self.run_dir / f"gpu{card}-{uid}"

    def dirs(self, card: int, uid: int) -> tuple[Path, Path]:
        """The pipe and log directories, as the daemon and the jobs are told them (never opened
        by path here)."""
        base = self.base(card, uid)
        return base / PIPE, base / LOG

    @contextlib.contextmanager
    def _pipe_fd(self, card: int, uid: int) -> Iterator[int | None]:
        """The daemon's pipe directory as an fd (None: there is none), through root's directories."""
        try:
            run = os.open(self.run_dir, safefs.DIR_FLAGS & ~os.O_NOFOLLOW)  # the operator's path
        except FileNotFoundError:
            yield None
            return
        fds = [run]
        base = self.base(card, uid)
        try:
            try:
                fds.append(safefs.open_dir(run, base.name, str(base)))
                fds.append(safefs.open_dir(fds[-1], PIPE, str(base / PIPE)))
            except FileNotFoundError:
                yield None
                return
            yield fds[-1]
        finally:
            for fd in reversed(fds):
                os.close(fd)

    def running(self, card: int, uid: int) -> bool:
        """The daemon's control pipe exists and, where it left a pid file, that process lives (a
        pipe left behind by a crash or a reboot does not count)."""
        try:
            with self._pipe_fd(card, uid) as pipe:
                if pipe is None or not safefs.exists(pipe, "control"):
                    return False
                text = safefs.read_file(pipe, PID_FILE, f"{self.base(card, uid)}/{PIPE}/{PID_FILE}", limit=32,
                                        owner=self._owner(uid))
                if text is None:
                    return True  # no pid file (older drivers): the pipe is all there is
                pid = int(text)
        except (OSError, ValueError) as exc:
            log.warning("MPS daemon on GPU %d for uid %d: %s; taken as not running", card, uid, exc)
            return False
        return pid > 0 and os.path.exists(f"/proc/{pid}")

    @staticmethod
    def _owner(uid: int) -> int:
        """Whose files the daemon's are: the user's (when the agent runs as root, it runs as them)."""
        return uid if os.geteuid() == 0 else os.geteuid()

    def owner_gid(self, card: int, uid: int) -> int | None:
        """The group the daemon runs with: its pipe directory's (given it by ensure)."""
        with self._pipe_fd(card, uid) as pipe:
            return None if pipe is None else os.fstat(pipe).st_gid

    def _make_dirs(self, card: int, uid: int, gid: int) -> None:
        """run_dir and gpu<N>-<uid>/ root's and 0755, pipe/ and log/ the user's and 0700, all by fd."""
        self.run_dir.mkdir(parents=True, exist_ok=True, mode=0o755)
        run = os.open(self.run_dir, safefs.DIR_FLAGS & ~os.O_NOFOLLOW)
        fds = [run]
        base = self.base(card, uid)
        try:
            st = os.fstat(run)
            me = os.geteuid()
            if st.st_uid != me or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                raise UnsafePath(f"{self.run_dir} must be owned by uid {me} and writable by it alone")
            # An older agent gave gpu<N>-<uid>/ to the user: it becomes root's (ensure_dir's fchown)
            # before anything below it is looked at.
            fds.append(safefs.ensure_dir(run, base.name, str(base), mode=0o755, uid=me, gid=os.getegid(), adopt=uid))
            for name in (PIPE, LOG):
                fds.append(safefs.ensure_dir(fds[1], name, f"{base}/{name}", mode=0o700, uid=uid, gid=gid))
        finally:
            for fd in reversed(fds):
                os.close(fd)

    def _env(self, card_uuid: str, card: int, uid: int) -> dict[str, str]:
        pipe, logs = self.dirs(card, uid)
        return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "CUDA_VISIBLE_DEVICES": card_uuid,
                "CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_MPS_LOG_DIRECTORY": str(logs)}

    def ensure(self, card: int, card_uuid: str, uid: int, gid: int) -> Path:
        """Start the card's control daemon for `uid` unless it runs; returns its pipe directory."""
        pipe = self.dirs(card, uid)[0]
        with self._lock(card, uid):
            if self.running(card, uid):
                self._handed_out()
                return pipe
            try:
                self._make_dirs(card, uid, gid)
            except OSError as exc:
                raise MpsError(f"cannot set up MPS on GPU {card} for uid {uid}: {exc}") from None
            self._call(["-d"], self._env(card_uuid, card, uid), uid, gid, f"start MPS on GPU {card} for uid {uid}")
            self._handed_out()
        log.info("MPS control daemon started on GPU %d for uid %d (%s)", card, uid, pipe)
        return pipe

    def quit(self, card: int, card_uuid: str, uid: int, gid: int, unless_ensured_since: int | None = None) -> None:
        """Ask the card's control daemon for `uid` to shut down (MPS's `quit` command); not when
        a daemon was handed out since `ensured` read `unless_ensured_since` (its user may be a
        run that the caller's decision did not know of)."""
        with self._lock(card, uid):
            if unless_ensured_since is not None and self.ensured != unless_ensured_since:
                return
            if not self.running(card, uid):
                return
            self._call([], self._env(card_uuid, card, uid), uid, gid, f"stop MPS on GPU {card} for uid {uid}",
                       stdin="quit\n")
            # `quit` is only delivered when the call returns: until the daemon is gone, a run
            # starting (ensure waits on the lock) would find it and be handed a dying daemon.
            deadline = time.monotonic() + QUIT_WAIT
            while self.running(card, uid) and time.monotonic() < deadline:
                time.sleep(0.05)
        log.info("MPS control daemon on GPU %d for uid %d told to quit", card, uid)

    def _call(self, args: list[str], env: dict[str, str], uid: int, gid: int, what: str, stdin: str = "") -> None:
        """Run the control program as the user and wait for it to exit (not for EOF on its output:
        a daemon it starts may keep that open). Its output is read up to OUTPUT_CAP bytes, then no
        more: it runs as the user, who can take a copy of its output pipe (pidfd_getfd) and write
        gigabytes into the agent's memory through it (fourth audit, finding 1)."""
        ids = {} if os.getuid() != 0 else {"user": uid, "group": gid, "extra_groups": []}
        try:
            proc = subprocess.Popen([self.executable, *args], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, cwd="/", **ids)
        except OSError as exc:
            raise MpsError(f"cannot {what}: {exc}") from None
        try:
            output = _bounded_output(proc, stdin.encode(), TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise MpsError(f"cannot {what}: {self.executable} did not finish within {TIMEOUT:g} s") from None
        finally:
            proc.stdout.close()
        if proc.returncode != 0:
            text = output.decode(errors="replace").strip()[:300]
            raise MpsError(f"cannot {what}: {self.executable} exited {proc.returncode}: {text}")


def _bounded_output(proc: subprocess.Popen, stdin: bytes, timeout: float) -> bytes:
    """Feed `stdin`, then collect at most OUTPUT_CAP bytes of the output until `proc` exits;
    past the cap nothing is read (a writer blocks on the full pipe: no memory, no CPU here)."""
    try:
        proc.stdin.write(stdin)  # a few bytes: they fit in the pipe, this never blocks
        proc.stdin.close()
    except BrokenPipeError:
        pass
    deadline = time.monotonic() + timeout
    fd, out, eof = proc.stdout.fileno(), bytearray(), False
    os.set_blocking(fd, False)
    while proc.poll() is None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise subprocess.TimeoutExpired(proc.args, timeout)
        if eof or len(out) >= OUTPUT_CAP:
            time.sleep(min(left, 0.05))
        elif select.select([fd], [], [], min(left, 0.05))[0]:
            chunk = _read_some(fd, OUTPUT_CAP - len(out))
            eof = chunk == b""
            out += chunk or b""
    if not eof and len(out) < OUTPUT_CAP:
        out += _read_some(fd, OUTPUT_CAP - len(out)) or b""  # what it wrote just before it exited
    return bytes(out)


def _read_some(fd: int, most: int) -> bytes | None:
    """Up to `most` bytes; b"" at EOF, None when nothing is there yet."""
    try:
        return os.read(fd, most)
    except BlockingIOError:
        return None
