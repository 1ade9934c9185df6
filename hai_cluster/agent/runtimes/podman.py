"""Runtime `podman`: rootful `podman run --rm` in the foreground, with runc as its OCI runtime.

Here (hybrid cgroups) podman works only with `--runtime runc` (crun fails) and rlimits no higher
than the ones it runs with: the node's runc and the host's RLIMIT_NOFILE/NPROC are passed
explicitly. The container's processes run as the user (`--user uid:gid` plus the user's groups),
with no capabilities and no_new_privs, on a read-only root: either a local image the site pulled
or loaded (a reference such as `localhost/torch:2.3`; never pulled: `--pull never`), or a rootfs
directory or tarball (absolute path; the tarball is unpacked once into the node's image cache, as
for runc) used through `--rootfs DIR:O`, an overlay that keeps the image untouched. /dev holds
podman's defaults plus the rank's GPU device nodes (the devices cgroup allows only those); the
job's directories are bound at their host paths; the network is the host's.

Signals: podman's PID 1 is the node's static init (tini-static) bound in at /dev/init, as for runc
(podman's own --init would need catatonit, without -g). `podman run` proxies the signals the
shepherd sends to its process group to that init (--sig-proxy), which forwards them to the job's
process group. SIGKILL cannot be proxied: the shepherd kills the run's cgroup, and the cleanup
removes the container by name (`podman rm --force`).

cgroups: the container's cgroup is made by runc under the run's cgroup (`--cgroup-parent`), which
carries the limits the shepherd set, so they hold for everything in it; podman adds none of its own
(`--pids-limit 0`). podman itself stays outside (its Go runtime would count against `--mem`), and
so does conmon (`--cgroups no-conmon`): it must outlive a cgroup kill to report the exit status.

The environment goes through an --env-file (0600 in the run dir): argv is visible to every user.

Paths and names: podman and its runc mount as root from path strings, so the user's directories
(the job's, and a rootfs directory) are given as stage points that the job child bound from fds
it opened as the user (runtimes.Staged), in a mount namespace of its own that podman, conmon and
runc then share. No user string is ever read as an option: values go as --opt=VALUE, and the
image after "--" (a reference is also checked against the grammar submission checks it with).
"""
from __future__ import annotations

import json
import os
import resource
import subprocess

from ...core.jobscript import IMAGE_REFERENCE
from .. import cgroups
from . import Context, Launch, MountPlan, Runtime, RuntimeRefused
from .common import ImageRoot, gpu_devices, image_rootfs, job_binds, stage_job_binds, tool_error
from .runc import INIT, TOOL_PATH, _init_args, init_env

ENV_FILE = "podman.env"
PID_FILE = "podman.pid"
CHECK_TIMEOUT = 30
# podman lowers its own RLIMIT_NPROC to this (4.3, measured here), and its runc cannot raise a limit
# above its own without CAP_SYS_RESOURCE: the container's would fail to start
PODMAN_NPROC = 32768


def container_name(ctx: Context) -> str:
    """podman's container names are machine-wide (runc's live under each agent's own root): the
    agent's own level (node and spool hash, as for its cgroups) keeps two agents apart."""
    spool = os.path.dirname(ctx.node.runc_root)
    return f"hai-{cgroups.agent_cgroup(ctx.node.node, spool)}-{ctx.spec.job_id}-{ctx.spec.attempt}"


def global_args(tool: str, runc: str) -> list[str]:
    return [tool, "--runtime", runc, "--cgroup-manager", "cgroupfs"]


def check(tool: str, runc: str | None) -> str | None:
    """Whether podman works on this node (at agent start, ~0.3 s): None if it does, else why not."""
    if runc is None:
        return "podman needs runc as its OCI runtime on this node, and runc is not installed"
    try:
        done = subprocess.run([*global_args(tool, runc), "info", "--format", "{{.Host.OCIRuntime.Name}}"],
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=CHECK_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"podman info failed: {exc}"
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        return f"podman info failed: {lines[-1] if lines else f'exit status {done.returncode}'}"
    return None


def _env_file(ctx: Context) -> str:
    """The job's environment, one NAME=VALUE a line (podman's format cannot hold a newline in a
    value: such variables, exported shell functions mostly, are left out)."""
    env = init_env(ctx, ctx.node.container_init or "")
    lines = [f"{k}={v}\n" for k, v in env.items() if "\n" not in v and "\n" not in k]
    path = str(ctx.run_dir / ENV_FILE)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.writelines(lines)
    return path


def _volume(src: str, dst: str, options: str) -> str:
    for p in (src, dst):
        if ":" in p:
            raise RuntimeRefused(f"podman cannot bind {p}: the path must not contain ':'")
    return f"{src}:{dst}:{options}"


def _image_args(ctx: Context, base: list[str]) -> tuple[list[str], ImageRoot | None]:
    """`--rootfs -- DIR:O` for a path (with its ImageRoot), else a local image (refused here when
    it does not exist); the image is the last thing before the command."""
    image = ctx.spec.container_image
    assert image is not None
    if image.startswith("/"):
        root = image_rootfs(ctx)
        return ["--rootfs", "--", f"{root.path}:O"], root
    if not IMAGE_REFERENCE.fullmatch(image):  # submission refuses these: a spec from elsewhere
        raise RuntimeRefused(f"container image {image!r} is neither an absolute path nor an image name")
    try:
        found = subprocess.run([*base, "image", "exists", "--", image], stdin=subprocess.DEVNULL,
                               capture_output=True, timeout=CHECK_TIMEOUT).returncode == 0
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeRefused(f"podman image exists {image} failed: {exc}") from None
    if not found:
        raise RuntimeRefused(f"container image {image} is not a local podman image on node "
                             f"{ctx.node.node} (images are never pulled: the site loads them)")
    return ["--pull", "never", "--", image], None


class Podman(Runtime):
    name = "podman"

    def prepare(self, ctx: Context) -> Launch:
        node, spec = ctx.node, ctx.spec
        tool = node.tools.get("podman")
        if tool is None:
            why = node.unusable.get("podman")
            raise RuntimeRefused(f"podman does not work on node {node.node}: {why}" if why
                                 else f"podman is not installed on node {node.node}")
        runc = node.tools.get("runc")
        if runc is None:
            raise RuntimeRefused(f"podman needs runc as its OCI runtime, and runc is not installed on "
                                 f"node {node.node}")
        if node.container_init is None:
            raise RuntimeRefused(f"the podman runtime needs a static init for the container (tini-static "
                                 f"or catatonit) on node {node.node}: install tini, or set "
                                 f"isolation.container_init")
        base = global_args(tool, runc)
        image, root = _image_args(ctx, base)
        binds, staged = stage_job_binds(ctx, job_binds(ctx))
        if root is not None and root.staged is not None:
            staged.insert(0, root.staged)
        cid = container_name(ctx)
        remove = [*base, "rm", "--force", "--ignore", "--time", "0", cid]
        subprocess.run(remove, stdin=subprocess.DEVNULL, capture_output=True, timeout=CHECK_TIMEOUT)  # a crashed try's
        limits = {name: (soft, hard) for name, soft, hard in node.rlimits}  # the job's process has them
        limits.setdefault("nofile", resource.getrlimit(resource.RLIMIT_NOFILE))
        limits["nproc"] = tuple(min(_finite(v), PODMAN_NPROC) for v in limits.get(
            "nproc", resource.getrlimit(resource.RLIMIT_NPROC)))
        pid_file = ctx.run_dir / PID_FILE
        pid_file.unlink(missing_ok=True)
        argv = [*base, "run", "--rm", f"--name={cid}", f"--pidfile={pid_file}",
                "--log-driver", "passthrough", "--sig-proxy=true", "--network", "host",
                "--user", f"{spec.uid}:{spec.gid}", *[a for g in ctx.groups for a in ("--group-add", str(g))],
                "--cap-drop", "all", "--security-opt", "no-new-privileges",
                "--read-only", "--tmpfs", "/tmp:rw,nosuid,nodev,mode=1777",
                *[f"--ulimit={name}={_limit(soft)}:{_limit(hard)}" for name, (soft, hard) in limits.items()],
                "--pids-limit", "0", f"--env-file={_env_file(ctx)}", f"--workdir={spec.workdir}",
                "--volume", _volume(node.container_init, INIT, "ro,nosuid,nodev"),
                "--entrypoint", json.dumps(_init_args(node.container_init))]
        if ctx.cgroup_path:
            argv += ["--cgroup-parent", ctx.cgroup_path, "--cgroups", "no-conmon"]
        for b in binds:
            argv.append(f"--volume={_volume(b.src, b.dst, ('rw' if b.rw else 'ro') + ',nosuid,nodev')}")
        for d in gpu_devices(ctx):
            argv.append(f"--device={_volume(d.host, d.path, 'rwm')}")
        argv += [*image, ctx.script, *spec.script_args]
        # a mount namespace of the job child's own, for the stage points (podman works in it)
        return Launch(argv=argv, env={"PATH": TOOL_PATH}, as_user=False, join_cgroup=False,
                      mounts=MountPlan(staged=tuple(staged)), signal_exit_codes=True, cleanup=[remove],
                      holds=() if root is None or root.lock is None else (root.lock,))

    def after_exit(self, ctx: Context, launch: Launch, wait_status: int | None) -> str | None:
        if (ctx.run_dir / PID_FILE).exists():
            return None  # the container started: whatever happened next is the job's
        return f"podman could not start the container: {tool_error(ctx, 'Error: ', strip=True)}"


def _limit(value: int) -> str:
    return "-1" if value == resource.RLIM_INFINITY else str(value)


def _finite(value: int) -> int:
    return 2**62 if value == resource.RLIM_INFINITY else value




RUNTIME = Podman  # what runtimes.get() builds for this module (core/runtimes.py names it)
