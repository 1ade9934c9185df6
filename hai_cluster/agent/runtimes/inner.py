"""What a job's container needs so that `srun` and the step server run inside it, whatever its
image holds (busybox has no Python): this node's own Python, bound read-only below /.hai/host
and started through its own dynamic loader (the image's C library may be older than the one
the interpreter was built against), the node agent's step socket in /.hai/step, and small
launchers in /.hai/bin (appended to the job's PATH): srun, scontrol and hcontrol. The batch
script and the step servers run in the image, so srun's tasks on every node start there too.

The launchers run the interpreter with -I and an explicit sys.path: nothing of the image's or
the user's Python reaches them, and they leave the job's environment as it is for the tasks.
What is bound is the interpreter's prefix and the directories of its search path that hold
hai_cluster and its dependencies; all of it is root's, so it is bound straight, not staged.
"""
from __future__ import annotations

import functools
import os
import shlex
import struct
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from .. import spool
from . import outermost

HOST = "/.hai/host"  # the host's paths, as the interpreter needs them, below this
BIN = "/.hai/bin"  # the launchers
STEP_DIR = "/.hai/step"  # the agent's step socket's directory
SOCKET = f"{STEP_DIR}/step.sock"
LAUNCHERS = {"srun": "hai_cluster.cli.srun", "scontrol": "hai_cluster.cli.scontrol",
             "hcontrol": "hai_cluster.cli.hcontrol"}
STEP_SERVER = "hai_cluster.job.stepd"
BIN_DIR = "inner-bin"  # in the run dir (root's): the launchers, bound at BIN
PT_INTERP = 3


@dataclass(frozen=True)
class HostPython:
    executable: str  # the interpreter's real path on the host
    loader: str | None  # its dynamic loader's real path (None: statically linked)
    library_path: tuple[str, ...]  # where the loader finds libpython, libc, ...
    search_path: tuple[str, ...]  # sys.path entries that exist (host paths)
    binds: tuple[str, ...]  # host directories bound at HOST + path, none inside another

    def command(self, module: str, prog: str) -> str:
        """The shell command line, inside the container, that runs `module`'s main() as `prog`
        with the caller's arguments ("$@")."""
        inside = [HOST + p for p in self.search_path]
        code = (f"import sys; sys.argv[0] = {prog!r}; sys.path[:0] = {inside!r}; "
                f"from {module} import main; sys.exit(main())")
        argv = [HOST + self.executable, "-I", "-c", code]
        if self.loader is not None:
            argv = [HOST + self.loader, "--library-path", ":".join(HOST + p for p in self.library_path), *argv]
        return " ".join(shlex.quote(a) for a in argv) + ' "$@"'

    def script(self, module: str, prog: str) -> str:
        return f"#!/bin/sh\nexec {self.command(module, prog)}\n"


def elf_interpreter(path: str) -> str | None:
    """The PT_INTERP of a 64-bit little-endian ELF file (x86-64, arm64), None if it has none."""
    with open(path, "rb") as f:
        head = f.read(64)
        if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
            return None
        phoff, = struct.unpack_from("<Q", head, 32)
        phentsize, phnum = struct.unpack_from("<HH", head, 54)
        for i in range(min(phnum, 256)):
            f.seek(phoff + i * phentsize)
            ph = f.read(56)
            if len(ph) < 56:
                return None
            p_type, _, p_offset, _, _, p_filesz = struct.unpack_from("<IIQQQQ", ph)
            if p_type == PT_INTERP:
                f.seek(p_offset)
                return f.read(min(p_filesz, 4096)).split(b"\0", 1)[0].decode() or None
    return None


@functools.lru_cache(maxsize=1)
def host_python() -> HostPython:
    exe = os.path.realpath(sys.executable)
    interp = elf_interpreter(exe)
    loader = os.path.realpath(interp) if interp else None
    libs = [os.path.dirname(loader)] if loader else []
    libdir = sysconfig.get_config_var("LIBDIR")
    if libdir and os.path.isdir(libdir) and os.path.realpath(libdir) not in libs:
        libs.append(os.path.realpath(libdir))
    search = tuple(dict.fromkeys(os.path.realpath(p) for p in sys.path if p and os.path.isdir(p)))
    prefix = os.path.realpath(sys.base_prefix)
    binds = outermost({prefix, os.path.dirname(exe), *libs, *search} - {"/"})
    return HostPython(exe, loader, tuple(libs), search, binds)


def write_launchers(run_dir: Path) -> str:
    """The launchers in the run dir (root's, readable and executable by all: the run dir is
    0711 and only the job's user knows the name); the directory to bind at BIN."""
    py = host_python()
    d = run_dir / BIN_DIR
    d.mkdir(mode=0o755, exist_ok=True)
    for name, module in LAUNCHERS.items():
        spool.write_bytes_atomic(d / name, py.script(module, name).encode(), mode=0o755, durable=False)
    return str(d)


def step_server_script() -> str:
    """What a step server's run executes in its container (launcher.STEP_SERVER outside one)."""
    return host_python().script(STEP_SERVER, "hai-stepd")
