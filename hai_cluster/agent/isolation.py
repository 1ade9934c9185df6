"""What this node offers to contain jobs: runtimes installed, cgroup features, device nodes.

Found once at agent start (NodeIsolation.detect) and written into every run dir as node.json, which
the run's shepherd reads: a run keeps the settings it started with, and the shepherd needs neither
the agent's config file nor a second detection. Light imports only (the shepherd imports it).
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Mapping

from . import cgroups, rlimits
from ..core.runtimes import SUPPORTED, TOOLS
from ..protocol.runspec import RunSpec

if TYPE_CHECKING:
    from ..config import AgentConfig

log = logging.getLogger(__name__)

# Static init binaries that can be bound into any image as its PID 1 (see runtimes/runc.py).
INITS = ("/usr/bin/tini-static", "/usr/local/bin/tini-static", "/usr/bin/catatonit",
         "/usr/libexec/podman/catatonit")
_SEARCH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


JOBS_LEVEL = "jobs"  # in a delegated cgroup: <it>/jobs/<node>-<hash>/<job>.<attempt>


def detect_cgroups(setting: str, node: str, spool: str) -> cgroups.Capabilities:
    """The cgroups of this agent's runs, by [isolation] cgroup_parent: "auto" (below the agent's
    own cgroup when it is a systemd service, else "hai" below the root), "self" (below its own
    cgroup in any case: a unit whose manager is not systemd, the tests), or a path from the root."""
    level = cgroups.agent_cgroup(node, spool)
    if setting in ("auto", "self") and (setting == "self" or cgroups.systemd_service()):
        v2 = cgroups.parse_mounts(_mounts())[0]
        base = cgroups.adopt_delegated(v2, spool) if v2 else None
        if base is not None:
            return cgroups.detect(f"{base}/{JOBS_LEVEL}/{level}", top=base)
        log.warning("cgroups: no delegated cgroup to put the runs in; using /hai below the root")
    root_parent = "hai" if setting in ("auto", "self") else setting.strip("/")
    return cgroups.detect(f"{root_parent}/{level}")


def _mounts() -> str:
    try:
        with open("/proc/self/mounts") as f:
            return f.read()
    except OSError:
        return ""


@dataclass(frozen=True)
class NodeIsolation:
    node: str
    default_runtime: str = "none"
    default_container_runtime: str = "bwrap"
    device_dir: str = "/dev"
    pids_limit: int = 0
    rlimits: tuple[tuple[str, int, int], ...] = ()  # what every job starts with (rlimits.effective)
    limit_cpus: bool = True
    container_init: str | None = None
    tools: Mapping[str, str] = field(default_factory=dict)  # runtime -> its installed binary
    unusable: Mapping[str, str] = field(default_factory=dict)  # runtime installed but failing -> why
    cgroups: cgroups.Capabilities | None = None
    image_cache: str = ""
    # the image cache's caps (IsolationConfig; 0 = no limit, as for a node.json from before them)
    image_max_bytes: int = 0
    image_max_entries: int = 0
    image_cache_max_bytes: int = 0
    image_unpack_timeout: float = 600.0  # seconds an image's hash and unpack may take (0: none)
    runc_root: str = ""

    @classmethod
    def detect(cls, cfg: "AgentConfig") -> "NodeIsolation":
        import shutil
        iso = cfg.isolation
        search = f"{os.environ.get('PATH', '')}:{_SEARCH}"
        tools = {rt: path for rt, tool in TOOLS.items() if (path := shutil.which(tool, path=search))}
        unusable = {}
        if "podman" in tools:  # installed is not enough: it may not run here (crun, cgroups, storage)
            from .runtimes.podman import check
            if (why := check(tools["podman"], tools.get("runc"))) is not None:
                log.warning("podman is installed but does not work: %s", why)
                unusable["podman"] = why
                tools.pop("podman")
        init = None
        if iso.container_init == "auto":
            init = next((p for p in INITS if os.access(p, os.X_OK)), None)
        elif iso.container_init:
            init = iso.container_init
        caps = None
        if iso.cgroups:
            caps = detect_cgroups(iso.cgroup_parent, cfg.name, cfg.spool)
        node = cls(node=cfg.name, default_runtime=iso.default_runtime,
                   default_container_runtime=iso.default_container_runtime, device_dir=iso.device_dir,
                   pids_limit=iso.pids_limit, rlimits=rlimits.effective(iso.rlimits),
                   limit_cpus=iso.limit_cpus, container_init=init,
                   tools=tools, unusable=unusable, cgroups=caps if caps is not None and caps.usable else None,
                   image_cache=iso.image_cache or os.path.join(cfg.spool, "images"),
                   image_max_bytes=iso.image_max_bytes, image_max_entries=iso.image_max_entries,
                   image_cache_max_bytes=iso.image_cache_max_bytes, image_unpack_timeout=iso.image_unpack_timeout,
                   runc_root=os.path.join(cfg.spool, "runc"))
        node.log_summary()
        return node

    def log_summary(self) -> None:
        if self.cgroups is None:
            log.warning("no usable cgroups: jobs run without memory/CPU/process limits, and what "
                        "leaves a job's process group is found only through the process tree")
        else:
            log.info("cgroups under %s: %s", self.cgroups.parent,
                     ", ".join(f"{k}={v or 'no'}" for k, v in self.cgroups.summary().items()))
        log.info("runtimes: %s (default %s, with an image %s); container init %s; devices in %s",
                 ", ".join(self.runtimes()), self.default_runtime, self.default_container_runtime,
                 self.container_init or "none", self.device_dir)

    def release(self) -> None:
        """At agent exit: remove this agent's level of the cgroup tree if no run is left in it
        (a busy one stays, with its running jobs, for the next agent), and the delegated tree's
        jobs/ level with it."""
        if self.cgroups is None:
            return
        parent = self.cgroups.parent
        above = parent.rpartition("/")[0]
        levels = [parent, above] if above.endswith(f"/{JOBS_LEVEL}") else [parent]
        for mount in (self.cgroups.v2, *self.cgroups.v1.values()):
            for level in levels if mount else ():
                try:
                    os.rmdir(os.path.join(mount, level))
                except OSError:
                    pass

    def runtimes(self) -> list[str]:
        return ["none", *(rt for rt in self.tools if rt in SUPPORTED)]

    def runtime_for(self, spec: RunSpec) -> str:
        if spec.runtime is not None:
            return spec.runtime
        return self.default_container_runtime if spec.container_image else self.default_runtime

    def hello(self) -> dict:
        """For the controller: which limits are enforced and how, and which runtimes exist."""
        summary = self.cgroups.summary() if self.cgroups else dict.fromkeys(cgroups.FEATURES)
        return {"isolation": summary, "runtimes": self.runtimes(), "default_runtime": self.default_runtime,
                "default_container_runtime": self.default_container_runtime}

    @cached_property
    def wire_json(self) -> bytes:
        """node.json's content, encoded once: the same for every run of an agent."""
        return json.dumps(self.to_wire(), sort_keys=True).encode()

    def to_wire(self) -> dict:
        d = asdict(self)
        d["tools"] = dict(self.tools)
        d["unusable"] = dict(self.unusable)
        d["cgroups"] = self.cgroups.to_wire() if self.cgroups else None
        return d

    @classmethod
    def from_wire(cls, d: Any) -> "NodeIsolation":
        d = dict(d)
        d["cgroups"] = cgroups.Capabilities.from_wire(d["cgroups"]) if d.get("cgroups") else None
        d["rlimits"] = tuple((str(n), int(soft), int(hard)) for n, soft, hard in d.get("rlimits") or ())
        return cls(**d)
