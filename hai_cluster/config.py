"""The one place that turns config files (TOML) into typed settings.

Every error names the file and the key, and nothing starts on a config it does not understand.
"""
from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .scheduling.mlfq import MlfqConfig

from .paths import DEFAULT_AGENT_SOCKET, DEFAULT_CONTROLLER_SOCKET


class ConfigError(Exception):
    pass


@dataclass(frozen=True)
class SimulatedGpus:
    count: int = 8
    model: str = "Simulated H100 80GB"
    memory_mb: int = 81920


RUNTIMES = ("none", "bwrap", "runc", "podman", "apptainer", "enroot")  # = agent.runspec.RUNTIMES


@dataclass(frozen=True)
class IsolationConfig:
    """[isolation]: how the agent contains jobs (runtimes, cgroups, device nodes)."""
    default_runtime: str = "none"  # for jobs that give no --runtime and no --container-image
    default_container_runtime: str = "bwrap"  # for jobs that give --container-image without --runtime
    device_dir: str = "/dev"  # where the GPU device nodes (nvidiaN, nvidiactl, ...) are
    cgroups: bool = True  # false: never create cgroups (no limits, no cgroup kill)
    cgroup_parent: str = "hai"  # run cgroups: <hierarchy>/<cgroup_parent>/<node>-<spool hash>/<job>.<attempt>
    pids_limit: int = 0  # most processes+threads per run; 0 = no limit
    limit_cpus: bool = True  # cap a run's CPU time at its -c CPUs (cpu.max / cfs_quota)
    container_init: str = "auto"  # static init for runc containers; auto = tini-static or catatonit
    image_cache: str = ""  # rootfs tarballs are unpacked here; "" = <spool>/images


@dataclass(frozen=True)
class AgentConfig:
    name: str
    socket: str = DEFAULT_AGENT_SOCKET
    spool: str = "/var/spool/hai"
    gpu_backend: str = "auto"  # auto | nvml | simulated
    simulated: SimulatedGpus = field(default_factory=SimulatedGpus)
    allow_root_jobs: bool = False
    poll_interval: float = 0.2  # how often the spool is checked for runs that ended
    launch_timeout: float = 30.0  # how long start_run waits for the shepherd to report the launch
    log_level: str = "INFO"
    isolation: IsolationConfig = field(default_factory=IsolationConfig)


@dataclass(frozen=True)
class NodeConfig:
    name: str
    address: str  # host the SSH link connects to; also MASTER_ADDR when this node holds rank 0
    transport: str = "ssh"  # ssh | local
    port: int = 22
    agent_socket: str = DEFAULT_AGENT_SOCKET
    partitions: tuple[str, ...] = ()


@dataclass(frozen=True)
class SshConfig:
    user: str = "root"
    key: str = "/etc/hai/id_ed25519"
    known_hosts: str = "/etc/hai/known_hosts"
    connect_timeout: float = 10.0


PRIORITY_CLASSES = ("urgent", "high", "normal", "low")


@dataclass(frozen=True)
class SchedulerConfig:
    policy: str = "mlfq"  # mlfq | fifo (the baselines in hai-sim are for comparison)
    mlfq: MlfqConfig = field(default_factory=MlfqConfig)
    # The highest --priority a user who is not an admin may ask for.
    max_user_priority: str = "high"


@dataclass(frozen=True)
class ControllerConfig:
    socket: str = DEFAULT_CONTROLLER_SOCKET
    database: str = "sqlite:////var/lib/hai/hai.db"
    state_dir: str = "/var/lib/hai"
    tick_seconds: float = 1.0
    # A node whose agent has not answered for this long goes down: its runs end as NODE_FAIL and
    # are requeued. Until then a link that flaps just delays new work on the node.
    node_down_after: float = 60.0
    # Seconds between keep-alive pings on each agent link; a ping unanswered for twice this long
    # drops the link (and the node shows as not responding).
    ping_interval: float = 5.0
    admins: tuple[str, ...] = ("root",)
    partitions: tuple[str, ...] = ("gpu",)
    default_partition: str = "gpu"
    ssh: SshConfig = field(default_factory=SshConfig)
    nodes: tuple[NodeConfig, ...] = ()
    log_level: str = "INFO"
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    # Days the event history (hcontrol show events) is kept; older events are pruned.
    events_max_age_days: float = 30.0


_TYPES: dict[type, str] = {str: "a string", int: "an integer", float: "a number", bool: "true or false",
                           list: "a list"}


class _Section:
    """Reads one TOML table, checking types and refusing keys it does not know."""

    def __init__(self, path: str, where: str, data: Any) -> None:
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: [{where}] must be a table")
        self.path, self.where, self.data = path, where, dict(data)

    def get(self, key: str, typ: type, default: Any) -> Any:
        if key not in self.data:
            return default
        value = self.data.pop(key)
        ok = isinstance(value, typ) and not (typ in (int, float) and isinstance(value, bool))
        if typ is float and isinstance(value, int) and not isinstance(value, bool):
            value, ok = float(value), True
        if not ok:
            raise ConfigError(f"{self.path}: {self.where}.{key} must be {_TYPES[typ]}, got {value!r}")
        return value

    def strings(self, key: str, default: tuple[str, ...]) -> tuple[str, ...]:
        value = self.get(key, list, None)
        if value is None:
            return default
        if not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{self.path}: {self.where}.{key} must be a list of strings")
        return tuple(value)

    def done(self) -> None:
        if self.data:
            raise ConfigError(f"{self.path}: unknown key(s) in [{self.where}]: {', '.join(sorted(self.data))}")


def _read_toml(path: str | os.PathLike) -> dict:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None


def _positive(path: str, key: str, value: float) -> None:
    if value <= 0:
        raise ConfigError(f"{path}: {key} must be positive, got {value}")


_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def load_agent_config(path: str | os.PathLike) -> AgentConfig:
    path = str(path)
    doc = _Section(path, "top level", _read_toml(path))
    a = _Section(path, "agent", doc.get("agent", dict, {}))
    g = _Section(path, "gpus", doc.get("gpus", dict, {}))
    isolation = _isolation(path, doc.get("isolation", dict, {}))
    doc.done()
    name = a.get("name", str, os.uname().nodename.split(".")[0])
    cfg = AgentConfig(
        name=name,
        socket=resolve(path, a.get("socket", str, DEFAULT_AGENT_SOCKET)),
        spool=resolve(path, a.get("spool", str, "/var/spool/hai")),
        allow_root_jobs=a.get("allow_root_jobs", bool, False),
        poll_interval=a.get("poll_interval", float, 0.2),
        launch_timeout=a.get("launch_timeout", float, 30.0),
        log_level=a.get("log_level", str, "INFO"),
        gpu_backend=g.get("backend", str, "auto"),
        simulated=SimulatedGpus(
            count=g.get("simulated_count", int, 8),
            model=g.get("simulated_model", str, SimulatedGpus.model),
            memory_mb=g.get("simulated_memory_mb", int, SimulatedGpus.memory_mb),
        ),
        isolation=isolation,
    )
    a.done()
    g.done()
    if cfg.gpu_backend not in ("auto", "nvml", "simulated"):
        raise ConfigError(f"{path}: gpus.backend must be auto, nvml or simulated, got {cfg.gpu_backend!r}")
    if cfg.simulated.count < 0:
        raise ConfigError(f"{path}: gpus.simulated_count must be >= 0")
    _positive(path, "agent.poll_interval", cfg.poll_interval)
    _positive(path, "agent.launch_timeout", cfg.launch_timeout)
    if cfg.log_level not in _LOG_LEVELS:
        raise ConfigError(f"{path}: agent.log_level must be one of {', '.join(_LOG_LEVELS)}, got {cfg.log_level!r}")
    return cfg


def _isolation(path: str, raw: Any) -> IsolationConfig:
    sec = _Section(path, "isolation", raw)
    d = IsolationConfig()
    cfg = IsolationConfig(
        default_runtime=sec.get("default_runtime", str, d.default_runtime),
        default_container_runtime=sec.get("default_container_runtime", str, d.default_container_runtime),
        device_dir=resolve(path, sec.get("device_dir", str, d.device_dir)),
        cgroups=sec.get("cgroups", bool, d.cgroups),
        cgroup_parent=sec.get("cgroup_parent", str, d.cgroup_parent),
        pids_limit=sec.get("pids_limit", int, d.pids_limit),
        limit_cpus=sec.get("limit_cpus", bool, d.limit_cpus),
        container_init=sec.get("container_init", str, d.container_init),
        image_cache=sec.get("image_cache", str, d.image_cache),
    )
    sec.done()
    if cfg.image_cache:
        cfg = replace(cfg, image_cache=resolve(path, cfg.image_cache))
    if cfg.container_init not in ("auto", "") and not os.path.isabs(cfg.container_init):
        raise ConfigError(f"{path}: isolation.container_init must be auto, \"\" or an absolute path")
    for key in ("default_runtime", "default_container_runtime"):
        if getattr(cfg, key) not in RUNTIMES:
            raise ConfigError(f"{path}: isolation.{key} must be one of {', '.join(RUNTIMES)}, "
                              f"got {getattr(cfg, key)!r}")
    if cfg.default_container_runtime == "none":
        raise ConfigError(f"{path}: isolation.default_container_runtime must be a container runtime")
    parts = cfg.cgroup_parent.strip("/").split("/")
    if not cfg.cgroup_parent.strip("/") or any(p in ("", ".", "..") for p in parts):
        raise ConfigError(f"{path}: isolation.cgroup_parent must be a relative path like \"hai\", "
                          f"got {cfg.cgroup_parent!r}")
    if cfg.pids_limit < 0:
        raise ConfigError(f"{path}: isolation.pids_limit must be >= 0 (0: no limit)")
    return cfg


def load_controller_config(path: str | os.PathLike) -> ControllerConfig:
    path = str(path)
    doc = _Section(path, "top level", _read_toml(path))
    c = _Section(path, "controller", doc.get("controller", dict, {}))
    s = _Section(path, "ssh", doc.get("ssh", dict, {}))
    scheduler = parse_scheduler(path, doc.get("scheduler", dict, {}))
    raw_nodes = doc.get("nodes", list, [])
    doc.done()
    partitions = c.strings("partitions", ("gpu",))
    if not partitions:
        raise ConfigError(f"{path}: controller.partitions must name at least one partition")
    nodes = []
    for i, raw in enumerate(raw_nodes):
        n = _Section(path, f"nodes[{i}]", raw)
        name = n.get("name", str, None)
        if not name:
            raise ConfigError(f"{path}: nodes[{i}].name is required")
        node = NodeConfig(
            name=name,
            address=n.get("address", str, "127.0.0.1"),
            transport=n.get("transport", str, "ssh"),
            port=n.get("port", int, 22),
            agent_socket=n.get("agent_socket", str, DEFAULT_AGENT_SOCKET),
            partitions=n.strings("partitions", partitions),
        )
        n.done()
        if node.transport not in ("ssh", "local"):
            raise ConfigError(f"{path}: nodes[{i}].transport must be ssh or local, got {node.transport!r}")
        for p in node.partitions:
            if p not in partitions:
                raise ConfigError(f"{path}: nodes[{i}].partitions names unknown partition {p!r}")
        nodes.append(node)
    names = [n.name for n in nodes]
    if len(set(names)) != len(names):
        raise ConfigError(f"{path}: node names must be unique")
    cfg = ControllerConfig(
        socket=c.get("socket", str, DEFAULT_CONTROLLER_SOCKET),
        database=c.get("database", str, "sqlite:////var/lib/hai/hai.db"),
        state_dir=c.get("state_dir", str, "/var/lib/hai"),
        tick_seconds=c.get("tick_seconds", float, 1.0),
        node_down_after=c.get("node_down_after", float, 60.0),
        ping_interval=c.get("ping_interval", float, 5.0),
        admins=c.strings("admins", ("root",)),
        partitions=partitions,
        default_partition=c.get("default_partition", str, partitions[0]),
        log_level=c.get("log_level", str, "INFO"),
        events_max_age_days=c.get("events_max_age_days", float, 30.0),
        ssh=SshConfig(
            user=s.get("user", str, "root"),
            key=s.get("key", str, "/etc/hai/id_ed25519"),
            known_hosts=s.get("known_hosts", str, "/etc/hai/known_hosts"),
            connect_timeout=s.get("connect_timeout", float, 10.0),
        ),
        nodes=tuple(nodes),
        scheduler=scheduler,
    )
    c.done()
    s.done()
    if cfg.default_partition not in partitions:
        raise ConfigError(f"{path}: controller.default_partition {cfg.default_partition!r} is not in partitions")
    _positive(path, "controller.tick_seconds", cfg.tick_seconds)
    _positive(path, "controller.node_down_after", cfg.node_down_after)
    _positive(path, "controller.ping_interval", cfg.ping_interval)
    _positive(path, "controller.events_max_age_days", cfg.events_max_age_days)
    return cfg


def _numbers(sec: _Section, key: str, default: tuple[float, ...]) -> tuple[float, ...]:
    value = sec.get(key, list, None)
    if value is None:
        return default
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        raise ConfigError(f"{sec.path}: {sec.where}.{key} must be a list of numbers")
    return tuple(float(v) for v in value)


def parse_scheduler(path: str, raw: Any) -> SchedulerConfig:
    sec = _Section(path, "scheduler", raw)
    d = MlfqConfig()
    policy = sec.get("policy", str, "mlfq")
    max_prio = sec.get("max_user_priority", str, "high")
    try:
        mlfq = MlfqConfig(
            thresholds=_numbers(sec, "thresholds", d.thresholds),
            quanta=_numbers(sec, "quanta", d.quanta),
            starvation_factor=sec.get("starvation_factor", float, d.starvation_factor),
            starvation_floor=sec.get("starvation_floor", float, d.starvation_floor),
            reservation_after=sec.get("reservation_after", float, d.reservation_after),
            placement=sec.get("placement", str, d.placement),
        )
    except ValueError as exc:
        raise ConfigError(f"{path}: [scheduler] {exc}") from None
    sec.done()
    if policy not in ("mlfq", "fifo"):
        raise ConfigError(f"{path}: scheduler.policy must be mlfq or fifo, got {policy!r}")
    if max_prio not in PRIORITY_CLASSES:
        raise ConfigError(f"{path}: scheduler.max_user_priority must be one of {', '.join(PRIORITY_CLASSES)}")
    return SchedulerConfig(policy=policy, mlfq=mlfq, max_user_priority=max_prio)


def resolve(base: str | os.PathLike, value: str) -> str:
    """Relative paths in a config file are relative to the file's directory."""
    return str((Path(base).parent / value).resolve()) if not os.path.isabs(value) else value
