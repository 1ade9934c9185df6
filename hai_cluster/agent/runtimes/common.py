"""What every container runtime needs: the job's bind mounts, its GPU device nodes, its
environment inside the container, and the image rootfs (checked as the user)."""
from __future__ import annotations

import contextlib
import os
import stat
from dataclasses import dataclass
from typing import Iterator

from . import Context, RuntimeRefused

GPU_CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
# Mounted by the runtimes themselves: mount points below these need not exist in the image.
RUNTIME_MOUNTS = ("/proc", "/dev", "/tmp")


@dataclass(frozen=True)
class Bind:
    src: str
    dst: str
    rw: bool
    is_file: bool = False


@dataclass(frozen=True)
class Device:
    host: str  # the node in the agent's device_dir
    path: str  # where the job sees it: /dev/<name>
    major: int
    minor: int
    mode: int  # its permission bits on the host


def _inside(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def job_binds(ctx: Context) -> list[Bind]:
    """The job's directories, at the same paths as on the host, parents before children: workdir,
    output files' directories and checkpoint dir read-write; the control dir and the script
    read-only (the job reads them; only the shepherd writes notices, from outside)."""
    spec = ctx.spec
    rw = {spec.workdir, os.path.dirname(spec.stdout)}
    if spec.stderr:
        rw.add(os.path.dirname(spec.stderr))
    if spec.checkpoint_dir:
        rw.add(spec.checkpoint_dir)
    chosen: list[str] = []
    for d in sorted(rw, key=lambda p: (p.count("/"), p)):
        if not any(_inside(d, c) for c in chosen):  # already visible through a parent bind
            chosen.append(d)
    binds = [Bind(d, d, True) for d in chosen]
    binds += [Bind(ctx.control, ctx.control, False), Bind(ctx.script, ctx.script, False, True)]
    return sorted(binds, key=lambda b: (b.dst.count("/"), b.dst))


def gpu_devices(ctx: Context) -> list[Device]:
    """The rank's /dev/nvidiaN plus the control nodes, those that exist in the device dir (nodes
    with simulated GPUs have none)."""
    names = [f"nvidia{i}" for i in ctx.spec.gpus]
    if ctx.spec.gpus:
        names += list(GPU_CONTROL_NODES)
    out = []
    for name in names:
        host = os.path.join(ctx.node.device_dir, name)
        try:
            st = os.stat(host)
        except OSError:
            continue
        if stat.S_ISCHR(st.st_mode):
            out.append(Device(host, f"/dev/{name}", os.major(st.st_rdev), os.minor(st.st_rdev),
                              stat.S_IMODE(st.st_mode)))
    return out


def container_env(ctx: Context) -> dict[str, str]:
    """The job's environment plus NVIDIA_VISIBLE_DEVICES (the rank's GPU indices, "void" for none).
    Only the rank's device nodes exist in the container, and CUDA numbers the devices it can open
    from 0: CUDA_VISIBLE_DEVICES is renumbered to 0..n-1 when it is the controller's default (the
    rank's indices), so it keeps naming the same GPUs. A value the user set is left alone."""
    env = dict(ctx.env)
    gpus = [str(g) for g in ctx.spec.gpus]
    env["NVIDIA_VISIBLE_DEVICES"] = ",".join(gpus) or "void"
    if gpus and env.get("CUDA_VISIBLE_DEVICES") == ",".join(gpus):
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(len(gpus)))
    return env


@contextlib.contextmanager
def as_user(ctx: Context) -> Iterator[None]:
    """Run a check with the user's identity (effective ids only: the shepherd is single-threaded
    and takes root back at once), so a job cannot use a path its user could not reach."""
    if os.geteuid() != 0:
        yield
        return
    saved = os.getgroups()
    os.setgroups(ctx.groups)
    os.setegid(ctx.spec.gid)
    os.seteuid(ctx.spec.uid)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)
        os.setgroups(saved)


def image_rootfs(ctx: Context) -> str:
    """The image as a rootfs directory: the directory itself, or the tarball unpacked once into the
    node's image cache (keyed by content hash). The user must be able to read it."""
    image = ctx.spec.container_image
    assert image is not None
    if any(c in image for c in ",:\\"):  # overlayfs option syntax
        raise RuntimeRefused(f"container image {image}: the path must not contain ',', ':' or '\\'")
    try:
        with as_user(ctx):
            if os.path.isdir(image):
                if not os.access(image, os.R_OK | os.X_OK, effective_ids=True):
                    raise RuntimeRefused(f"container image {image}: permission denied for user {ctx.spec.user}")
                return image
            fd = os.open(image, os.O_RDONLY)
    except RuntimeRefused:
        raise
    except FileNotFoundError:
        raise RuntimeRefused(f"container image {image} does not exist on node {ctx.node.node}") from None
    except PermissionError:
        raise RuntimeRefused(f"container image {image}: permission denied for user {ctx.spec.user}") from None
    except OSError as exc:
        raise RuntimeRefused(f"container image {image}: {exc.strerror or exc}") from None
    from .rootfs import RootfsError, unpack_cached
    try:
        return unpack_cached(fd, image, ctx.node.image_cache)
    except RootfsError as exc:
        raise RuntimeRefused(f"container image {image}: {exc}") from None
    finally:
        os.close(fd)


def mount_plan_dirs(ctx: Context, binds: list[Bind],
                    extra_dirs: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Mount points to create in the image's overlay: the runtime's own and the binds' (not those
    under the tmpfs/proc/dev the runtime mounts itself)."""
    dirs = [*extra_dirs]
    files = []
    for b in binds:
        if any(_inside(b.dst, m) and b.dst != m for m in RUNTIME_MOUNTS):
            continue
        (files if b.is_file else dirs).append(b.dst)
    return tuple(dirs), tuple(files)


def tool_error(ctx: Context, prefix: str, *, strip: bool = False) -> str:
    """The last line a container tool wrote starting with `prefix` (its own error message), from
    the end of the job's error file (the tool's stderr); `strip` drops the prefix."""
    path = ctx.spec.stderr or ctx.spec.stdout
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 4096))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        lines = []
    found = [ln for ln in lines if ln.startswith(prefix)]
    if not found:
        return f"see {path}"
    return found[-1][len(prefix):] if strip else found[-1]
