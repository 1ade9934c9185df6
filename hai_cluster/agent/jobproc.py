"""What the job's process does between fork and exec (the shepherd's child).

Order matters: drop privileges first, then chdir and open the output files, so the job can only
reach and write what its user could. Any failure is written to the error pipe as
"<step> failed: <reason>" and the child exits 127; a successful exec closes the pipe (CLOEXEC),
which is how the shepherd knows the job started.
"""
from __future__ import annotations

import errno
import os
import signal
from typing import Mapping, NoReturn

from .runspec import RunSpec


def _reset_signals() -> None:
    # Python ignores SIGPIPE and SIGXFSZ, and ignored signals survive exec: give the job defaults.
    signal.set_wakeup_fd(-1)
    for sig in range(1, signal.NSIG):
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        try:
            signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):  # glibc-reserved real-time signals
            pass
    signal.pthread_sigmask(signal.SIG_SETMASK, set())


def exec_job(spec: RunSpec, script: str, groups: list[int], errw: int,
             env: Mapping[str, str]) -> NoReturn:
    """Become the job, with exactly the environment `env`. Never returns."""
    step = "preparing the job process"
    try:
        _reset_signals()
        step = "setsid"
        os.setsid()  # own session and process group: the shepherd signals the whole group
        step = f"setting the groups of user {spec.user}"
        os.setgroups(groups)
        step = f"setgid to {spec.gid}"
        os.setresgid(spec.gid, spec.gid, spec.gid)
        step = f"setuid to {spec.uid}"
        os.setresuid(spec.uid, spec.uid, spec.uid)
        os.umask(0o022)
        step = f"chdir to {spec.workdir}"
        os.chdir(spec.workdir)
        if spec.checkpoint_dir is not None and not os.path.isdir(spec.checkpoint_dir):
            step = f"creating checkpoint dir {spec.checkpoint_dir}"
            os.makedirs(spec.checkpoint_dir, mode=0o700, exist_ok=True)
        # a requeued job (attempt > 0) continues its output file instead of wiping it
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | (os.O_TRUNC if spec.attempt == 0 else 0)
        step = f"opening stdout {spec.stdout}"
        out = os.open(spec.stdout, flags, 0o644)
        err = out
        if spec.stderr is not None and spec.stderr != spec.stdout:
            step = f"opening stderr {spec.stderr}"
            err = os.open(spec.stderr, flags, 0o644)
        step = "opening /dev/null"
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(err, 2)
        os.closerange(3, errw)
        os.closerange(errw + 1, 1 << 20)
        step = f"exec of the job script {script}"
        os.execve(script, [script, *spec.script_args], dict(env))
    except OSError as exc:
        msg = f"{step} failed: {exc.strerror or exc}"
        if step.startswith("exec") and exc.errno == errno.ENOENT:
            msg += f" (interpreter {spec.script.splitlines()[0][2:].strip()!r})"
    except BaseException as exc:  # noqa: BLE001 - the child must never return into the shepherd
        msg = f"{step} failed: {exc}"
    try:
        os.write(errw, msg.encode(errors="replace")[:4000])
    finally:
        os._exit(127)
