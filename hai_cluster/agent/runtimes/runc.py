"""Runtime `runc`: an OCI bundle in the run dir, `runc run --keep` in the foreground.

runc runs as root (the shepherd's job child execs it after opening the output files as the user);
the container's processes run as the user with no capabilities and no_new_privs. Its root is the
image (a directory, or a tarball unpacked once into the node's cache) under an overlay in a private
mount namespace, read-only; the job's directories are bound at their host paths; /dev holds only
runc's defaults and the rank's GPU device nodes, which the devices cgroup also allows.

Signals: the container's PID 1 is a static init bound in from the host (tini-static, as
`docker --init` does): a plain script as PID 1 would ignore SIGTERM. runc forwards the signals the
shepherd sends to its process group to that init, which forwards them to the job's process group
(-g) and exits with the job script's status; it dies with runc (-p SIGKILL) if runc is killed.
Unlike bwrap, the container ends when its script ends: a script that runs `python train.py`
without exec should `exec` it, or trap the signal and `wait`, to keep its grace period.

Paths: runc runs as root and mounts every source from its path, resolving it in the container's
mount namespace: a user who swaps a directory for a symlink under a root-only parent between any
check and runc's mount would get that directory. So the user's directories (the job's, and an
image directory, the overlay's lower layer) are mounted from stage points in the run dir, bound
by the job child from fds it opened as the user (runtimes.Staged). runc itself cannot take a
/proc/self/fd/N source: it closes inherited fds before its init mounts (Debian's 1.1.5), and a bind
from an fd of another mount namespace fails (EINVAL).

runc places the container into the run's cgroup itself (linux.cgroupsPath, the directories the
shepherd made and set the limits on). --keep leaves that cgroup in place after the container exits,
so the shepherd can read its OOM count; `runc delete --force` in the cleanup removes everything.
"""
from __future__ import annotations

import json
import os
import resource
import subprocess

from .. import spool
from . import Context, Launch, MountPlan, Overlay, Runtime, RuntimeRefused
from .common import Bind, Device, container_env, gpu_devices, image_rootfs, job_binds, stage_job_binds

MASKED = ["/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
          "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware"]
READONLY = ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]
TOOL_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
INIT = "/dev/init"  # where docker --init puts it too


def container_id(ctx: Context) -> str:
    return f"hai-{ctx.spec.job_id}-{ctx.spec.attempt}"


def _catatonit(init: str) -> bool:
    return "catatonit" in os.path.basename(init)


def _init_args(init: str) -> list[str]:
    if _catatonit(init):
        return [INIT, "-g", "--"]
    return [INIT, "-g", "-p", "SIGKILL", "--"]  # tini


def init_env(ctx: Context, init: str) -> dict[str, str]:
    """The job's container environment, plus TINI_VERBOSITY=0 for tini. Its default level prints
    warnings into the job's error file, "[WARN  tini (1)] Child was dead when forwarding signal"
    above all: a signal that reaches tini just after the script ended (common under load) finds no
    process group left to forward it to. That race is harmless and the line is not the job's
    output; with verbosity 0 tini still prints its fatal errors (an exec that failed)."""
    env = container_env(ctx)
    if not _catatonit(init):
        env.setdefault("TINI_VERBOSITY", "0")
    return env


def _mount(dst: str, kind: str, src: str, *options: str) -> dict:
    return {"destination": dst, "type": kind, "source": src, "options": list(options)}


def _mounts(init: str, binds: list[Bind]) -> list[dict]:
    m = [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        _mount("/dev", "tmpfs", "tmpfs", "nosuid", "strictatime", "mode=755", "size=65536k"),
        _mount("/dev/pts", "devpts", "devpts", "nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"),
        _mount("/dev/shm", "tmpfs", "shm", "nosuid", "nodev", "mode=1777"),
        _mount("/dev/mqueue", "mqueue", "mqueue", "nosuid", "noexec", "nodev"),
        _mount("/sys", "bind", "/sys", "rbind", "nosuid", "noexec", "nodev", "ro"),
        _mount("/tmp", "tmpfs", "tmpfs", "nosuid", "nodev", "mode=1777"),
        _mount(INIT, "bind", init, "bind", "ro", "nosuid", "nodev"),
    ]
    m += [_mount(b.dst, "bind", b.src, "rbind", "rw" if b.rw else "ro", "nosuid", "nodev") for b in binds]
    return m


def _devices(devices: list[Device]) -> tuple[list[dict], list[dict]]:
    nodes = [{"path": d.path, "type": "c", "major": d.major, "minor": d.minor, "fileMode": d.mode,
              "uid": 0, "gid": 0} for d in devices]
    # deny everything, then allow these nodes (runc adds its defaults: null, zero, tty, ...)
    rules = [{"allow": False, "access": "rwm"}]
    rules += [{"allow": True, "type": "c", "major": d.major, "minor": d.minor, "access": "rwm"}
              for d in devices]
    return nodes, rules


def bundle_config(ctx: Context, root: str, init: str, binds: list[Bind] | None = None) -> dict:
    """config.json; `binds` default to the job's own (prepare passes them staged)."""
    spec = ctx.spec
    nodes, rules = _devices(gpu_devices(ctx))
    linux = {"namespaces": [{"type": t} for t in ("pid", "ipc", "uts", "mount")],
             "devices": nodes, "resources": {"devices": rules},
             "maskedPaths": MASKED, "readonlyPaths": READONLY}
    if ctx.cgroup_path:
        linux["cgroupsPath"] = ctx.cgroup_path
    process = {
        "terminal": False,
        "user": {"uid": spec.uid, "gid": spec.gid, "additionalGids": list(ctx.groups)},
        "args": [*_init_args(init), ctx.script, *spec.script_args],
        "env": [f"{k}={v}" for k, v in init_env(ctx, init).items()],
        "cwd": spec.workdir,
        "capabilities": {k: [] for k in ("bounding", "effective", "inheritable", "permitted", "ambient")},
        "rlimits": oci_rlimits(ctx.node.rlimits),
        "noNewPrivileges": True,
    }
    return {"ociVersion": "1.0.2", "process": process, "root": {"path": root, "readonly": True},
            "mounts": _mounts(init, job_binds(ctx) if binds is None else binds), "linux": linux}


def oci_rlimits(limits) -> list[dict]:
    """The container's resource limits: the node's for jobs (NodeIsolation.rlimits, which the
    job's process set on itself before it started runc: runc cannot go above its own hard
    limits), and RLIMIT_NOFILE as runc has it where they leave that out (runc needs one)."""
    out = {f"RLIMIT_{name.upper()}": (soft, hard) for name, soft, hard in limits}
    out.setdefault("RLIMIT_NOFILE", resource.getrlimit(resource.RLIMIT_NOFILE))
    return [{"type": t, "soft": _oci(soft), "hard": _oci(hard)} for t, (soft, hard) in out.items()]


def _oci(value: int) -> int:
    return 2**64 - 1 if value == resource.RLIM_INFINITY else value  # the OCI spec's unsigned "unlimited"


class Runc(Runtime):
    name = "runc"

    def prepare(self, ctx: Context) -> Launch:
        node = ctx.node
        tool = node.tools.get("runc")
        if tool is None:
            raise RuntimeRefused(f"runc is not installed on node {node.node}")
        if node.container_init is None:
            raise RuntimeRefused(f"the runc runtime needs a static init for the container (tini-static "
                                 f"or catatonit) on node {node.node}: install tini, or set "
                                 f"isolation.container_init")
        image = image_rootfs(ctx)
        binds, staged = stage_job_binds(ctx, job_binds(ctx))
        if image.staged is not None:
            staged.insert(0, image.staged)
        bundle, scratch, root = (str(ctx.run_dir / d) for d in ("bundle", "overlay", "rootfs"))
        for d, mode in ((bundle, 0o700), (scratch, 0o700), (root, 0o755)):
            os.makedirs(d, mode, exist_ok=True)
        config = bundle_config(ctx, root, node.container_init, binds)
        spool.write_json_atomic(os.path.join(bundle, "config.json"), config)  # 0600: env may hold secrets
        cid = container_id(ctx)
        log = _private_log(str(ctx.run_dir / "runc.log"))
        base = [tool, "--root", node.runc_root, "--log", log, "--log-format", "json"]
        delete = [*base, "delete", "--force", cid]
        if os.path.isdir(os.path.join(node.runc_root, cid)):  # left by a crashed earlier try
            subprocess.run(delete, stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
        argv = [*base, "run", "--keep", "--pid-file", os.path.join(bundle, "pid"), "--bundle", bundle, cid]
        return Launch(argv=argv, env={"PATH": TOOL_PATH}, as_user=False, join_cgroup=False,
                      mounts=MountPlan(staged=tuple(staged),
                                       overlay=Overlay(lower=image.path, scratch=scratch, root=root)),
                      signal_exit_codes=True, cleanup=[delete],
                      holds=() if image.lock is None else (image.lock,))

    def after_exit(self, ctx: Context, launch: Launch, wait_status: int | None) -> str | None:
        if (ctx.run_dir / "bundle" / "pid").exists():
            return None  # the container started: whatever happened next is the job's
        return f"runc could not start the container: {_runc_error(ctx)}"


def _private_log(path: str) -> str:
    """runc.log, made root's 0600 before runc opens it: runc creates a missing log 0644 and only
    appends to one that exists, and its errors (the job's paths, ids, mounts) are not for every
    user who can reach the 0711 run dir. The shepherd reads it as root (_runc_error)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # exactly: not left 0644 by an earlier try of this run
    finally:
        os.close(fd)
    return path


def _runc_error(ctx: Context) -> str:
    try:
        lines = (ctx.run_dir / "runc.log").read_text(errors="replace").splitlines()
    except OSError:
        return "no runc log"
    for line in reversed(lines):
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("level") in ("error", "fatal"):
            return str(entry.get("msg"))
    return lines[-1] if lines else "empty runc log"


RUNTIME = Runc  # what runtimes.get() builds for this module (core/runtimes.py names it)
