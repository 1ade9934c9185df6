"""The one place that turns config files (TOML) into typed settings.

Every error names the file and the key, and nothing starts on a config it does not understand.
"""
from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .core.model import MAX_GRACE_SECONDS, PRIORITY_CLASSES
from .core.runtimes import RUNTIMES
from .core.timefmt import parse_time_limit
from .scheduling.mlfq import MlfqConfig
from .scheduling.registry import CONTROLLER_POLICIES

from .paths import DEFAULT_AGENT_SOCKET, DEFAULT_CONTROLLER_SOCKET


class ConfigError(Exception):
    pass


@dataclass(frozen=True)
class SimulatedGpus:
    count: int = 8
    model: str = "Simulated H100 80GB"
    memory_mb: int = 81920
    # Topology the fake NVML reports (same shape as real NVML's): [a, b, NVLinks] pairs, and
    # [a, b, common-ancestor level] pairs (NVML levels 0-50); no levels: topology "not supported".
    nvlinks: tuple[tuple[int, int, int], ...] = ()
    levels: tuple[tuple[int, int, int], ...] = ()
    default_level: int = 50  # for pairs not in levels, when levels are given
    mig: tuple[int, ...] = ()  # cards in MIG mode
    # A file the fake NVML's event set reads XIDs from ("GPU XID" per line, appended); "" = no event sets.
    xid_file: str = ""
    # The admin's MIG layout per card, (index, profiles such as "3g.40gb"); those cards are in MIG mode.
    mig_layout: tuple[tuple[int, tuple[str, ...]], ...] = ()


@dataclass(frozen=True)
class SharingConfig:
    """[sharing]: which cards the node offers to fractional-GPU jobs, and how shares are enforced."""
    gpus: tuple[int, ...] = ()  # card indices offered for sharing (none by default)
    mps_control: str = "nvidia-cuda-mps-control"  # MPS control executable (a path or a name on PATH)
    allow_unisolated: bool = False  # share cards with neither MPS nor MIG (time-slicing only)
    run_dir: str = ""  # MPS pipe and log directories, one per card; "" = <spool>/mps




RLIMIT_NAMES = ("as", "core", "cpu", "data", "fsize", "memlock", "nofile", "nproc", "stack")
# What slurmd's unit gives its jobs (LimitMEMLOCK=infinity: NCCL over InfiniBand pins memory;
# LimitNOFILE=131072: data loaders), and no core files unless a job asks (`ulimit -c unlimited`):
# a crashing 8-GPU job would write tens of GB per rank into its working directory.
DEFAULT_RLIMITS = (("memlock", -1, -1), ("nofile", 131072, 131072), ("core", 0, -1))


@dataclass(frozen=True)
class IsolationConfig:
    """[isolation]: how the agent contains jobs (runtimes, cgroups, device nodes)."""
    default_runtime: str = "none"  # for jobs that give no --runtime and no --container-image
    default_container_runtime: str = "bwrap"  # for jobs that give --container-image without --runtime
    device_dir: str = "/dev"  # where the GPU device nodes (nvidiaN, nvidiactl, ...) are
    cgroups: bool = True  # false: never create cgroups (no limits, no cgroup kill)
    cgroup_parent: str = "hai"  # run cgroups: <hierarchy>/<cgroup_parent>/<node>-<spool hash>/<job>.<attempt>
    # most processes+threads per run (a fork bomb stops there, not at the node's pid_max); 0 = no limit
    pids_limit: int = 65536
    # (name, soft, hard) resource limits every job starts with (agent/rlimits.py), -1 = unlimited
    rlimits: tuple[tuple[str, int, int], ...] = DEFAULT_RLIMITS
    limit_cpus: bool = True  # cap a run's CPU time at its -c CPUs (cpu.max / cfs_quota)
    container_init: str = "auto"  # static init for runc containers; auto = tini-static or catatonit
    image_cache: str = ""  # rootfs tarballs are unpacked here; "" = <spool>/images
    # caps on what one tarball unpacks to (file contents, archive members), and on the whole
    # cache (least recently used images no run holds are removed); 0 = no limit
    image_max_bytes: int = 64 * 2**30
    image_max_entries: int = 500_000
    image_cache_max_bytes: int = 256 * 2**30
    # seconds one image's hash, read and unpack may take together (a cancel stops it too); 0 = none
    image_unpack_timeout: float = 600.0


# 48 double-bit ECC, 63/64 row remapping recorded/failed, 74 NVLink, 79 fallen off the bus,
# 92 high single-bit ECC rate, 94/95 contained/uncontained ECC, 119/120 GSP timeout/error
DEFAULT_CRITICAL_XIDS = (48, 63, 64, 74, 79, 92, 94, 95, 119, 120)


@dataclass(frozen=True)
class AgentTelemetryConfig:
    """[telemetry] on an agent: the GPU/run sampler (agent/telemetry.py)."""
    enabled: bool = True
    interval: float = 5.0  # seconds between samples
    history: int = 720  # samples kept in the agent's ring buffer (unsent ones wait there for a link)
    simulated_util: int = 90  # simulated GPUs: utilization % of a GPU a run holds (0 for free GPUs)
    simulated_process_memory_mb: int = 4096  # simulated GPUs: memory a run's process uses per GPU


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
    cpus: int = 0  # CPUs the node offers to jobs (Slurm's CPUs=); 0 = the machine's count
    log_level: str = "INFO"
    isolation: IsolationConfig = field(default_factory=IsolationConfig)
    telemetry: AgentTelemetryConfig = field(default_factory=AgentTelemetryConfig)
    sharing: SharingConfig = field(default_factory=SharingConfig)
    # Node health (agent/health.py): the site's program ("" = none), how often all checks run,
    # the program's time limit, and the spool usage at which the node counts as unhealthy.
    health_check_program: str = ""
    health_check_interval: float = 60.0
    health_check_timeout: float = 30.0
    spool_full_percent: float = 95.0
    # XIDs (NVML events) that drain the node until an admin resumes it: NVIDIA's "reset the GPU" ones.
    critical_xids: tuple[int, ...] = DEFAULT_CRITICAL_XIDS
    # transport/rpc.py on the agent socket: a frame must arrive within frame_timeout; a connection
    # idle (no request, nothing in flight) for idle_timeout is dropped: keep it well above the
    # controller's ping_interval. 0 = off.
    frame_timeout: float = 30.0
    idle_timeout: float = 120.0
    # How shepherds start (agent/starter.py): "fork" from the pre-imported zygote, "exec" as a
    # fresh interpreter each (the zygote's fallback too).
    shepherd_start: str = "fork"


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




@dataclass(frozen=True)
class TelemetryConfig:
    """[telemetry] on the controller: what it keeps of the agents' samples (controller/telemetry.py)."""
    history: int = 720  # samples kept per node in memory (hstat, hstat JOB)
    persist_interval: float = 30.0  # seconds between writes of live runs' rollups to the store
    idle_util_below: float = 0.0  # percent; a run whose GPUs all stay under it is idle; 0 = off
    idle_after: float = 600.0  # seconds under idle_util_below before a run is flagged idle
    metrics_listen: str = ""  # [metrics] listen: "host:port" of the Prometheus endpoint; "" = off


@dataclass(frozen=True)
class SchedulerConfig:
    policy: str = "mlfq"  # mlfq | fifo (the baselines in hai-sim are for comparison)
    mlfq: MlfqConfig = field(default_factory=MlfqConfig)
    # The highest --priority a user who is not an admin may ask for.
    max_user_priority: str = "high"


@dataclass(frozen=True)
class PartitionConfig:
    """A [[partitions]] table: a named node set with limits (Slurm's PartitionName= line)."""
    name: str
    max_time: int | None = None  # seconds; longer -t is refused, a job without -t gets this
    allowed_users: tuple[str, ...] | None = None  # None: everyone (with allowed_groups: either)
    allowed_groups: tuple[str, ...] | None = None
    nodes: tuple[str, ...] | None = None  # None: nodes join through their own `partitions`

    def allows(self, user: str, groups: set[str]) -> bool:
        if self.allowed_users is None and self.allowed_groups is None:
            return True
        return user in (self.allowed_users or ()) or bool(groups & set(self.allowed_groups or ()))


@dataclass(frozen=True)
class AccessConfig:
    """[access]: roles by user name or "@group" (see controller/access.py), and abuse limits."""
    admins: tuple[str, ...] = ("root",)  # everything: accounts, limits, any job, any node state
    operators: tuple[str, ...] = ()  # hold/release/requeue/preempt any job; drain/resume nodes
    max_connections_per_uid: int = 64  # open controller connections one uid may hold (0: no cap)
    # transport/rpc.py: a client's frame must arrive (and a reply be read) within frame_timeout;
    # a client that sends nothing with nothing in flight for idle_timeout is dropped. 0 = off.
    client_frame_timeout: float = 30.0
    client_idle_timeout: float = 300.0
    # transport/rpc.py, the cost of one uid's requests: the largest frame (a submission: script and
    # environment), requests handled at once per connection and per uid, and bytes of frames being
    # decoded or handled per uid. A client at a limit is read no further until a request completes.
    max_request_bytes: int = 8 * 1024 * 1024
    max_requests_in_flight: int = 16
    max_requests_in_flight_per_uid: int = 32
    max_request_bytes_per_uid: int = 16 * 1024 * 1024
    # controller/submitrate.py: jobs one uid may submit per second (sustained) and at once (every
    # task of an array counts); the store keeps a row for every job. 0 = no limit.
    submit_rate: float = 10.0
    submit_burst: int = 10000


@dataclass(frozen=True)
class LimitsConfig:
    """Per-user or per-account limits; 0 = no limit."""
    max_gpus: int = 0  # GPUs held by running jobs (beyond it jobs wait with QuotaLimit)
    max_pending: int = 0  # pending jobs (beyond it submissions are refused)
    max_jobs: int = 0  # pending + running jobs (beyond it submissions are refused)
    max_pending_bytes: int = 0  # bytes the pending jobs' specs (script, environment) take in the store


# [limits] for every user, unless the config says otherwise: one user cannot fill the store.
USER_LIMIT_DEFAULTS = LimitsConfig(max_pending=10000, max_pending_bytes=256 * 2**20)


@dataclass(frozen=True)
class AccountConfig:
    """[[accounts]]: a group of users with a fair-share weight and limits for the whole account."""
    name: str
    users: tuple[str, ...] = ()  # user names or "@group"; a user's default account is the first listing them
    shares: int = 1
    limits: LimitsConfig = field(default_factory=LimitsConfig)


@dataclass(frozen=True)
class FairShareConfig:
    half_life: float = 7 * 86400.0  # seconds after which past GPU-seconds count half
    enabled: bool = True  # false: every factor is 1 (no fair-share ordering)


DEFAULT_ACCOUNT = "default"  # the account of users no [[accounts]] entry lists


@dataclass(frozen=True)
class ControllerConfig:
    socket: str = DEFAULT_CONTROLLER_SOCKET
    database: str = "sqlite:////var/lib/hai/hai.db"
    state_dir: str = "/var/lib/hai"
    tick_seconds: float = 1.0
    # A pass an event (submission, job end) asks for starts at least this long after the previous
    # one began (Slurm's sched_min_interval): a burst of events shares passes; a lone one waits not.
    min_pass_interval: float = 0.05
    # A node whose agent has not answered for this long goes down: its runs end as NODE_FAIL and
    # are requeued. Until then a link that flaps just delays new work on the node.
    node_down_after: float = 60.0
    # Seconds between keep-alive pings on each agent link; a ping unanswered for twice this long
    # drops the link (and the node shows as not responding).
    ping_interval: float = 5.0
    # PostgreSQL: a standby controller takes over when the active one has not renewed its lease
    # for this long (renewed every third of it). See controller/leader.py.
    lease_duration: float = 15.0
    admins: tuple[str, ...] = ("root",)
    partitions: tuple[str, ...] = ("gpu",)
    default_partition: str = "gpu"
    partition_limits: tuple[PartitionConfig, ...] = ()  # from [[partitions]] tables
    max_array_size: int = 1001  # --array task indices must be below this (Slurm's MaxArraySize)
    max_script_bytes: int = 4 * 2**20  # a job script (Slurm's max_script_size)
    max_env_bytes: int = 2**20  # a submission's environment, names and values together
    max_grace: int = 600  # seconds: the longest --grace a job may ask for (the agent's bound is 3600)
    kill_invalid_depend: bool = False  # cancel a job whose dependency can never be satisfied
    ssh: SshConfig = field(default_factory=SshConfig)
    nodes: tuple[NodeConfig, ...] = ()
    log_level: str = "INFO"
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)

    def partition(self, name: str) -> PartitionConfig:
        return next((p for p in self.partition_limits if p.name == name), PartitionConfig(name))
    access: AccessConfig = field(default_factory=AccessConfig)
    user_limits: LimitsConfig = USER_LIMIT_DEFAULTS  # [limits]: for every user
    accounts: tuple[AccountConfig, ...] = ()
    fairshare: FairShareConfig = field(default_factory=FairShareConfig)
    # [limits.classes]: most GPUs one user's running jobs of a priority class may hold ((class, GPUs))
    class_limits: tuple[tuple[str, int], ...] = ()
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
    telemetry = _agent_telemetry(path, doc.get("telemetry", dict, {}))
    sharing = _sharing(path, doc.get("sharing", dict, {}))
    doc.done()
    name = a.get("name", str, os.uname().nodename.split(".")[0])
    cfg = AgentConfig(
        name=name,
        socket=resolve(path, a.get("socket", str, DEFAULT_AGENT_SOCKET)),
        spool=resolve(path, a.get("spool", str, "/var/spool/hai")),
        allow_root_jobs=a.get("allow_root_jobs", bool, False),
        poll_interval=a.get("poll_interval", float, 0.2),
        launch_timeout=a.get("launch_timeout", float, 30.0),
        cpus=a.get("cpus", int, 0),
        log_level=a.get("log_level", str, "INFO"),
        gpu_backend=g.get("backend", str, "auto"),
        simulated=SimulatedGpus(
            count=g.get("simulated_count", int, 8),
            model=g.get("simulated_model", str, SimulatedGpus.model),
            memory_mb=g.get("simulated_memory_mb", int, SimulatedGpus.memory_mb),
            nvlinks=_triples(g, "simulated_nvlinks"),
            levels=_triples(g, "simulated_levels"),
            default_level=g.get("simulated_default_level", int, 50),
            mig=_indices(g, "simulated_mig"),
            xid_file=resolve(path, x) if (x := g.get("simulated_xid_file", str, "")) else "",
            mig_layout=_mig_layout(g, "simulated_mig_layout"),
        ),
        isolation=isolation,
        telemetry=telemetry,
        sharing=sharing,
        health_check_program=a.get("health_check_program", str, ""),
        health_check_interval=a.get("health_check_interval", float, 60.0),
        health_check_timeout=a.get("health_check_timeout", float, 30.0),
        spool_full_percent=a.get("spool_full_percent", float, 95.0),
        critical_xids=_xids(a, "critical_xids"),
        frame_timeout=a.get("frame_timeout", float, 30.0),
        idle_timeout=a.get("idle_timeout", float, 120.0),
        shepherd_start=a.get("shepherd_start", str, "fork"),
    )
    a.done()
    g.done()
    if cfg.health_check_program and not os.path.isabs(cfg.health_check_program):
        raise ConfigError(f"{path}: agent.health_check_program must be an absolute path, "
                          f"got {cfg.health_check_program!r}")
    if cfg.cpus < 0:
        raise ConfigError(f"{path}: agent.cpus must be >= 0 (0: the machine's count), got {cfg.cpus}")
    for key in ("frame_timeout", "idle_timeout"):
        if getattr(cfg, key) < 0:
            raise ConfigError(f"{path}: agent.{key} must be >= 0 (0: off), got {getattr(cfg, key):g}")
    _positive(path, "agent.health_check_interval", cfg.health_check_interval)
    _positive(path, "agent.health_check_timeout", cfg.health_check_timeout)
    if not 0 < cfg.spool_full_percent <= 100:
        raise ConfigError(f"{path}: agent.spool_full_percent must be in (0, 100], got {cfg.spool_full_percent}")
    if cfg.gpu_backend not in ("auto", "nvml", "simulated"):
        raise ConfigError(f"{path}: gpus.backend must be auto, nvml or simulated, got {cfg.gpu_backend!r}")
    if cfg.simulated.count < 0:
        raise ConfigError(f"{path}: gpus.simulated_count must be >= 0")
    _positive(path, "agent.poll_interval", cfg.poll_interval)
    _positive(path, "agent.launch_timeout", cfg.launch_timeout)
    if cfg.log_level not in _LOG_LEVELS:
        raise ConfigError(f"{path}: agent.log_level must be one of {', '.join(_LOG_LEVELS)}, got {cfg.log_level!r}")
    if cfg.shepherd_start not in ("fork", "exec"):
        raise ConfigError(f"{path}: agent.shepherd_start must be fork or exec, got {cfg.shepherd_start!r}")
    return cfg


def _agent_telemetry(path: str, raw: Any) -> AgentTelemetryConfig:
    sec = _Section(path, "telemetry", raw)
    d = AgentTelemetryConfig()
    cfg = AgentTelemetryConfig(
        enabled=sec.get("enabled", bool, d.enabled),
        interval=sec.get("interval", float, d.interval),
        history=sec.get("history", int, d.history),
        simulated_util=sec.get("simulated_util", int, d.simulated_util),
        simulated_process_memory_mb=sec.get("simulated_process_memory_mb", int, d.simulated_process_memory_mb),
    )
    sec.done()
    _positive(path, "telemetry.interval", cfg.interval)
    _positive(path, "telemetry.history", cfg.history)
    if not 0 <= cfg.simulated_util <= 100:
        raise ConfigError(f"{path}: telemetry.simulated_util must be a percentage (0-100), got {cfg.simulated_util}")
    if cfg.simulated_process_memory_mb < 0:
        raise ConfigError(f"{path}: telemetry.simulated_process_memory_mb must be >= 0")
    return cfg


def _controller_telemetry(path: str, raw: Any, metrics: Any) -> TelemetryConfig:
    sec = _Section(path, "telemetry", raw)
    m = _Section(path, "metrics", metrics)
    d = TelemetryConfig()
    cfg = TelemetryConfig(
        history=sec.get("history", int, d.history),
        persist_interval=sec.get("persist_interval", float, d.persist_interval),
        idle_util_below=sec.get("idle_util_below", float, d.idle_util_below),
        idle_after=sec.get("idle_after", float, d.idle_after),
        metrics_listen=m.get("listen", str, d.metrics_listen),
    )
    sec.done()
    m.done()
    _positive(path, "telemetry.history", cfg.history)
    _positive(path, "telemetry.persist_interval", cfg.persist_interval)
    _positive(path, "telemetry.idle_after", cfg.idle_after)
    if not 0 <= cfg.idle_util_below <= 100:
        raise ConfigError(f"{path}: telemetry.idle_util_below must be a percentage (0-100; 0 = off), "
                          f"got {cfg.idle_util_below:g}")
    if cfg.metrics_listen:
        host, sep, port = cfg.metrics_listen.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"{path}: metrics.listen must be \"host:port\" (e.g. \"127.0.0.1:9464\"), "
                              f"got {cfg.metrics_listen!r}")
    return cfg
def _indices(sec: _Section, key: str) -> tuple[int, ...]:
    value = sec.get(key, list, [])
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
        raise ConfigError(f"{sec.path}: {sec.where}.{key} must be a list of GPU indices")
    return tuple(value)


def _xids(sec: _Section, key: str) -> tuple[int, ...]:
    value = sec.get(key, list, None)
    if value is None:
        return DEFAULT_CRITICAL_XIDS
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value):
        raise ConfigError(f"{sec.path}: {sec.where}.{key} must be a list of XID numbers, got {value!r}")
    return tuple(value)


def _mig_layout(sec: _Section, key: str) -> tuple[tuple[int, tuple[str, ...]], ...]:
    """{ 0 = ["3g.40gb", "2g.20gb"] }: MIG instances per card, at most MIG_SLICES compute slices."""
    from .core.sharing import MIG_SLICES, mig_profile
    out = []
    for card, profiles in sec.get(key, dict, {}).items():
        where = f"{sec.path}: {sec.where}.{key}.{card}"
        if not str(card).isdigit():
            raise ConfigError(f"{where}: the key must be a GPU index")
        if not isinstance(profiles, list) or not profiles or not all(
                isinstance(p, str) and mig_profile(p) for p in profiles):
            raise ConfigError(f"{where} must be a list of MIG profiles such as \"3g.40gb\"")
        if sum(mig_profile(p)[0] for p in profiles) > MIG_SLICES:
            raise ConfigError(f"{where}: the profiles take more than the card's {MIG_SLICES} compute slices")
        out.append((int(card), tuple(profiles)))
    return tuple(sorted(out))


def _triples(sec: _Section, key: str) -> tuple[tuple[int, int, int], ...]:
    value = sec.get(key, list, [])
    ok = all(isinstance(v, list) and len(v) == 3 and all(isinstance(x, int) and not isinstance(x, bool)
                                                         and x >= 0 for x in v) for v in value)
    if not ok:
        raise ConfigError(f"{sec.path}: {sec.where}.{key} must be a list of [gpu, gpu, number] triples")
    return tuple(tuple(v) for v in value)


def _sharing(path: str, raw: Any) -> SharingConfig:
    sec = _Section(path, "sharing", raw)
    d = SharingConfig()
    mps = sec.get("mps_control", str, d.mps_control)
    cfg = SharingConfig(
        gpus=_indices(sec, "gpus"),
        mps_control=resolve(path, mps) if "/" in mps else mps,
        allow_unisolated=sec.get("allow_unisolated", bool, d.allow_unisolated),
        run_dir=sec.get("run_dir", str, d.run_dir),
    )
    sec.done()
    if not cfg.mps_control:
        raise ConfigError(f"{path}: sharing.mps_control must not be empty")
    return replace(cfg, run_dir=resolve(path, cfg.run_dir)) if cfg.run_dir else cfg


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
        rlimits=_rlimits(path, sec.get("rlimits", dict, {}), d.rlimits),
        limit_cpus=sec.get("limit_cpus", bool, d.limit_cpus),
        container_init=sec.get("container_init", str, d.container_init),
        image_cache=sec.get("image_cache", str, d.image_cache),
        image_max_bytes=sec.get("image_max_bytes", int, d.image_max_bytes),
        image_max_entries=sec.get("image_max_entries", int, d.image_max_entries),
        image_cache_max_bytes=sec.get("image_cache_max_bytes", int, d.image_cache_max_bytes),
        image_unpack_timeout=sec.get("image_unpack_timeout", float, d.image_unpack_timeout),
    )
    sec.done()
    if cfg.image_cache:
        cfg = replace(cfg, image_cache=resolve(path, cfg.image_cache))
    for key in ("image_max_bytes", "image_max_entries", "image_cache_max_bytes", "image_unpack_timeout"):
        if getattr(cfg, key) < 0:
            raise ConfigError(f"{path}: isolation.{key} must be >= 0 (0: no limit)")
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


def _rlimit_pair(value: Any) -> tuple[int, int] | None:
    """N, "unlimited" or "SOFT:HARD" -> (soft, hard), -1 for unlimited; None if it is none of them."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return None
    parts = str(value).split(":")
    if len(parts) not in (1, 2):
        return None
    try:
        numbers = [-1 if p == "unlimited" else int(p) for p in parts]
    except ValueError:
        return None
    if any(n < -1 or n == -1 and p != "unlimited" for n, p in zip(numbers, parts)):
        return None
    return numbers[0], numbers[-1]


def _rlimits(path: str, raw: dict, defaults: tuple[tuple[str, int, int], ...]) -> tuple[tuple[str, int, int], ...]:
    """[isolation.rlimits]: NAME = N | "unlimited" | "SOFT:HARD" | "inherit" (the agent's own),
    over the defaults."""
    limits = {name: (soft, hard) for name, soft, hard in defaults}
    for name, value in raw.items():
        where = f"{path}: isolation.rlimits.{name}"
        if name not in RLIMIT_NAMES:
            raise ConfigError(f"{where}: unknown limit (known: {', '.join(RLIMIT_NAMES)})")
        if value == "inherit":
            limits.pop(name, None)
            continue
        pair = _rlimit_pair(value)
        if pair is None:
            raise ConfigError(f"{where}: expected a number, \"unlimited\", \"SOFT:HARD\" or \"inherit\", got {value!r}")
        soft, hard = pair
        if hard != -1 and (soft == -1 or soft > hard):
            raise ConfigError(f"{where}: the soft limit {soft} is above the hard limit {hard}")
        limits[name] = (soft, hard)
    return tuple((name, soft, hard) for name, (soft, hard) in limits.items())


def load_controller_config(path: str | os.PathLike) -> ControllerConfig:
    path = str(path)
    doc = _Section(path, "top level", _read_toml(path))
    c = _Section(path, "controller", doc.get("controller", dict, {}))
    s = _Section(path, "ssh", doc.get("ssh", dict, {}))
    sharing = _Section(path, "gpu_sharing", doc.get("gpu_sharing", dict, {}))
    scheduler = parse_scheduler(path, doc.get("scheduler", dict, {}), sharing.get("pack", str, None))
    sharing.done()
    raw_nodes = doc.get("nodes", list, [])
    telemetry = _controller_telemetry(path, doc.get("telemetry", dict, {}), doc.get("metrics", dict, {}))
    raw_partitions = doc.get("partitions", list, None)
    access, user_limits, accounts, fairshare, class_limits = _tenancy(path, doc)
    doc.done()
    tables: tuple[PartitionConfig, ...] = ()
    table_default = None
    if raw_partitions is not None:
        if "partitions" in c.data:
            raise ConfigError(f"{path}: give partitions either as controller.partitions or as [[partitions]] "
                              f"tables, not both")
        tables, table_default = _partition_tables(path, raw_partitions)
        partitions = tuple(p.name for p in tables)
    else:
        partitions = c.strings("partitions", ("gpu",))
    if not partitions:
        raise ConfigError(f"{path}: controller.partitions must name at least one partition")
    nodes = _nodes(path, raw_nodes, partitions, tables)
    if table_default is not None and "default_partition" in c.data:
        raise ConfigError(f"{path}: the default partition is set twice (controller.default_partition and "
                          f"default = true in [[partitions]] {table_default!r})")
    legacy_admins = c.strings("admins", ())  # [controller] admins, from before [access]
    cfg = ControllerConfig(
        socket=c.get("socket", str, DEFAULT_CONTROLLER_SOCKET),
        database=c.get("database", str, "sqlite:////var/lib/hai/hai.db"),
        state_dir=c.get("state_dir", str, "/var/lib/hai"),
        tick_seconds=c.get("tick_seconds", float, 1.0),
        min_pass_interval=c.get("min_pass_interval", float, 0.05),
        node_down_after=c.get("node_down_after", float, 60.0),
        ping_interval=c.get("ping_interval", float, 5.0),
        lease_duration=c.get("lease_duration", float, 15.0),
        admins=legacy_admins or ("root",),
        partitions=partitions,
        default_partition=table_default or c.get("default_partition", str, partitions[0]),
        partition_limits=tables,
        max_array_size=c.get("max_array_size", int, 1001),
        max_script_bytes=c.get("max_script_bytes", int, 4 * 2**20),
        max_env_bytes=c.get("max_env_bytes", int, 2**20),
        max_grace=c.get("max_grace", int, 600),
        kill_invalid_depend=c.get("kill_invalid_depend", bool, False),
        log_level=c.get("log_level", str, "INFO"),
        events_max_age_days=c.get("events_max_age_days", float, 30.0),
        ssh=SshConfig(
            user=s.get("user", str, "root"),
            key=s.get("key", str, "/etc/hai/id_ed25519"),
            known_hosts=s.get("known_hosts", str, "/etc/hai/known_hosts"),
            connect_timeout=s.get("connect_timeout", float, 10.0),
        ),
        nodes=nodes,
        scheduler=scheduler,
        telemetry=telemetry,
        access=replace(access, admins=tuple(dict.fromkeys(legacy_admins + access.admins))),
        user_limits=user_limits,
        accounts=accounts,
        fairshare=fairshare,
        class_limits=class_limits,
    )
    c.done()
    s.done()
    _check_controller(path, cfg)
    return cfg


def _nodes(path: str, raw_nodes: list, partitions: tuple[str, ...],
           tables: tuple[PartitionConfig, ...]) -> tuple[NodeConfig, ...]:
    """The [[nodes]] tables: each in at least one known partition, names unique, and every node a
    [[partitions]] table names among them."""
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
            partitions=_node_partitions(name, n.strings("partitions", None), partitions, tables),
        )
        n.done()
        if node.transport not in ("ssh", "local"):
            raise ConfigError(f"{path}: nodes[{i}].transport must be ssh or local, got {node.transport!r}")
        if not node.partitions:
            raise ConfigError(f"{path}: nodes[{i}] ({name}) is in no partition: name it in a [[partitions]] "
                              f"table's nodes or give nodes[{i}].partitions")
        for p in node.partitions:
            if p not in partitions:
                raise ConfigError(f"{path}: nodes[{i}].partitions names unknown partition {p!r}")
        nodes.append(node)
    names = [n.name for n in nodes]
    if len(set(names)) != len(names):
        raise ConfigError(f"{path}: node names must be unique")
    for i, p in enumerate(tables):
        for node in p.nodes or ():
            if node not in names:
                raise ConfigError(f"{path}: partitions[{i}].nodes names unknown node {node!r}")
    return tuple(nodes)


def _check_controller(path: str, cfg: ControllerConfig) -> None:
    """The controller's values that must be positive or in range, and that fit together."""
    if cfg.default_partition not in cfg.partitions:
        raise ConfigError(f"{path}: controller.default_partition {cfg.default_partition!r} is not in partitions")
    _positive(path, "controller.tick_seconds", cfg.tick_seconds)
    if cfg.min_pass_interval < 0:
        raise ConfigError(f"{path}: controller.min_pass_interval must be >= 0, got {cfg.min_pass_interval:g}")
    _positive(path, "controller.max_array_size", cfg.max_array_size)
    _positive(path, "controller.max_script_bytes", cfg.max_script_bytes)
    _positive(path, "controller.max_env_bytes", cfg.max_env_bytes)
    if not 0 <= cfg.max_grace <= MAX_GRACE_SECONDS:
        raise ConfigError(f"{path}: controller.max_grace must be between 0 and {MAX_GRACE_SECONDS} seconds, "
                          f"got {cfg.max_grace}")
    if cfg.max_script_bytes + cfg.max_env_bytes + 64 * 1024 > cfg.access.max_request_bytes:  # + options, argv
        raise ConfigError(f"{path}: access.max_request_bytes ({cfg.access.max_request_bytes}) is too small for a "
                          f"submission at controller.max_script_bytes + max_env_bytes "
                          f"({cfg.max_script_bytes + cfg.max_env_bytes}) and 64 KiB more")
    _positive(path, "controller.node_down_after", cfg.node_down_after)
    _positive(path, "controller.lease_duration", cfg.lease_duration)
    _positive(path, "controller.ping_interval", cfg.ping_interval)
    _positive(path, "controller.events_max_age_days", cfg.events_max_age_days)


def _partition_tables(path: str, raw: list) -> tuple[tuple[PartitionConfig, ...], str | None]:
    """[[partitions]] tables: name, nodes, max_time, allowed_users, allowed_groups, default."""
    out, default = [], None
    for i, item in enumerate(raw):
        sec = _Section(path, f"partitions[{i}]", item)
        name = sec.get("name", str, None)
        if not name:
            raise ConfigError(f"{path}: partitions[{i}].name is required")
        max_time_text = sec.get("max_time", str, None)
        try:
            max_time = parse_time_limit(max_time_text) if max_time_text is not None else None
        except ValueError as exc:
            raise ConfigError(f"{path}: partitions[{i}].max_time: {exc}") from None
        nodes = sec.strings("nodes", None)
        part = PartitionConfig(name=name, max_time=max_time, allowed_users=sec.strings("allowed_users", None),
                               allowed_groups=sec.strings("allowed_groups", None), nodes=nodes)
        if sec.get("default", bool, False):
            if default is not None:
                raise ConfigError(f"{path}: partitions[{i}].default: {default!r} is already the default partition")
            default = name
        sec.done()
        if name in (p.name for p in out):
            raise ConfigError(f"{path}: partitions[{i}].name {name!r} is given twice")
        out.append(part)
    return tuple(out), default


def _node_partitions(node: str, explicit: tuple[str, ...] | None, partitions: tuple[str, ...],
                     tables: tuple[PartitionConfig, ...]) -> tuple[str, ...]:
    """A node's partitions: its own `partitions` list (default: every partition table without a
    `nodes` list, as Slurm's Nodes=ALL), plus every table whose `nodes` names it."""
    if not tables:
        return partitions if explicit is None else explicit
    own = set(p.name for p in tables if p.nodes is None) if explicit is None else set(explicit)
    named = {p.name for p in tables if p.nodes is not None and node in p.nodes}
    known = [p.name for p in tables if p.name in own | named]
    return tuple(known + sorted(own - set(known)))  # unknown names stay, to be reported
def _limits(sec: _Section, d: LimitsConfig = LimitsConfig()) -> LimitsConfig:
    lim = LimitsConfig(max_gpus=sec.get("max_gpus", int, d.max_gpus),
                       max_pending=sec.get("max_pending", int, d.max_pending),
                       max_jobs=sec.get("max_jobs", int, d.max_jobs),
                       max_pending_bytes=sec.get("max_pending_bytes", int, d.max_pending_bytes))
    for key in ("max_gpus", "max_pending", "max_jobs", "max_pending_bytes"):
        if getattr(lim, key) < 0:
            raise ConfigError(f"{sec.path}: {sec.where}.{key} must be >= 0 (0: no limit)")
    return lim


def _tenancy(path: str, doc: _Section):
    """[access], [limits], [[accounts]] and [fairshare]."""
    a = _Section(path, "access", doc.get("access", dict, {}))
    access = AccessConfig(admins=a.strings("admins", ("root",)), operators=a.strings("operators", ()),
                          max_connections_per_uid=a.get("max_connections_per_uid", int, 64),
                          client_frame_timeout=a.get("client_frame_timeout", float, 30.0),
                          client_idle_timeout=a.get("client_idle_timeout", float, 300.0),
                          max_request_bytes=a.get("max_request_bytes", int, 8 * 1024 * 1024),
                          max_requests_in_flight=a.get("max_requests_in_flight", int, 16),
                          max_requests_in_flight_per_uid=a.get("max_requests_in_flight_per_uid", int, 32),
                          max_request_bytes_per_uid=a.get("max_request_bytes_per_uid", int, 16 * 1024 * 1024),
                          submit_rate=a.get("submit_rate", float, 10.0), submit_burst=a.get("submit_burst", int, 10000))
    a.done()
    for key in ("max_connections_per_uid", "max_requests_in_flight", "max_requests_in_flight_per_uid"):
        if getattr(access, key) < 0:
            raise ConfigError(f"{path}: access.{key} must be >= 0 (0: no cap)")
    if not 1024 <= access.max_request_bytes < 1 << 32:
        raise ConfigError(f"{path}: access.max_request_bytes must be from 1024 to 4294967295 (bytes), "
                          f"got {access.max_request_bytes}")
    if 0 < access.max_request_bytes_per_uid < access.max_request_bytes:
        raise ConfigError(f"{path}: access.max_request_bytes_per_uid ({access.max_request_bytes_per_uid}) must be "
                          f"at least max_request_bytes ({access.max_request_bytes}), or 0 (no cap)")
    if access.submit_rate < 0 or access.submit_burst < 1:
        raise ConfigError(f"{path}: access.submit_rate must be >= 0 (0: no limit) and submit_burst >= 1")
    if access.max_request_bytes_per_uid < 0:
        raise ConfigError(f"{path}: access.max_request_bytes_per_uid must be >= 0 (0: no cap)")
    for key in ("client_frame_timeout", "client_idle_timeout"):
        if getattr(access, key) < 0:
            raise ConfigError(f"{path}: access.{key} must be >= 0 (0: off), got {getattr(access, key):g}")
    for key in ("admins", "operators"):
        for entry in getattr(access, key):
            if not entry.lstrip("@"):
                raise ConfigError(f"{path}: access.{key} has an empty entry")
    lim = _Section(path, "limits", doc.get("limits", dict, {}))
    class_limits = _class_limits(path, lim.get("classes", dict, {}))
    user_limits = _limits(lim, USER_LIMIT_DEFAULTS)
    lim.done()
    accounts = []
    for i, raw in enumerate(doc.get("accounts", list, [])):
        sec = _Section(path, f"accounts[{i}]", raw)
        name = sec.get("name", str, "")
        if not name or not name.replace("-", "").replace("_", "").replace(".", "").isalnum():
            raise ConfigError(f"{path}: accounts[{i}].name is required (letters, digits, - _ .), got {name!r}")
        acct = AccountConfig(name=name, users=sec.strings("users", ()), shares=sec.get("shares", int, 1),
                             limits=_limits(sec))
        sec.done()
        if acct.shares < 1:
            raise ConfigError(f"{path}: accounts[{i}].shares must be >= 1")
        accounts.append(acct)
    names = [x.name for x in accounts]
    if len(set(names)) != len(names):
        raise ConfigError(f"{path}: account names must be unique")
    f = _Section(path, "fairshare", doc.get("fairshare", dict, {}))
    fairshare = FairShareConfig(half_life=f.get("half_life", float, FairShareConfig.half_life),
                                enabled=f.get("enabled", bool, True))
    f.done()
    _positive(path, "fairshare.half_life", fairshare.half_life)
    return access, user_limits, tuple(accounts), fairshare, class_limits


def _class_limits(path: str, raw: dict) -> tuple[tuple[str, int], ...]:
    """[limits.classes]: `urgent = { max_gpus = 8 }`, per user."""
    out = []
    for name, table in raw.items():
        if name not in PRIORITY_CLASSES:
            raise ConfigError(f"{path}: limits.classes.{name}: no such priority class "
                              f"(classes: {', '.join(PRIORITY_CLASSES)})")
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: limits.classes.{name} must be a table such as {{ max_gpus = 8 }}, got {table!r}")
        sec = _Section(path, f"limits.classes.{name}", table)
        gpus = sec.get("max_gpus", int, 0)
        sec.done()
        if gpus < 0:
            raise ConfigError(f"{path}: limits.classes.{name}.max_gpus must be >= 0 (0: no limit)")
        out.append((name, gpus))
    return tuple(out)


def _numbers(sec: _Section, key: str, default: tuple[float, ...]) -> tuple[float, ...]:
    value = sec.get(key, list, None)
    if value is None:
        return default
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        raise ConfigError(f"{sec.path}: {sec.where}.{key} must be a list of numbers")
    return tuple(float(v) for v in value)


def parse_scheduler(path: str, raw: Any, gpu_pack: str | None = None) -> SchedulerConfig:
    sec = _Section(path, "scheduler", raw)
    d = MlfqConfig()
    policy = sec.get("policy", str, "mlfq")
    max_prio = sec.get("max_user_priority", str, "high")
    gpu_pack = gpu_pack or d.gpu_pack
    try:
        mlfq = MlfqConfig(
            thresholds=_numbers(sec, "thresholds", d.thresholds),
            quanta=_numbers(sec, "quanta", d.quanta),
            starvation_factor=sec.get("starvation_factor", float, d.starvation_factor),
            starvation_floor=sec.get("starvation_floor", float, d.starvation_floor),
            reservation_after=sec.get("reservation_after", float, d.reservation_after),
            placement=sec.get("placement", str, d.placement),
            prefer_idle_victims=sec.get("prefer_idle_victims", bool, d.prefer_idle_victims),
            gpu_pack=gpu_pack,
        )
    except ValueError as exc:
        raise ConfigError(f"{path}: [scheduler] {exc}") from None
    sec.done()
    if policy not in CONTROLLER_POLICIES:
        raise ConfigError(f"{path}: scheduler.policy must be {' or '.join(CONTROLLER_POLICIES)}, got {policy!r}")
    if max_prio not in PRIORITY_CLASSES:
        raise ConfigError(f"{path}: scheduler.max_user_priority must be one of {', '.join(PRIORITY_CLASSES)}")
    return SchedulerConfig(policy=policy, mlfq=mlfq, max_user_priority=max_prio)


def resolve(base: str | os.PathLike, value: str) -> str:
    """Relative paths in a config file are relative to the file's directory."""
    return str((Path(base).parent / value).resolve()) if not os.path.isabs(value) else value
