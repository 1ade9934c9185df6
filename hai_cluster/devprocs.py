"""The processes of a dev cluster, for hai-dev down: found only where hai-dev or the agent's spool
recorded them, and signalled only once proven to be the process recorded.

A pid alone proves nothing (pids are reused, and anyone can start a process with any command
line), so a process is claimed with a pidfd (which pins it: the checks below and the signal then
reach the same process) and checked against its record: the start time from /proc, and for a
daemon hai-dev started, its uid and exact command line; for a shepherd, its uid and
spool.is_shepherd's command line naming this very run directory. A job is its process group,
led by the main process named in the run's job.json with its start time; the shepherd that
wrote it is the caller's. Every record is read from a directory safefs has proven private.
"""
from __future__ import annotations

import json
import os
import select
import signal
import time
from dataclasses import dataclass

from . import safefs
from .agent import spool


def cmdline(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    return raw.decode(errors="replace").split("\0")[:-1] if raw else None


def _uid(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


@dataclass
class Proc:
    """A live process proven to be `what`, held by a pidfd."""
    what: str
    pid: int
    fd: int
    group: bool = False  # signal its whole process group (a job), while its leader lives

    def signal(self, sig: int) -> None:
        try:
            if not self.group:
                signal.pidfd_send_signal(self.fd, sig)
            elif self.alive():  # no pidfd call for a group: its leader, pinned and alive, holds the pgid
                os.killpg(self.pid, sig)
        except ProcessLookupError:
            pass

    def alive(self) -> bool:
        return not select.select([self.fd], [], [], 0)[0]  # a pidfd turns readable at the exit

    def close(self) -> None:
        os.close(self.fd)


def claim(what: str, rec: object, check) -> Proc | None:
    """The process that `rec` ({pid, starttime, ...}) records, if it is alive and check(pid)."""
    if not isinstance(rec, dict):
        return None
    pid, starttime = rec.get("pid"), rec.get("starttime")
    if not isinstance(pid, int) or pid <= 1 or not isinstance(starttime, int):
        return None
    try:
        fd = os.pidfd_open(pid)  # Linux 5.3 or newer; without it, OSError: nothing is signalled unproven
    except ProcessLookupError:
        return None
    if spool.proc_starttime(pid) == starttime and check(pid):
        return Proc(what, pid, fd)
    os.close(fd)
    return None


def claim_daemon(what: str, rec: object) -> Proc | None:
    """A daemon `up` started: its uid is ours and its command line is the one recorded."""
    argv = rec.get("argv") if isinstance(rec, dict) else None
    if not isinstance(argv, list) or not argv:
        return None
    return claim(what, rec, lambda pid: _uid(pid) == os.geteuid() and cmdline(pid) == argv)


def claim_run(run_dir: str, shepherd_rec: object, job_rec: object) -> tuple[Proc | None, Proc | None]:
    """A run's shepherd and job, from its spool records."""
    shepherd = claim(f"the shepherd of {run_dir}", shepherd_rec,
                     lambda pid: _uid(pid) == os.geteuid() and spool.is_shepherd(pid, run_dir))
    job = claim(f"the job of {run_dir}", job_rec, _leads_its_group)
    if job is not None:
        job.group = True
    return shepherd, job


def _leads_its_group(pid: int) -> bool:
    try:
        return os.getpgid(pid) == pid
    except OSError:
        return False


def read_json(dir_fd: int, name: str, path: str) -> object:
    """A small JSON record of the caller's (safefs.read_file); None if missing or garbage."""
    data = safefs.read_file(dir_fd, name, path)
    if data is None:
        return None
    try:
        return json.loads(data)
    except ValueError:
        return None


def stop(procs: list[Proc], timeout: float) -> list[Proc]:
    """SIGTERM each, wait up to `timeout` s for all; returns those still alive."""
    for p in procs:
        p.signal(signal.SIGTERM)
    return wait(procs, timeout)


def wait(procs: list[Proc], timeout: float) -> list[Proc]:
    deadline = time.monotonic() + timeout
    left = [p for p in procs if p.alive()]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [p for p in left if p.alive()]
    return left


def kill(procs: list[Proc], timeout: float = 5.0) -> list[Proc]:
    """SIGKILL each; returns those still alive after `timeout` s (uninterruptible sleep)."""
    for p in procs:
        p.signal(signal.SIGKILL)
    return wait(procs, timeout)
