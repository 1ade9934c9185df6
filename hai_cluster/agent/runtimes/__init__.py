"""Container runtimes behind one small interface.

A runtime turns a run into a `Launch`: the argv that the shepherd's job child execs (plus any
bundle/config files it writes into the run dir first), how that child must prepare itself, and
what to clean up afterwards. The shepherd's job child stays the shepherd's child, in its own
session and process group, whatever the runtime: `bwrap`, `runc run`, `podman run` (foreground)
are ordinary processes that end when the job's main process ends, so the time limit, terminate
notices, grace period and kill work the same for every runtime.

    none       the job script itself, as the user (no container)
    bwrap      bubblewrap as the user: the host's root or an image, read-only; the job's dirs bound
    runc       an OCI bundle; runc runs as root, the container's processes as the user
    podman     rootful podman (with runc) as the user: a local image, or a rootfs dir/tarball
    apptainer, enroot: refused (not packaged in Debian; not supported by this agent yet)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

from ...core.runtimes import TABLE
from ...protocol.runspec import RunSpec

if TYPE_CHECKING:
    from ..isolation import NodeIsolation


def inside(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def outermost(paths) -> tuple[str, ...]:
    """The paths not inside another of them (a bind of the outer one shows the inner ones)."""
    out: list[str] = []
    for p in sorted(set(paths), key=lambda p: (p.count("/"), p)):
        if not any(inside(p, o) for o in out):
            out.append(p)
    return tuple(sorted(out))


class RuntimeRefused(Exception):
    """The run cannot start with this runtime on this node; the text says why (launch_failed)."""


@dataclass(frozen=True)
class Staged:
    """A directory of the user's that root will mount (a bind source, an image's lower layer).
    Root must never resolve the user's path itself: the user can swap any part of it for a
    symlink between a check and the mount. The job child opens `path` as the user (O_PATH: what
    it gets, the user could reach) and binds that fd at `stage`, a mount point in the run dir
    that only root can change; the runtime mounts from `stage` (rootfs.open_staged, assemble)."""
    path: str
    stage: str
    what: str  # for messages: "container image", "the job's directory"
    recursive: bool = True  # rbind (the job's dirs, with their submounts) or a plain bind (an image)


@dataclass(frozen=True)
class Overlay:
    """An image rootfs made writable for mount points only: an overlay with `lower` (the image,
    never modified) under a private tmpfs `scratch`, mounted at `root`. `dirs`/`files` are the
    mount points to create in it (container paths)."""
    lower: str
    scratch: str
    root: str
    dirs: tuple[str, ...] = ()
    files: tuple[str, ...] = ()


@dataclass(frozen=True)
class MountPlan:
    """What the job child mounts, as root, in a mount namespace of its own (it vanishes with the
    job's processes): the user's directories at their stage points first, then the overlay."""
    staged: tuple[Staged, ...] = ()
    overlay: Overlay | None = None


@dataclass
class Launch:
    argv: list[str]
    env: dict[str, str]
    as_user: bool = True  # False: exec as root (runc); output files are still opened as the user
    join_cgroup: bool = True  # False: the runtime puts the job into the run's cgroup itself
    mounts: MountPlan | None = None
    keep_fds: tuple[int, ...] = ()  # fds the runtime writes its status to (the child inherits them,
    # the shepherd closes its copies after the fork)
    signal_exit_codes: bool = False  # the runtime exits 128+N when the job died of signal N
    cleanup: list[list[str]] = field(default_factory=list)  # commands that remove what it left
    label: str = ""  # what a failed exec names (default: argv[0])
    # False: the runtime's own process (the main one) must not get the job's signals, which would
    # kill it (bwrap): the rest of the process group gets them, SIGKILL goes to all
    signal_main: bool = True
    status_fd: int | None = None  # the shepherd's end of a pipe the runtime reports its setup on
    holds: tuple[int, ...] = ()  # fds the shepherd keeps open for the run's life: the image cache
    # lock (runtimes/cache.py), released when the shepherd exits


@dataclass(frozen=True)
class Context:
    spec: RunSpec
    run_dir: Path
    node: NodeIsolation
    groups: list[int]  # the user's groups
    env: Mapping[str, str]  # the job's environment (the controller's, plus HAI_CONTROL_DIR)
    script: str  # the job script in the run dir
    control: str  # HAI_CONTROL_DIR
    cgroup_path: str | None  # the run's cgroup, relative to each hierarchy root (None: no cgroups)


class Runtime:
    name = ""

    def prepare(self, ctx: Context) -> Launch:
        """Build the launch (as root, in the shepherd, before the fork). Raises RuntimeRefused."""
        raise NotImplementedError

    def after_exit(self, ctx: Context, launch: Launch, wait_status: int | None) -> str | None:
        """A setup failure of the runtime itself, found once it exited (None: the job ran)."""
        return None


class NotSupported(Runtime):
    """apptainer, enroot: named by the job, refused with the reason (the missing tool)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def prepare(self, ctx: Context) -> Launch:
        if self.name not in ctx.node.tools:
            raise RuntimeRefused(f"{self.name} is not installed on node {ctx.node.node}")
        raise RuntimeRefused(f"the {self.name} runtime is not supported by this agent yet "
                             f"(node {ctx.node.node}); use --runtime=bwrap, runc or podman")


def get(name: str) -> Runtime:
    """The runtime `name` (core/runtimes.py), its module imported on demand: a plain job's
    shepherd should not pay for tarfile, subprocess, ... (the zygote imports them all once)."""
    entry = TABLE.get(name)
    if entry is None or entry.module is None:
        return NotSupported(name)
    return import_module(f"{__name__}.{entry.module}").RUNTIME()
