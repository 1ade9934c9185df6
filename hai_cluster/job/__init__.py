"""What training code imports to checkpoint when hai-cluster preempts it, and to resume after.

The intended loop (plain Python; see examples/train_loop.py and examples/torch_train.py)::

    import sys
    from hai_cluster import job

    state = job.load_checkpoint(default={"step": 0})    # the default on the first run only
    for step in range(state["step"] + 1, total_steps + 1):
        train_one_step(state)
        state["step"] = step
        if step % 1000 == 0:                              # a periodic checkpoint bounds the loss
            job.save_checkpoint(state)                    # if the job is ever SIGKILLed
        if job.should_checkpoint():                       # cheap: call it every step
            job.save_checkpoint(state)
            sys.exit(0)                                   # leave; a preempted job is resumed later

With PyTorch (this module never imports torch)::

    path = job.checkpoint_dir() / "model.pt"
    if path.exists():
        state = torch.load(path)
    ...
    job.atomic_write(path, lambda f: torch.save(state, f))

How preemption reaches the job: the agent FIRST writes a notice file into $HAI_CONTROL_DIR
(`preempt` for preempt/requeue: checkpoint and leave, the job will be resumed with the same
$HAI_CHECKPOINT_DIR and $HAI_RESTART_COUNT + 1; `terminate` for cancel, time limit or node failure:
it will not be resumed), THEN sends the job's signal ($HAI_PREEMPT_SIGNAL, `--signal`, default
SIGTERM) to every process of the job, and SIGKILLs whatever is left after the grace period
(`--grace`, see `deadline()`).

The first call of any of them also tells the cluster that this job checkpoints and resumes, so
that time-slicing may preempt it (a job that said nothing, and asked for none of --requeue,
--signal, --checkpoint-dir, is never preempted by time-slicing: its work would be lost).

The signal handler is installed by the first call of any function here except the plain helpers
atomic_write, control_dir and preempt_signal: importing the module changes nothing, and a job that
never calls it keeps the default action of its signal. Once installed, the signal no longer kills the process; it only sets
a flag that should_checkpoint() reads, so the job must keep calling should_checkpoint() (else it
is SIGKILLed at the end of the grace period). Call `install()` early (before slow imports or data
loading) so that the signal cannot come before the handler. A Python handler that was already
installed for that signal is still called, after ours. Python handles signals only in its main
thread: called first from another thread, the install is retried at the next call (the notice file
still works meanwhile).

should_checkpoint() costs a flag test and a clock read: the notice file is looked at no more than
once every NOTICE_RECHECK (0.5) seconds, so calling it in a tight loop is free, and a job that has
no handler for its signal (another thread installed nothing) still sees a notice within 0.5 s.

Outside a hai-cluster job the functions still work: restart_count() is 0, job_id() is None,
checkpoint_dir() raises NotInHaiJob unless given a fallback directory; `kill -TERM <pid>` then
simulates a preemption (should_checkpoint() becomes True).

Standard library only (json, signal, pathlib; not even typing): importing it costs a few
milliseconds, next to nothing beside torch.
"""
from __future__ import annotations

import json
import os
import signal as _signal
import time
from pathlib import Path

TYPE_CHECKING = False  # typing costs more to import than all the rest of this module
if TYPE_CHECKING:
    from typing import Any, BinaryIO, Callable, Union

    Data = Union[bytes, bytearray, memoryview, str, Callable[[BinaryIO], Any]]

__all__ = [
    "NOTICE_RECHECK", "NotInHaiJob", "atomic_write", "cancelled", "checkpoint_dir", "control_dir",
    "deadline", "idle_warning", "install", "is_hai_job", "job_id", "latest_checkpoint", "load_checkpoint",
    "notice", "preempt_signal", "preempted", "reason", "restart_count", "save_checkpoint",
    "should_checkpoint", "time_left",
]

NOTICE_RECHECK = 0.5  # seconds between two looks at the notice files in should_checkpoint()
DEFAULT_CHECKPOINT = "checkpoint.json"
_PREEMPT, _TERMINATE = "preempt", "terminate"  # notice file names, written by the agent's shepherd

_clock = time.monotonic  # tests replace it to check the rate limit without sleeping


class NotInHaiJob(RuntimeError):
    """Something only a hai-cluster job has (say $HAI_CHECKPOINT_DIR) was asked for outside one."""


# -- state of this process -----------------------------------------------------------------------

_signalled = False  # the job's signal arrived
_installed = False  # the handler is installed (or cannot be, for SIGKILL/SIGSTOP)
_installed_for: int | None = None
_previous: Any = None  # the Python handler that was there before ours, called after it
_notice: dict | None = None  # the notice, once seen (it never goes away during a run)
_announced = False  # the cluster was told that this job resumes (_announce)
_next_look = 0.0  # _clock() time before which should_checkpoint() does not look at the files


def _on_signal(signum: int, frame: Any) -> None:
    global _signalled
    _signalled = True
    prev = _previous
    if callable(prev) and prev is not _signal.default_int_handler:
        prev(signum, frame)


def preempt_signal() -> int:
    """The signal that tells this job to checkpoint: $HAI_PREEMPT_SIGNAL, else SIGTERM."""
    raw = os.environ.get("HAI_PREEMPT_SIGNAL", "")
    try:
        sig = int(raw)
    except ValueError:
        return int(_signal.SIGTERM)
    return sig if 1 <= sig < _signal.NSIG else int(_signal.SIGTERM)


def install() -> None:
    """Install the handler for the job's signal now (every function here calls this first)."""
    global _installed, _installed_for, _previous
    if _installed:
        return
    sig = preempt_signal()
    try:
        prev = _signal.signal(sig, _on_signal)
    except ValueError as exc:
        if "main thread" in str(exc):
            return  # not the main thread (a data loader's?): retried at the next call
        _installed = True  # a signal Python cannot catch (SIGKILL, SIGSTOP): the notice file only
        return
    except OSError:
        _installed = True
        return
    _previous = None if prev is _on_signal else prev
    _installed, _installed_for = True, sig
    _announce()


def _announce() -> None:
    """Tell the cluster, once per process, that this job checkpoints and resumes: from then on the
    scheduler's time-slicing may preempt it (a job that never says so, and asked for none of
    --requeue, --signal, --checkpoint-dir, is never preempted that way: its work would be lost).
    Through the node's step socket, on a thread of its own: training never waits for it."""
    global _announced
    path, jid = os.environ.get("HAI_STEP_SOCKET"), os.environ.get("HAI_JOB_ID", "")
    if _announced or not path or not jid.isdigit():
        return
    _announced = True
    import threading
    threading.Thread(target=_announce_now, args=(path, int(jid)), name="hai-announce", daemon=True).start()


def _announce_now(path: str, jid: int) -> None:
    from ..cli.client import ClientError, ControllerClient  # the step socket speaks the same protocol
    from ..protocol import minipack
    client = ControllerClient(path, timeout=10.0, wire=minipack)
    try:
        client.call("job_resumable", {"job_id": jid})
    except (ClientError, OSError):
        pass  # no step socket (an old agent): time-slicing leaves the job alone, nothing worse
    finally:
        client.close()


# -- the notice ----------------------------------------------------------------------------------

def control_dir() -> Path | None:
    """$HAI_CONTROL_DIR, where the agent leaves its notices; None outside a hai-cluster job."""
    d = os.environ.get("HAI_CONTROL_DIR")
    return Path(d) if d else None


def _look() -> dict | None:
    """Read the notice, if there is one (a stat that fails, twice, when there is none)."""
    global _notice
    if _notice is not None:
        return _notice
    d = os.environ.get("HAI_CONTROL_DIR")
    if not d:
        return None
    for kind in (_PREEMPT, _TERMINATE):
        try:
            with open(os.path.join(d, kind), "rb") as f:
                raw = f.read()
        except OSError:  # FileNotFoundError, mostly
            continue
        try:
            found = json.loads(raw)
        except ValueError:
            found = None
        if not isinstance(found, dict):  # the agent writes atomically: this is not its file
            found = {}
        found.setdefault("reason", "preempt" if kind == _PREEMPT else "cancel")
        found["kind"] = kind
        _notice = found
        return found
    return None


def should_checkpoint() -> bool:
    """True once this job has been told to stop: save a checkpoint now and exit.

    That is: the job's signal arrived, or a notice is in $HAI_CONTROL_DIR (looked at no more than
    once every NOTICE_RECHECK seconds). It stays True. preempted() says whether the job will be
    resumed (preempt, requeue) and cancelled() whether it will not (cancel, time limit, node
    failure; saving a checkpoint then is harmless and may still help a resubmission).
    """
    global _next_look
    if _signalled or _notice is not None:
        return True
    if not _installed:
        install()
    now = _clock()
    if now < _next_look:
        return False
    _next_look = now + NOTICE_RECHECK
    return _look() is not None or _signalled


def notice() -> dict | None:
    """The agent's notice as a dict ({kind, reason, signal, grace, deadline, time}), or None.

    `kind` is "preempt" or "terminate". Always reads the file (not rate-limited): call it after
    should_checkpoint() said True, not in the loop.
    """
    install()
    return _look()


def idle_warning() -> dict | None:
    """The idle reclamation's warning, if the job has one now ({idle_for, threshold, window, grace,
    action, time, message}): its GPUs sat under the threshold for the window, and it is cancelled
    (or requeued) after the grace unless they get busy. The agent removes it once they are busy
    again. Reads the file each call (it never stops the job by itself: should_checkpoint() stays
    as it was)."""
    d = os.environ.get("HAI_CONTROL_DIR")
    if not d:
        return None
    try:
        with open(os.path.join(d, "idle"), "rb") as f:
            found = json.loads(f.read())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def preempted() -> bool:
    """True if the job was told to checkpoint and leave, and will be resumed (preempt, requeue)."""
    n = notice()
    return n is not None and n["kind"] == _PREEMPT


def cancelled() -> bool:
    """True if the job is being ended for good (cancel, time limit, node failure)."""
    n = notice()
    return n is not None and n["kind"] == _TERMINATE


def reason() -> str | None:
    """Why the job must stop: the notice's reason ("preempt", "requeue", "cancel", "timeout",
    "node_fail"), "signal" if only the signal came (the `--signal` warning before the time limit,
    or someone's `hcancel --signal`), None if nothing happened."""
    n = notice()
    if n is not None:
        return str(n.get("reason"))
    return "signal" if _signalled else None


def deadline() -> float | None:
    """Unix time at which whatever is left of the job gets SIGKILL; None if no notice yet."""
    n = notice()
    value = None if n is None else n.get("deadline")
    return float(value) if isinstance(value, (int, float)) else None


def time_left() -> float | None:
    """Seconds until the SIGKILL (may be negative), None if no notice yet."""
    d = deadline()
    return None if d is None else d - time.time()


# -- the job -------------------------------------------------------------------------------------

def is_hai_job() -> bool:
    """True when running as (a process of) a hai-cluster job."""
    install()
    return bool(os.environ.get("HAI_JOB_ID"))


def job_id() -> int | None:
    """$HAI_JOB_ID as an int, None outside a job."""
    install()
    try:
        return int(os.environ["HAI_JOB_ID"])
    except (KeyError, ValueError):
        return None


def restart_count() -> int:
    """How many runs of this job came before this one ($HAI_RESTART_COUNT); 0 outside a job."""
    install()
    try:
        return max(0, int(os.environ.get("HAI_RESTART_COUNT", "0")))
    except ValueError:
        return 0


def checkpoint_dir(fallback: str | os.PathLike | None = None) -> Path:
    """$HAI_CHECKPOINT_DIR (kept across every run of the job), created if missing.

    Outside a hai-cluster job, `fallback` is used instead (say "./checkpoints", to run the same
    script on a laptop); without one, NotInHaiJob is raised.
    """
    install()
    d = os.environ.get("HAI_CHECKPOINT_DIR")
    if not d:
        if fallback is None:
            raise NotInHaiJob("HAI_CHECKPOINT_DIR is not set: this process does not run as a "
                              "hai-cluster job. Outside a job, pass a directory: "
                              "checkpoint_dir(fallback='./checkpoints').")
        d = os.fspath(fallback)
    path = Path(d)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


# -- files ---------------------------------------------------------------------------------------

_tmp_counter = 0


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some filesystems refuse fsync on a directory
        pass
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike, data: Data) -> Path:
    """Replace `path` with `data` so that a reader (or a crash) sees the old file or the new one,
    never a part: write a temp file in the same dir, flush and fsync it, rename it over `path`,
    fsync the dir.

    `data` is bytes, a str (written as UTF-8), or a callable that writes into the open binary file
    it is given, e.g. `lambda f: torch.save(state, f)`. If writing fails the temp file is removed
    and the old file is untouched. Temp files are named `.<name>.tmp.<pid>.<n>` (a writer killed
    mid-write leaves one behind; latest_checkpoint() never returns them).
    """
    global _tmp_counter
    path = Path(path)
    parent = os.fspath(path.parent)
    _tmp_counter += 1
    tmp = os.path.join(parent, f".{path.name}.tmp.{os.getpid()}.{_tmp_counter}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            if callable(data):
                data(f)
            elif isinstance(data, str):
                f.write(data.encode())
            else:
                f.write(data)
            if not f.closed:
                f.flush()
                os.fsync(f.fileno())
                synced = True
            else:  # the callable closed the file itself
                synced = False
        if not synced:
            sfd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(sfd)
            finally:
                os.close(sfd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(parent)
    return path


def _dir(directory: str | os.PathLike | None) -> Path:
    return checkpoint_dir() if directory is None else Path(directory)


def save_checkpoint(obj: Any, name: str = DEFAULT_CHECKPOINT,
                    directory: str | os.PathLike | None = None) -> Path:
    """Save JSON-able state atomically as `name` in the checkpoint dir (or `directory`)."""
    install()
    d = _dir(directory)
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    return atomic_write(d / name, json.dumps(obj, indent=1, sort_keys=True, allow_nan=True) + "\n")


def latest_checkpoint(name: str = DEFAULT_CHECKPOINT,
                      directory: str | os.PathLike | None = None) -> Path | None:
    """The checkpoint to resume from: `name` in the checkpoint dir if it exists, else None.

    `name` may be a glob ("step-*.pt"): then the most recently modified match (ties: the greatest
    name). Hidden files (atomic_write's temp files) never match.
    """
    install()
    d = _dir(directory)
    if not any(c in name for c in "*?["):
        path = d / name
        return path if path.is_file() else None
    best: tuple[int, str] | None = None
    found = None
    for p in d.glob(name):
        if p.name.startswith(".") or not p.is_file():
            continue
        try:
            key = (p.stat().st_mtime_ns, p.name)
        except OSError:  # removed meanwhile
            continue
        if best is None or key > best:
            best, found = key, p
    return found


def load_checkpoint(name: str = DEFAULT_CHECKPOINT, default: Any = None,
                    directory: str | os.PathLike | None = None) -> Any:
    """The state saved by save_checkpoint(obj, name), or `default` if there is none yet."""
    path = latest_checkpoint(name, directory)
    if path is None:
        return default
    with open(path, "rb") as f:
        return json.loads(f.read())
