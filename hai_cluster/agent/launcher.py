"""The agent's side of a run: prepare its spool dir, start its shepherd (starter.py) and wait for
the launch report, ask it to terminate, signal the job, and declare a run dead when its shepherd
vanished.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import shlex
import signal
import sys
import time
from pathlib import Path

from .. import timeouts
from . import contain, spool
from .isolation import NodeIsolation
from ..protocol.runspec import RunSpec, RunStatus
from .starter import ShepherdStarter

log = logging.getLogger(__name__)

_EXEC = ShepherdStarter("exec")
# What a step server's run executes instead of the job's script (on the nodes after the first):
# this node's interpreter, isolated from the user's PYTHON* variables and user site.
STEP_SERVER = f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -I -m hai_cluster.job.stepd\n"


def step_server_script(spec: RunSpec) -> str:
    if spec.container_image:  # run in the image, with this node's Python bound in (runtimes/inner.py)
        from .runtimes.inner import step_server_script as in_image
        return in_image()
    return STEP_SERVER


def prepare(run_dir: Path, spec: RunSpec, node: NodeIsolation | None = None) -> None:
    os.mkdir(run_dir, 0o711)
    os.chmod(run_dir, 0o711)  # mkdir's mode went through the umask; the user must reach the script
    # Not synced (each sync held up the agent's event loop): only a crash of the machine loses
    # them, and it ends the run too; rebuild() then declares the run lost with or without them.
    spool.write_json_atomic(run_dir / spool.SPEC, spec.to_wire(), durable=False)
    if node is not None:  # the node's runtimes and cgroups, as the shepherd will use them
        spool.write_bytes_atomic(run_dir / contain.NODE, node.wire_json, durable=False)
    fd = os.open(run_dir / spool.SCRIPT, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o500)
    try:
        os.write(fd, step_server_script(spec).encode() if spec.step_server else spec.script.encode())
        os.fchown(fd, spec.uid, spec.gid)
        os.fchmod(fd, 0o500)  # readable and executable by the job's user only
    finally:
        os.close(fd)


def _log_tail(run_dir: Path) -> str:
    try:
        lines = (run_dir / spool.SHEPHERD_LOG).read_text(errors="replace").strip().splitlines()
    except OSError:
        return "no shepherd log"
    return lines[-1] if lines else "empty shepherd log"


async def _read_report(fd: int, timeout: float) -> dict | None:
    """The shepherd's one-line launch report; None if it closed the pipe without one."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader),
                                                os.fdopen(fd, "rb", buffering=0))
    try:
        line = await timeouts.wait_for(reader.readline(), timeout)
    finally:
        transport.close()
    if not line:
        return None
    try:
        report = json.loads(line)
    except ValueError:
        return None
    return report if isinstance(report, dict) else None


async def launch(run_dir: Path, spec: RunSpec, timeout: float,
                 starter: ShepherdStarter | None = None) -> tuple[RunStatus, int | None]:
    """Start the run's shepherd; return (status, shepherd pid) once the job started or failed to.

    The run dir must already be prepared. If the shepherd does not report in time, the run is
    returned as running with no pid: the spool poll takes over from there. Without a starter
    (whose zygote forks shepherds), the shepherd is a fresh interpreter.
    """
    r, w = os.pipe()
    log_fd = os.open(run_dir / spool.SHEPHERD_LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    deadline = time.monotonic() + timeout
    try:
        proc = await (starter or _EXEC).start(run_dir, w, log_fd)
    except BaseException:
        os.close(r)
        raise
    finally:
        os.close(w)
        os.close(log_fd)
    try:
        report = await _read_report(r, timeout)
    except asyncio.TimeoutError:
        log.warning("job %s.%s: shepherd did not report within %g s", spec.job_id, spec.attempt, timeout)
        return (RunStatus.for_spec(spec, state="running", start_time=time.time(),
                                   message=f"launch not confirmed within {timeout:g} s"), None)
    finally:
        try:  # an exec'd shepherd's first fork exits at once; reap it (bounded, never hang start_run on it)
            if proc is not None:
                await timeouts.wait_for(proc.wait(), max(deadline - time.monotonic(), 1.0))
        except asyncio.TimeoutError:
            pass
    if report is not None and report.get("event") == "started":
        st = RunStatus.for_spec(spec, state="running", pid=report.get("pid"),
                                start_time=report.get("start_time") or time.time())
        return st, report.get("shepherd_pid")
    status = read_status(run_dir)
    if status is None:
        status = declare_dead(run_dir, spec, "launch_failed",
                              f"the shepherd exited without starting the job: {_log_tail(run_dir)}")
    return status, None


def read_status(run_dir: Path) -> RunStatus | None:
    try:
        raw = spool.read_json(run_dir / spool.STATUS)
        return None if raw is None else RunStatus.from_disk(raw)
    except ValueError as exc:  # SpecError is a ValueError too
        log.error("%s: unreadable status (%s); treating the run as lost", run_dir, exc)
        return None


def job_record(run_dir: Path) -> dict:
    try:
        rec = spool.read_json(run_dir / spool.JOB)
    except ValueError:
        rec = None
    return rec if isinstance(rec, dict) else {}


def _kill_leftovers(job: dict, uid: int | None) -> bool:
    """SIGKILL a dead run's process group. The group id is the main pid; it is trusted only if
    that process is still the one we started, or if every member belongs to the job's user."""
    pid = job.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    if spool.same_process(pid, job.get("starttime")):
        targets = None
    else:
        members = spool.group_members(pid)
        if not members or uid is None or any(_owner(p) != uid for p in members):
            return False
        targets = members
    try:
        if targets is None:
            os.killpg(pid, signal.SIGKILL)
        else:
            for p in targets:
                os.kill(p, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True


def _owner(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def declare_dead(run_dir: Path, spec: RunSpec | None, reason: str, message: str) -> RunStatus:
    """End a run whose shepherd is gone without a status: kill what is left, write the status."""
    job = job_record(run_dir)
    if _kill_leftovers(job, spec.uid if spec else None):
        message += "; its leftover processes were killed"
    contain.teardown_recorded(run_dir)  # its cgroup (all that left the group too) and container
    key = (spec.job_id, spec.attempt) if spec else (spool.parse_run_dir_name(run_dir.name) or (0, 0))
    now = time.time()
    st = RunStatus(job_id=key[0], attempt=key[1], rank=spec.rank if spec else 0, state="ended",
                   pid=job.get("pid") if isinstance(job.get("pid"), int) else None,
                   start_time=job.get("start_time") or now, end_time=now, reason=reason, message=message)
    if reason == "launch_failed":
        st.pid = None
    spool.write_json_atomic(run_dir / spool.STATUS, st.to_wire())
    log.warning("job %s.%s declared %s: %s", key[0], key[1], reason, message)
    return st


def request_terminate(run_dir: Path, reason: str) -> None:
    """Leave the request for the shepherd (the first one wins) and wake it up."""
    path = run_dir / spool.TERMINATE
    if not path.exists():
        spool.write_json_atomic(path, {"reason": reason, "time": time.time()})
    shepherd_pid = spool.recorded_shepherd(run_dir)
    if shepherd_pid is not None:  # else it is still starting: it reads the file before the job starts
        try:
            os.kill(shepherd_pid, signal.SIGUSR1)
        except ProcessLookupError:
            pass  # it ended meanwhile; the spool poll sees its status


def signal_job(run_dir: Path, sig: int) -> bool:
    """Deliver a signal to the job's process group, if its main process is still ours."""
    job = job_record(run_dir)
    pid = job.get("pid")
    if not spool.same_process(pid, job.get("starttime")):
        return False
    try:
        contain.deliver_recorded(run_dir, pid, sig)
    except ProcessLookupError:
        return False
    return True
