"""The job runtimes, one table: read by the job-script parser, the run spec's checks, the config,
the agent (which tool to find, which module runs it) and the zygote's pre-imports.

Adding a runtime is a row here and its module in agent/runtimes/ (a `RUNTIME` class there).
Light (a NamedTuple): the shepherd reads it through protocol.runspec on every job start."""
from __future__ import annotations

from typing import NamedTuple


class Runtime(NamedTuple):
    tool: str | None  # the executable the agent looks for on the node (None: nothing to find)
    module: str | None  # its module in hai_cluster/agent/runtimes (None: found, but refused)
    needs_image: bool  # a job must give --container-image
    takes_reference: bool  # --container-image may be a registry reference, not only a path


TABLE: dict[str, Runtime] = {
    "none": Runtime(None, "plain", needs_image=False, takes_reference=False),  # plain processes
    "bwrap": Runtime("bwrap", "bwrap", needs_image=False, takes_reference=False),  # no image: the host's root
    "runc": Runtime("runc", "runc", needs_image=True, takes_reference=False),
    "podman": Runtime("podman", "podman", needs_image=True, takes_reference=True),
    "apptainer": Runtime("apptainer", None, needs_image=True, takes_reference=False),
    "enroot": Runtime("enroot", None, needs_image=True, takes_reference=False),
}
RUNTIMES = tuple(TABLE)
REFERENCE_RUNTIMES = tuple(name for name, r in TABLE.items() if r.takes_reference)
TOOLS = {name: r.tool for name, r in TABLE.items() if r.tool}
SUPPORTED = tuple(name for name, r in TABLE.items() if r.tool and r.module)  # container runtimes the agent runs


def needs_image(runtime: str | None) -> bool:
    """Whether a job in `runtime` (None: the node's default) must name a container image."""
    return runtime is not None and runtime in TABLE and TABLE[runtime].needs_image
