"""What every container runtime needs: the job's bind mounts, its GPU device nodes, its
environment inside the container, the image rootfs (checked as the user), the stage points that
keep root from resolving the user's paths, and the runtime's error message from the job's file."""
from __future__ import annotations

import contextlib
import os
import stat
from dataclasses import dataclass, replace
from typing import Iterator

from .. import spool
from . import Context, RuntimeRefused, Staged, inner, inside, outermost

GPU_CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
STAGE_DIR = "staged"  # in the run dir (root's, 0711): the stage points, in a 0700 dir
TOOL_ERROR_BYTES = 4096  # what is read of the end of the job's error file
# Mounted by the runtimes themselves: mount points below these need not exist in the image.
RUNTIME_MOUNTS = ("/proc", "/dev", "/tmp")
OWN_DEVICES = ("/proc", "/dev")  # never bound from the host: a job's output there is the runtime's


@dataclass(frozen=True)
class Bind:
    src: str
    dst: str
    rw: bool
    is_file: bool = False
    ours: bool = False  # root's (the node's Python, the step socket): bound straight, never staged


@dataclass(frozen=True)
class Device:
    host: str  # the node in the agent's device_dir
    path: str  # where the job sees it: /dev/<name>
    major: int
    minor: int
    mode: int  # its permission bits on the host


def job_binds(ctx: Context) -> list[Bind]:
    """The job's directories, at the same paths as on the host, parents before children: workdir,
    output files' directories and checkpoint dir read-write; the control dir and the script
    read-only (the job reads them; only the shepherd writes notices, from outside)."""
    spec = ctx.spec
    rw = {spec.workdir}
    for out in (spec.stdout, spec.stderr):  # not /dev of /dev/null: the runtime makes its own /dev
        if out and not any(inside(out, m) for m in OWN_DEVICES):
            rw.add(os.path.dirname(out))
    if spec.checkpoint_dir:
        rw.add(spec.checkpoint_dir)
    binds = [Bind(d, d, True) for d in outermost(rw)]  # one inside another shows through its parent's
    binds += [Bind(ctx.control, ctx.control, False), Bind(ctx.script, ctx.script, False, True)]
    if spec.container_image:
        binds += step_binds(ctx)
    return sorted(binds, key=lambda b: (b.dst.count("/"), b.dst))


def step_binds(ctx: Context) -> list[Bind]:
    """What srun and the step server need inside an image (inner.py): this node's Python, the
    launchers and the agent's step socket."""
    py = inner.host_python()
    binds = [Bind(p, inner.HOST + p, False, ours=True) for p in py.binds]
    binds.append(Bind(inner.write_launchers(ctx.run_dir), inner.BIN, False, ours=True))
    socket = ctx.env.get("HAI_STEP_SOCKET")
    if socket:  # its directory, which outlives an agent's restart (spool.STEP_DIR)
        binds.append(Bind(os.path.dirname(socket), inner.STEP_DIR, False, ours=True))
    return binds


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
    if ctx.spec.container_image and env.get("HAI_STEP_SOCKET"):  # step_binds: srun runs in the image
        env["HAI_STEP_SOCKET"] = inner.SOCKET
        env["PATH"] = f"{env['PATH']}:{inner.BIN}" if env.get("PATH") else inner.BIN
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


@dataclass(frozen=True)
class ImageRoot:
    path: str  # what the runtime mounts: the cache dir, or the user's dir's stage point
    staged: Staged | None = None  # the user's directory, bound at `path` by the job child
    lock: int | None = None  # the image cache's lock (cache.py): held for the run's life


def _stage_point(ctx: Context, name: str) -> str:
    top = ctx.run_dir / STAGE_DIR
    top.mkdir(mode=0o700, exist_ok=True)
    point = top / name
    point.mkdir(mode=0o700, exist_ok=True)
    return str(point)


def stage(ctx: Context, path: str, name: str, what: str, recursive: bool = True) -> Staged:
    """A stage point for one of the user's directories (runtimes.Staged says why)."""
    return Staged(path=path, stage=_stage_point(ctx, name), what=what, recursive=recursive)


def stage_job_binds(ctx: Context, binds: list[Bind]) -> tuple[list[Bind], list[Staged]]:
    """For a runtime that mounts as root (runc, podman): the job's directories of the user's
    (workdir, output dirs, checkpoint dir) mounted from stage points instead of their paths. The
    control dir and the script are in the run dir, which only root changes."""
    out, staged = [], []
    for b in binds:
        if b.ours or b.src in (ctx.control, ctx.script):
            out.append(b)
            continue
        s = stage(ctx, b.src, str(len(staged)), "the job's directory")
        staged.append(s)
        out.append(replace(b, src=s.stage))
    return out, staged


def image_rootfs(ctx: Context) -> ImageRoot:
    """The image as a rootfs directory: the user's directory (staged: root mounts it from a stage
    point, never by its path), or the tarball unpacked once into the node's image cache (keyed by
    content hash; the tarball is opened as the user, and only a regular file is read)."""
    image = ctx.spec.container_image
    assert image is not None
    if any(c in image for c in ",:\\"):  # overlayfs option syntax
        raise RuntimeRefused(f"container image {image}: the path must not contain ',', ':' or '\\'")
    fd = None
    try:
        with as_user(ctx):
            if os.path.isdir(image):
                if not os.access(image, os.R_OK | os.X_OK, effective_ids=True):
                    raise RuntimeRefused(f"container image {image}: permission denied for user {ctx.spec.user}")
            else:  # non-blocking: a FIFO would hang the shepherd here
                fd = os.open(image, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except RuntimeRefused:
        raise
    except FileNotFoundError:
        raise RuntimeRefused(f"container image {image} does not exist on node {ctx.node.node}") from None
    except PermissionError:
        raise RuntimeRefused(f"container image {image}: permission denied for user {ctx.spec.user}") from None
    except OSError as exc:
        raise RuntimeRefused(f"container image {image}: {exc.strerror or exc}") from None
    if fd is None:
        staged = stage(ctx, image, "image", "container image", recursive=False)
        return ImageRoot(staged.stage, staged)
    from .cache import ImageLimits, acquire
    from .rootfs import RootfsError
    node = ctx.node
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise RuntimeRefused(f"container image {image}: neither a directory nor a regular file")
        limits = ImageLimits(node.image_max_bytes, node.image_max_entries, node.image_cache_max_bytes,
                             node.image_unpack_timeout)
        cached = acquire(fd, image, node.image_cache, limits, cancelled=lambda: _cancel_requested(ctx))
        return ImageRoot(cached.path, lock=cached.lock)
    except RootfsError as exc:
        raise RuntimeRefused(f"container image {image}: {exc}") from None
    finally:
        os.close(fd)


def _cancel_requested(ctx: Context) -> bool:
    """Whether the agent asked to cancel the run (its terminate.json in the run dir, root's,
    which it writes before it signals the shepherd): the image cache then stops unpacking. A
    preempt, requeue or node failure lets the unpack finish instead (bounded by its time budget):
    the run then starts and ends as asked, where a refused launch would fail the job."""
    try:
        req = spool.read_json(ctx.run_dir / spool.TERMINATE)
    except ValueError:
        return True  # as the shepherd reads it: a cancel
    except OSError:
        return False
    if req is None:
        return False
    return not (isinstance(req, dict) and req.get("reason") in ("preempt", "requeue", "node_fail"))


def mount_plan_dirs(ctx: Context, binds: list[Bind],
                    extra_dirs: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Mount points to create in the image's overlay: the runtime's own and the binds' (not those
    under the tmpfs/proc/dev the runtime mounts itself)."""
    dirs = [*extra_dirs]
    files = []
    for b in binds:
        if any(inside(b.dst, m) and b.dst != m for m in RUNTIME_MOUNTS):
            continue
        (files if b.is_file else dirs).append(b.dst)
    return tuple(dirs), tuple(files)


def read_tail_as_user(ctx: Context, path: str, size: int = TOOL_ERROR_BYTES) -> bytes | None:
    """The last `size` bytes of the user's file at `path`, read with the user's identity; None
    unless it is a regular file. The path is the user's to change at any moment: it is opened
    O_PATH (which opens no device and waits for no FIFO writer), not through a symlink, and
    reopened for reading only once it is known to be a regular file."""
    try:
        with as_user(ctx):
            ref = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                st = os.fstat(ref)
                if not stat.S_ISREG(st.st_mode):
                    return None
                fd = os.open(f"/proc/self/fd/{ref}", os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
            finally:
                os.close(ref)
    except OSError:
        return None
    try:
        return os.pread(fd, size, max(0, os.fstat(fd).st_size - size))
    except OSError:
        return None
    finally:
        os.close(fd)


def tool_error(ctx: Context, prefix: str, *, strip: bool = False) -> str:
    """The last line a container tool wrote starting with `prefix` (its own error message), from
    the end of the job's error file (the tool's stderr), read as the user; `strip` drops the
    prefix."""
    path = ctx.spec.stderr or ctx.spec.stdout
    data = read_tail_as_user(ctx, path)
    lines = data.decode(errors="replace").splitlines() if data else []
    found = [ln for ln in lines if ln.startswith(prefix)]
    if not found:
        return f"see {path}"
    return found[-1][len(prefix):] if strip else found[-1]
