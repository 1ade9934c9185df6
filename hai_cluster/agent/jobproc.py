"""What the job's process does between fork and exec (the shepherd's child).

Order matters: drop privileges first, then chdir and open the output files, so the job can only
reach and write what its user could (a runtime that runs as root takes root back only after).
Any failure is written to the error pipe as "<step> failed: <reason>" and the child exits 127; a
successful exec closes the pipe (CLOEXEC), which is how the shepherd knows the job started.
"""
from __future__ import annotations

import errno
import os
import signal
from typing import TYPE_CHECKING, NoReturn

from ..core.envfilter import helper_env
from .runspec import RunSpec

if TYPE_CHECKING:
    from .runtimes import Launch


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


def _close_fds(keep: set[int]) -> None:
    low = 3
    for fd in sorted(keep):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 1 << 20)


def exec_job(spec: RunSpec, launch: Launch, groups: list[int], errw: int,
             cgroup_procs: list[str]) -> NoReturn:
    """Become the job (or its runtime, per `launch`), with exactly launch.env. Never returns.

    As root: join the run's cgroups (so everything the job ever starts is in them: nothing can
    fork before this), setsid, assemble the image root (containers). Then as the user: chdir,
    create the checkpoint dir, open the output files. A runtime that must start as root (runc)
    takes root back only after that, for its exec."""
    step = "preparing the job process"
    root_groups = os.getgroups()
    try:
        _reset_signals()
        for path in cgroup_procs:
            step = f"joining the cgroup {os.path.dirname(path)}"
            with open(path, "w") as f:
                f.write("0")
        step = "setsid"
        os.setsid()  # own session and process group: the shepherd signals the whole group
        if launch.mounts is not None:
            step = "assembling the container's root filesystem"
            from .runtimes.rootfs import assemble
            assemble(launch.mounts)
        # For a root runtime only the effective ids change (-1 keeps real and saved ids: root)
        uid, gid = (spec.uid, spec.gid) if launch.as_user else (-1, -1)
        step = f"setting the groups of user {spec.user}"
        os.setgroups(groups)
        step = f"setgid to {spec.gid}"
        os.setresgid(gid, spec.gid, gid)
        step = f"setuid to {spec.uid}"
        os.setresuid(uid, spec.uid, uid)
        os.umask(spec.umask)
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
        if not launch.as_user:
            step = f"taking back root to start {launch.argv[0]}"
            os.setresuid(0, 0, 0)
            os.setresgid(0, 0, 0)
            os.setgroups(root_groups)
        for fd in launch.keep_fds:
            os.set_inheritable(fd, True)
        _close_fds({errw, *launch.keep_fds})
        step = f"exec of {launch.label or launch.argv[0]}"
        # A runtime started as root never sees the user's loader or interpreter hooks.
        os.execve(launch.argv[0], launch.argv, dict(launch.env) if launch.as_user else helper_env(launch.env))
    except OSError as exc:
        msg = f"{step} failed: {exc.strerror or exc}"
        if step.startswith("exec of the job script") and exc.errno == errno.ENOENT:
            msg += f" (interpreter {spec.script.splitlines()[0][2:].strip()!r})"
    except BaseException as exc:  # noqa: BLE001 - the child must never return into the shepherd
        msg = f"{step} failed: {exc}"
    try:
        os.write(errw, msg.encode(errors="replace")[:4000])
    finally:
        os._exit(127)
