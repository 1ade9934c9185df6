"""The on-disk spool shared by the agent and its shepherds, and process identity checks.

    <spool>/runs/<job_id>.<attempt>/
        spec.json       the RunSpec (root, 0600; the environment may hold secrets)
        script          the job script (owned by the job's user, 0500)
        shepherd.json   {pid, starttime} of the shepherd, written before the job starts
        job.json        {pid, starttime, start_time} of the job's main process (= its pgid)
        terminate.json  {reason, time}: a terminate request from the agent (first one wins)
        status.json     the final RunStatus, written once by the shepherd (or by the agent: lost)
        shepherd.log    the shepherd's own stderr
        control/        the job's control dir (root, 0755), $HAI_CONTROL_DIR in the job; created by
                        the shepherd before the job starts; the job reads, only the shepherd writes:
            preempt     notice (0644): checkpoint and leave, you will be resumed (preempt, requeue)
            terminate   notice (0644): you are being ended for good (cancel, timeout, node_fail)
            idle        warning (0644): your GPUs sat idle; the job is ended (or requeued) after
                        a grace unless they get busy (controller/reclaim.py); removed once busy
        node.json       the agent's runtimes and cgroup features when it started the run (contain.py)
        isolation.json  the run's runtime, cgroup and cleanup commands, for the agent if the shepherd dies
        bundle/, rootfs/, overlay/, runc.log: what a container runtime needs
        staged/         0700: the stage points where the job child binds the user's directories
                        (opened as the user) for a runtime that mounts as root (runtimes.Staged)

A notice is {reason, signal, grace, deadline, time}: written before the signal is sent, so a job
that gets the signal always finds it; `deadline` is the Unix time of the SIGKILL.

The run dir is 0711 so the job's user can reach its script without listing anything. Every JSON
file is written to a temp name and renamed, so a reader sees all of it or none of it. A pid alone
is never trusted: it is paired with the process start time from /proc, because pids are reused.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from .. import safefs

RUNS = "runs"
SPEC = "spec.json"
SCRIPT = "script"
SHEPHERD = "shepherd.json"
JOB = "job.json"
TERMINATE = "terminate.json"
STATUS = "status.json"
SHEPHERD_LOG = "shepherd.log"
SHEPHERD_MODULE = "hai_cluster.agent.shepherd"
CONTROL = "control"
PREEMPT_NOTICE = "preempt"
TERMINATE_NOTICE = "terminate"
RESUMING_REASONS = ("preempt", "requeue")  # the job will run again: its notice is PREEMPT_NOTICE


def runs_dir(spool: str | os.PathLike) -> Path:
    return Path(spool) / RUNS


STEP_DIR = "step"  # a directory of its own: containers bind it (a bound socket file would be
# the agent's old socket after it restarted; the directory shows the new one)
STEP_SOCKET = "step.sock"


def step_socket(spool: str | os.PathLike) -> Path:
    """Where srun and the step servers of this node's jobs reach the agent (agent/steps.py)."""
    return Path(spool) / STEP_DIR / STEP_SOCKET


def run_dir_name(job_id: int, attempt: int) -> str:
    return f"{job_id}.{attempt}"


def parse_run_dir_name(name: str) -> tuple[int, int] | None:
    parts = name.split(".")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        return None
    return int(parts[0]), int(parts[1])


def write_json_atomic(path: str | os.PathLike, obj: Any, mode: int = 0o600, durable: bool = True) -> None:
    """Replace `path` at once: a reader sees the old file or the new one, never part of one.
    durable=False skips the fsync, for records of live processes (a shepherd's or job's pid, a
    run's cgroups) that a crash of the machine makes void anyway: with many runs starting,
    their syncs queued on the file system's journal behind one another (5 ms each) and behind
    the controller's commits."""
    write_bytes_atomic(path, json.dumps(obj, sort_keys=True).encode(), mode, durable)


def write_bytes_atomic(path: str | os.PathLike, data: bytes, mode: int = 0o600, durable: bool = True) -> None:
    """write_json_atomic for what is encoded already."""
    path = str(path)
    tmp = f"{path}.tmp.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)  # exactly this mode: not narrowed by the umask, nor left from a stale temp
        os.write(fd, data)
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, path)


def make_control_dir(run_dir: str | os.PathLike) -> Path:
    """Create the run's control dir (root, 0755: the job lists and reads it, never writes it)."""
    path = Path(run_dir) / CONTROL
    try:
        os.mkdir(path, 0o755)
    except FileExistsError:  # a shepherd restarted on the same run dir (which only root can write)
        if path.is_symlink() or not path.is_dir():
            raise FileExistsError(f"{path} exists and is not a directory") from None
    os.chmod(path, 0o755)  # mkdir's mode went through the umask
    return path


def notice_name(reason: str) -> str:
    return PREEMPT_NOTICE if reason in RESUMING_REASONS else TERMINATE_NOTICE


def write_notice(control_dir: str | os.PathLike, reason: str, signal: int, grace: float,
                 now: float) -> Path:
    """Leave the terminate notice for the job, atomically (a reader sees all of it or nothing)."""
    path = Path(control_dir) / notice_name(reason)
    write_json_atomic(path, {"reason": reason, "signal": signal, "grace": grace,
                             "deadline": now + grace, "time": now}, mode=0o644)
    return path


IDLE_NOTICE = "idle"


def write_idle_notice(control_dir: str | os.PathLike, notice: dict | None) -> bool:
    """Leave the idle warning in the run's control dir (None: take it away). Relative to the
    directory's fd, opened O_NOFOLLOW, and never through a link: the agent runs as root. False
    when the run has no control dir (not started yet, or gone)."""
    try:
        dfd = os.open(control_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return False
    try:
        if notice is None:
            try:
                os.unlink(IDLE_NOTICE, dir_fd=dfd)
            except FileNotFoundError:
                pass
            return True
        tmp = f"{IDLE_NOTICE}.tmp.{os.getpid()}"
        fd = safefs.create_file(dfd, tmp, json.dumps(notice, sort_keys=True).encode() + b"\n", 0o644, replace=True)
        try:
            os.fchmod(fd, 0o644)  # whatever the umask: the job reads it
        finally:
            os.close(fd)
        os.rename(tmp, IDLE_NOTICE, src_dir_fd=dfd, dst_dir_fd=dfd)
        return True
    finally:
        os.close(dfd)


def read_json(path: str | os.PathLike) -> Any:
    """The decoded file, or None if it does not exist. Garbage raises ValueError."""
    try:
        with open(path, "rb") as f:
            return json.loads(f.read())
    except FileNotFoundError:
        return None


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (which may hold spaces and parens)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read().decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return data.rsplit(")", 1)[1].split()


def any_stopped(pids) -> bool:
    """Whether any of these processes is stopped (SIGSTOP, a job-control stop, or a tracer's)."""
    return any((f := _stat_fields(pid)) is not None and f[0] in ("T", "t") for pid in pids)


def proc_starttime(pid: int) -> int | None:
    """Start time (clock ticks since boot) of a live, non-zombie process; None otherwise."""
    f = _stat_fields(pid)
    if f is None or f[0] in ("Z", "X"):
        return None
    return int(f[19])


def same_process(pid: Any, starttime: Any) -> bool:
    return isinstance(pid, int) and pid > 0 and starttime is not None and proc_starttime(pid) == starttime


def shepherd_argv(run_dir: str | os.PathLike) -> list[str]:
    """A run's shepherd's command line, exec'd or forked by the zygote (which writes it into its
    child's argument area): what is_shepherd recognises."""
    return [sys.executable, "-m", SHEPHERD_MODULE, str(run_dir)]


def is_shepherd(pid: int, run_dir: str | os.PathLike) -> bool:
    """True if pid is a live shepherd for exactly this run dir (not a reused pid), started by the
    agent's own user: anyone can start a process with a shepherd's command line, and one that
    passed for the shepherd of a run whose shepherd died would keep it from being declared lost."""
    if proc_starttime(pid) is None:
        return False
    try:
        proc = os.open(f"/proc/{pid}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except (FileNotFoundError, ProcessLookupError):
        return False
    try:  # both read through one fd of /proc/PID: the same process, even if the pid is reused
        argv = _read_proc(proc, "cmdline").decode(errors="replace").split("\0")
        uid = _real_uid(_read_proc(proc, "status"))
    except (FileNotFoundError, ProcessLookupError):
        return False
    finally:
        os.close(proc)
    if argv and argv[-1] == "":
        argv.pop()
    return argv[-3:] == ["-m", SHEPHERD_MODULE, str(run_dir)] and uid == os.geteuid()


def _read_proc(proc: int, name: str) -> bytes:
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=proc)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _real_uid(status: bytes) -> int | None:
    """The real uid in /proc/PID/status. Not the owner of /proc/PID, which is the effective uid: a
    shepherd has its user's for a moment (runtimes.as_user), and a setuid-root program that a user
    started (its command line theirs) has root's; a user's process never has root's real uid."""
    for line in status.splitlines():
        if line.startswith(b"Uid:"):
            fields = line.split()
            return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None
    return None


def _pids() -> list[int]:
    return [int(n) for n in os.listdir("/proc") if n.isdigit()]


def recorded_shepherd(run_dir: str | os.PathLike) -> int | None:
    """The live shepherd named in shepherd.json. Only this one may be sent SIGUSR1: it writes the
    file after installing its handlers."""
    try:
        rec = read_json(Path(run_dir) / SHEPHERD)
    except ValueError:
        rec = None
    if not (isinstance(rec, dict) and isinstance(rec.get("pid"), int)):
        return None
    if "starttime" in rec and rec["starttime"] != proc_starttime(rec["pid"]):
        return None  # that pid is another process now
    return rec["pid"] if is_shepherd(rec["pid"], run_dir) else None


def find_shepherd(run_dir: str | os.PathLike) -> int | None:
    """The live shepherd of a run (for liveness): the recorded one, else, since it may not have
    written shepherd.json yet, by scanning /proc (a read per process: only the fallback)."""
    pid = recorded_shepherd(run_dir)
    if pid is not None:
        return pid
    for pid in _pids():
        if is_shepherd(pid, run_dir):
            return pid
    return None


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in a process group. Zombies are skipped: where nobody reaps
    orphans they linger, but they run no code and hold no GPU. A group with no process at all,
    zombies included (a job's, once it ended and was reaped), is known without the /proc scan:
    kill(-pgid, 0) says so."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return []
    except PermissionError:  # members exist, owned by someone we may not signal
        pass
    out = []
    for pid in _pids():
        f = _stat_fields(pid)
        if f is not None and f[0] not in ("Z", "X") and f[2] == str(pgid):
            out.append(pid)
    return out


def children_of(ppid: int) -> list[int]:
    """ppid's children, zombies included: from /proc/PID/task/TID/children, one read per thread,
    where the kernel has it (CONFIG_PROC_CHILDREN, on in Debian's and Ubuntu's, which CRIU
    needs); else by scanning every process's stat, ~75 files on a quiet node, which was most of a
    shepherd's CPU per run."""
    try:
        out = []
        for tid in os.listdir(f"/proc/{ppid}/task"):
            with open(f"/proc/{ppid}/task/{tid}/children", "rb") as f:
                out += map(int, f.read().split())
        return out
    except FileNotFoundError:  # no such process, a thread that just ended, or no children file
        return _scan_children(ppid)


def _scan_children(ppid: int) -> list[int]:
    out = []
    for pid in _pids():
        f = _stat_fields(pid)
        if f is not None and f[1] == str(ppid):
            out.append(pid)
    return out
