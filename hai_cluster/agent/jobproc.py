"""What the job's process does between fork and exec (the shepherd's child).

Order matters: drop privileges first, then chdir and open the output files, so the job can only
reach and write what its user could (a runtime that runs as root takes root back only after).
Any failure is written to the error pipe as "<step> failed: <reason>" and the child exits 127; a
successful exec closes the pipe (CLOEXEC), which is how the shepherd knows the job started.

start_job runs these steps in hai-jobexec (hai_cluster/native/jobexec.c, built beside hsubmit)
where it is installed, spawned without a fork of the shepherd (posix_spawn: a vfork), which
spares ~1.5 ms of CPU per run: the copy of the shepherd's page tables, its copy-on-write faults,
and an interpreter torn down at the exec. A container launch with mounts to make (an image root,
the user's directories at their stage points), and a node without the helper, fork and run
exec_job below, the same steps in Python.
"""
from __future__ import annotations

import errno
import os
import signal
import sys
from typing import TYPE_CHECKING, NoReturn, Sequence

from ..core.envfilter import helper_env
from . import rlimits
from .rlimits import Limit
from ..protocol.runspec import RunSpec

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
             cgroup_procs: list[str], limits: Sequence[Limit] = ()) -> NoReturn:
    """Become the job (or its runtime, per `launch`), with exactly launch.env. Never returns.

    As root: join the run's cgroups (so everything the job ever starts is in them: nothing can
    fork before this), setsid, a mount namespace of its own (containers). Then as the user: chdir,
    create the checkpoint dir, open the output files, open the directories root will mount
    (runtimes.Staged). Root again to mount them and the image root; a runtime that must start as
    root (runc) keeps it for its exec, the others become the user for good."""
    step = "preparing the job process"
    root_groups = os.getgroups()
    mounts = launch.mounts
    try:
        _reset_signals()
        for path in cgroup_procs:
            step = f"joining the cgroup {os.path.dirname(path)}"
            with open(path, "w") as f:
                f.write("0")
        step = "setsid"
        os.setsid()  # own session and process group: the shepherd signals the whole group
        for name, soft, hard in limits:  # as root: a hard limit above the shepherd's may be set
            step = f"setting the job's resource limit {name} ({rlimits.show(soft)}:{rlimits.show(hard)})"
            rlimits.apply([(name, soft, hard)])
        if mounts is not None:
            step = "setting up the job's mount namespace"
            from .runtimes import rootfs
            rootfs.private_namespace()
        # Only the effective ids change (-1 keeps real and saved ids: root) for a root runtime,
        # and until the mounts are made
        final = launch.as_user and mounts is None
        uid, gid = (spec.uid, spec.gid) if final else (-1, -1)
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
        # a requeued job (attempt > 0) continues its output file instead of wiping it (--open-mode)
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | (os.O_TRUNC if spec.truncates_output else 0)
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
        fds = []
        for staged in mounts.staged if mounts is not None else ():
            step = f"opening {staged.what} {staged.path}"
            fds.append(rootfs.open_staged(staged.path))
        if not final:
            step = f"taking back root to start {launch.argv[0]}"
            os.setresuid(0, 0, 0)
            os.setresgid(0, 0, 0)
            os.setgroups(root_groups)
        if mounts is not None:
            step = "assembling the container's root filesystem"
            os.umask(0o022)  # mount points the job must traverse, whatever its umask
            rootfs.assemble(mounts, fds)
            os.umask(spec.umask)
            if launch.as_user:  # the user for good
                step = f"setting the groups of user {spec.user}"
                os.setgroups(groups)
                step = f"setgid to {spec.gid}"
                os.setresgid(spec.gid, spec.gid, spec.gid)
                step = f"setuid to {spec.uid}"
                os.setresuid(spec.uid, spec.uid, spec.uid)
        for fd in launch.keep_fds:
            os.set_inheritable(fd, True)
        _close_fds({errw, *launch.keep_fds})
        step = f"exec of {launch.label or launch.argv[0]}"
        # A runtime started as root never sees the user's loader or interpreter hooks.
        os.execve(launch.argv[0], launch.argv, dict(launch.env) if launch.as_user else helper_env(launch.env))
    except OSError as exc:
        msg = f"{step} failed: {exc.strerror or exc}"
        if step.startswith("exec of the job script") and exc.errno == errno.ENOENT:
            msg += _interpreter_hint(spec)
    except BaseException as exc:  # noqa: BLE001 - the child must never return into the shepherd
        msg = f"{step} failed: {exc}"
    try:
        os.write(errw, msg.encode(errors="replace")[:4000])
    finally:
        os._exit(127)


JOBEXEC = os.path.join(os.path.dirname(sys.executable), "hai-jobexec")
JOBEXEC_PROTOCOL = "2"  # jobexec.c's PROTOCOL
_DEFAULT_SIGNALS = sorted(signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP})


def start_job(spec: RunSpec, launch: Launch, groups: list[int], errw: int, cgroup_procs: list[str],
              limits: Sequence[Limit] = ()) -> int:
    """Start the job's process (exec_job's steps and messages), with resource `limits`; its pid.
    In the shepherd."""
    if launch.mounts is None and os.access(JOBEXEC, os.X_OK):  # no image root to assemble: the helper
        block = _env_block(dict(launch.env) if launch.as_user else helper_env(launch.env))
        if block is not None:
            pid = _spawn(_jobexec_options(spec, launch, groups, cgroup_procs, limits), block, errw, launch.keep_fds)
            if pid is not None:
                return pid
    pid = os.fork()
    if pid == 0:
        exec_job(spec, launch, groups, errw, cgroup_procs, limits)
    return pid


def _interpreter_hint(spec: RunSpec) -> str:
    return f" (interpreter {spec.script.splitlines()[0][2:].strip()!r})"


def _jobexec_options(spec: RunSpec, launch: Launch, groups: list[int], cgroup_procs: list[str],
                     limits: Sequence[Limit] = ()) -> list[str]:
    """hai-jobexec's arguments after the protocol and the two fds (jobexec.c)."""
    argv = []
    for path in cgroup_procs:
        argv += ["--cgroup", path]
    for name, soft, hard in limits:
        argv += ["--rlimit", f"{name}:{rlimits.NAMES[name]}:{soft}:{hard}"]
    for fd in launch.keep_fds:
        argv += ["--keep", str(fd)]
    argv += ["--user", spec.user, "--uid", str(spec.uid), "--gid", str(spec.gid),
             "--groups", ",".join(map(str, groups)), "--umask", str(spec.umask), "--chdir", spec.workdir,
             "--stdout", spec.stdout, "--label", launch.label or launch.argv[0]]
    if launch.as_user:
        argv.append("--as-user")
    if spec.checkpoint_dir is not None:
        argv += ["--checkpoint", spec.checkpoint_dir]
    if spec.truncates_output:
        argv.append("--trunc")
    if spec.stderr is not None:
        argv += ["--stderr", spec.stderr]
    if (launch.label or launch.argv[0]).startswith("the job script"):
        argv += ["--hint", _interpreter_hint(spec)]
    return [*argv, "--", *launch.argv]


def _env_block(env: dict[str, str]) -> bytes | None:
    """The environment as execve takes it; None for what execve refuses (exec_job reports it)."""
    out = []
    for k, v in env.items():
        key, value = os.fsencode(k), os.fsencode(v)
        if not key or b"=" in key or b"\0" in key or b"\0" in value:
            return None
        out.append(key + b"=" + value + b"\0")
    return b"".join(out)


def _spawn(options: list[str], env_block: bytes, errw: int, keep_fds: tuple[int, ...]) -> int | None:
    """posix_spawn hai-jobexec with the environment in a memfd; None if it cannot be spawned."""
    try:
        envfd = os.memfd_create("hai-job-env")  # close-on-exec: the spawn's child gets it made inheritable
    except OSError:  # no memfds here (an old kernel, a seccomp filter)
        return None
    try:
        if os.write(envfd, env_block) != len(env_block):
            return None
        argv = [JOBEXEC, JOBEXEC_PROTOCOL, str(errw), str(envfd), *options]
        shared = (errw, envfd, *keep_fds)
        for fd in shared:
            os.set_inheritable(fd, True)
        try:
            # no environment of its own: it runs as root, and the job's is in the memfd
            return os.posix_spawn(JOBEXEC, argv, {}, setsigdef=_DEFAULT_SIGNALS, setsigmask=())
        except OSError:  # gone since the access check (an upgrade): start_job forks instead
            return None
        finally:
            for fd in shared:
                os.set_inheritable(fd, False)
    finally:
        os.close(envfd)
