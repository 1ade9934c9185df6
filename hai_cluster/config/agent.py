"""hai-agent's config file (agent.toml): the node's GPUs, sharing, isolation, telemetry."""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any

from ..core.constraint import feature_list
from ..core.runtimes import RUNTIMES
from ..paths import DEFAULT_AGENT_SOCKET
from .common import ConfigError, positive, read_toml, Section, resolve


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
    # A file of "JOBID UTIL" lines: that job's GPUs report UTIL % instead of telemetry.simulated_util.
    util_file: str = ""
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
    # run cgroups: "auto" (below the agent's own, delegated cgroup under systemd; else /hai),
    # "self" (below its own in any case), or a path from the root: <path>/<node>-<spool hash>/<job>.<attempt>
    cgroup_parent: str = "auto"
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
    dcgm_job_mapping_dir: str = ""  # dcgm-exporter's --hpc-job-mapping-dir (agent/dcgm.py); "" = off


ADOPT_MULTIPLE = ("newest", "deny")


@dataclass(frozen=True)
class AdoptConfig:
    """[adopt]: ssh logins into a job's node (agent/adopt.py, scripts/install-node --adopt)."""
    allow_users: tuple[str, ...] = ()  # let in without a job (operators); root always is
    multiple: str = "newest"  # a user with several jobs here: the newest one's, or "deny"
    env_dir: str = "/run/hai/adopt"  # <job>.<attempt>.sh per adopted run, read by the profile.d snippet


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
    features: tuple[str, ...] = ()  # what -C/--constraint matches (Slurm's Features= of a node line)
    log_level: str = "INFO"
    isolation: IsolationConfig = field(default_factory=IsolationConfig)
    telemetry: AgentTelemetryConfig = field(default_factory=AgentTelemetryConfig)
    sharing: SharingConfig = field(default_factory=SharingConfig)
    adopt: AdoptConfig = field(default_factory=AdoptConfig)
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


_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def load_agent_config(path: str | os.PathLike) -> AgentConfig:
    path = str(path)
    doc = Section(path, "top level", read_toml(path))
    a = Section(path, "agent", doc.get("agent", dict, {}))
    g = Section(path, "gpus", doc.get("gpus", dict, {}))
    isolation = _isolation(path, doc.get("isolation", dict, {}))
    telemetry = _agent_telemetry(path, doc.get("telemetry", dict, {}))
    sharing = _sharing(path, doc.get("sharing", dict, {}))
    adopt = _adopt(path, doc.get("adopt", dict, {}))
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
        features=_features(a),
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
            util_file=resolve(path, u) if (u := g.get("simulated_util_file", str, "")) else "",
            mig_layout=_mig_layout(g, "simulated_mig_layout"),
        ),
        isolation=isolation,
        telemetry=telemetry,
        sharing=sharing,
        adopt=adopt,
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
    positive(path, "agent.health_check_interval", cfg.health_check_interval)
    positive(path, "agent.health_check_timeout", cfg.health_check_timeout)
    if not 0 < cfg.spool_full_percent <= 100:
        raise ConfigError(f"{path}: agent.spool_full_percent must be in (0, 100], got {cfg.spool_full_percent}")
    if cfg.gpu_backend not in ("auto", "nvml", "simulated"):
        raise ConfigError(f"{path}: gpus.backend must be auto, nvml or simulated, got {cfg.gpu_backend!r}")
    if cfg.simulated.count < 0:
        raise ConfigError(f"{path}: gpus.simulated_count must be >= 0")
    positive(path, "agent.poll_interval", cfg.poll_interval)
    positive(path, "agent.launch_timeout", cfg.launch_timeout)
    if cfg.log_level not in _LOG_LEVELS:
        raise ConfigError(f"{path}: agent.log_level must be one of {', '.join(_LOG_LEVELS)}, got {cfg.log_level!r}")
    if cfg.shepherd_start not in ("fork", "exec"):
        raise ConfigError(f"{path}: agent.shepherd_start must be fork or exec, got {cfg.shepherd_start!r}")
    return cfg


def _agent_telemetry(path: str, raw: Any) -> AgentTelemetryConfig:
    sec = Section(path, "telemetry", raw)
    d = AgentTelemetryConfig()
    cfg = AgentTelemetryConfig(
        enabled=sec.get("enabled", bool, d.enabled),
        interval=sec.get("interval", float, d.interval),
        history=sec.get("history", int, d.history),
        simulated_util=sec.get("simulated_util", int, d.simulated_util),
        simulated_process_memory_mb=sec.get("simulated_process_memory_mb", int, d.simulated_process_memory_mb),
        dcgm_job_mapping_dir=resolve(path, x) if (x := sec.get("dcgm_job_mapping_dir", str, "")) else "",
    )
    sec.done()
    positive(path, "telemetry.interval", cfg.interval)
    positive(path, "telemetry.history", cfg.history)
    if not 0 <= cfg.simulated_util <= 100:
        raise ConfigError(f"{path}: telemetry.simulated_util must be a percentage (0-100), got {cfg.simulated_util}")
    if cfg.simulated_process_memory_mb < 0:
        raise ConfigError(f"{path}: telemetry.simulated_process_memory_mb must be >= 0")
    return cfg


def _adopt(path: str, raw: Any) -> AdoptConfig:
    from ..core.usernames import valid_user_name
    sec = Section(path, "adopt", raw)
    d = AdoptConfig()
    cfg = AdoptConfig(allow_users=sec.strings("allow_users", d.allow_users),
                      multiple=sec.get("multiple", str, d.multiple),
                      env_dir=resolve(path, sec.get("env_dir", str, d.env_dir)))
    sec.done()
    bad = [u for u in cfg.allow_users if not valid_user_name(u)]
    if bad:
        raise ConfigError(f"{path}: adopt.allow_users: not a user name: {', '.join(map(repr, bad))}")
    if cfg.multiple not in ADOPT_MULTIPLE:
        raise ConfigError(f"{path}: adopt.multiple must be one of {', '.join(ADOPT_MULTIPLE)}, got {cfg.multiple!r}")
    if not os.path.isabs(cfg.env_dir):
        raise ConfigError(f"{path}: adopt.env_dir must be an absolute path, got {cfg.env_dir!r}")
    return cfg


def _features(sec: Section) -> tuple[str, ...]:
    try:
        return feature_list(sec.strings("features", ()), f"{sec.path}: {sec.where}.features")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _indices(sec: Section, key: str) -> tuple[int, ...]:
    value = sec.get(key, list, [])
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
        raise ConfigError(f"{sec.path}: {sec.where}.{key} must be a list of GPU indices")
    return tuple(value)


def _xids(sec: Section, key: str) -> tuple[int, ...]:
    value = sec.get(key, list, None)
    if value is None:
        return DEFAULT_CRITICAL_XIDS
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value):
        raise ConfigError(f"{sec.path}: {sec.where}.{key} must be a list of XID numbers, got {value!r}")
    return tuple(value)


def _mig_layout(sec: Section, key: str) -> tuple[tuple[int, tuple[str, ...]], ...]:
    """{ 0 = ["3g.40gb", "2g.20gb"] }: MIG instances per card, at most MIG_SLICES compute slices."""
    from ..core.sharing import MIG_SLICES, mig_profile
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


def _triples(sec: Section, key: str) -> tuple[tuple[int, int, int], ...]:
    value = sec.get(key, list, [])
    ok = all(isinstance(v, list) and len(v) == 3 and all(isinstance(x, int) and not isinstance(x, bool)
                                                         and x >= 0 for x in v) for v in value)
    if not ok:
        raise ConfigError(f"{sec.path}: {sec.where}.{key} must be a list of [gpu, gpu, number] triples")
    return tuple(tuple(v) for v in value)


def _sharing(path: str, raw: Any) -> SharingConfig:
    sec = Section(path, "sharing", raw)
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
    sec = Section(path, "isolation", raw)
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
        raise ConfigError(f"{path}: isolation.cgroup_parent must be \"auto\", \"self\" or a relative path "
                          f"like \"hai\", got {cfg.cgroup_parent!r}")
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
