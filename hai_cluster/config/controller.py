"""hai-controller's config file (controller.toml): nodes, partitions, the scheduler, access,
accounts and limits."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from typing import Any

from ..core.grace import MAX_GRACE_SECONDS
from ..core.model import PRIORITY_CLASSES
from ..paths import DEFAULT_AGENT_SOCKET, DEFAULT_CONTROLLER_SOCKET
from ..scheduling.mlfq import MlfqConfig
from ..scheduling.registry import CONTROLLER_POLICIES
from .common import ConfigError, positive, read_toml, Section
from .idle import DEFAULTS as IDLE_DEFAULTS, NONE, IdleRule, IdleSettings, parse_idle, parse_rule, resolve
from .interactive import InteractiveConfig, parse_interactive
from .qos import NORMAL, QosConfig, parse_qos_tables


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
    idle: IdleRule = NONE  # idle_reclaim, idle_threshold, ... (config/idle.py): over [interactive]'s and [idle]'s

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
    # Started as root, the controller becomes this user when the store's directory is theirs
    # (controller/runas.py); a directory of anyone else's is refused, not trusted.
    run_as: str = "hai"
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
    # Slurm's ClusterName: -M/--clusters accepts it (and only it); jobs see SLURM_CLUSTER_NAME
    cluster_name: str = "cluster"
    # Slurm's MailProg: run as `PROG -s SUBJECT USER` for --mail-type notices (controller/mail.py)
    mail_program: str = "/usr/bin/mail"
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

    def qos_named(self, name: str) -> QosConfig | None:
        return next((q for q in self.qos if q.name == name), None)

    def idle_settings(self, *, interactive: bool, partition: str | None, qos: str | None) -> IdleSettings | None:
        """A job's idle reclamation (None: off for it): QOS over partition over [interactive] over [idle]."""
        q = self.qos_named(qos or self.default_qos)
        return resolve(self.idle, self.interactive.idle if interactive else None,
                       self.partition(partition or self.default_partition).idle, q.idle if q else NONE)
    # [[qos]] tables (config/qos.py; "normal" always exists) and the QOS of a job without --qos
    qos: tuple[QosConfig, ...] = (NORMAL,)
    default_qos: str = "normal"
    interactive: InteractiveConfig = InteractiveConfig()  # [interactive]: limits of salloc's and srun's jobs
    idle: IdleRule = IDLE_DEFAULTS  # [idle]: idle reclamation's defaults (config/idle.py)
    access: AccessConfig = field(default_factory=AccessConfig)
    user_limits: LimitsConfig = USER_LIMIT_DEFAULTS  # [limits]: for every user
    accounts: tuple[AccountConfig, ...] = ()
    fairshare: FairShareConfig = field(default_factory=FairShareConfig)
    # [limits.classes]: most GPUs one user's running jobs of a priority class may hold ((class, GPUs))
    class_limits: tuple[tuple[str, int], ...] = ()
    # Days the event history (hcontrol show events) is kept; older events are pruned.
    events_max_age_days: float = 30.0


def _controller_telemetry(path: str, raw: Any, metrics: Any) -> TelemetryConfig:
    sec = Section(path, "telemetry", raw)
    m = Section(path, "metrics", metrics)
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
    positive(path, "telemetry.history", cfg.history)
    positive(path, "telemetry.persist_interval", cfg.persist_interval)
    positive(path, "telemetry.idle_after", cfg.idle_after)
    if not 0 <= cfg.idle_util_below <= 100:
        raise ConfigError(f"{path}: telemetry.idle_util_below must be a percentage (0-100; 0 = off), "
                          f"got {cfg.idle_util_below:g}")
    if cfg.metrics_listen:
        host, sep, port = cfg.metrics_listen.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"{path}: metrics.listen must be \"host:port\" (e.g. \"127.0.0.1:9464\"), "
                              f"got {cfg.metrics_listen!r}")
    return cfg


def load_controller_config(path: str | os.PathLike) -> ControllerConfig:
    path = str(path)
    doc = Section(path, "top level", read_toml(path))
    c = Section(path, "controller", doc.get("controller", dict, {}))
    s = Section(path, "ssh", doc.get("ssh", dict, {}))
    sharing = Section(path, "gpu_sharing", doc.get("gpu_sharing", dict, {}))
    scheduler = parse_scheduler(path, doc.get("scheduler", dict, {}), sharing.get("pack", str, None))
    sharing.done()
    raw_nodes = doc.get("nodes", list, [])
    telemetry = _controller_telemetry(path, doc.get("telemetry", dict, {}), doc.get("metrics", dict, {}))
    raw_partitions = doc.get("partitions", list, None)
    qos = parse_qos_tables(path, doc.get("qos", list, []))
    interactive = parse_interactive(path, doc.get("interactive", dict, {}))
    idle = parse_idle(path, doc.get("idle", dict, {}))
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
        run_as=c.get("run_as", str, "hai"),
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
        cluster_name=c.get("cluster_name", str, "cluster"),
        mail_program=c.get("mail_program", str, "/usr/bin/mail"),
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
        qos=qos,
        default_qos=c.get("default_qos", str, "normal"),
        interactive=interactive,
        idle=idle,
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
        n = Section(path, f"nodes[{i}]", raw)
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
    if cfg.qos_named(cfg.default_qos) is None:
        raise ConfigError(f"{path}: controller.default_qos {cfg.default_qos!r} is not a [[qos]] table's name")
    positive(path, "controller.tick_seconds", cfg.tick_seconds)
    if cfg.min_pass_interval < 0:
        raise ConfigError(f"{path}: controller.min_pass_interval must be >= 0, got {cfg.min_pass_interval:g}")
    positive(path, "controller.max_array_size", cfg.max_array_size)
    positive(path, "controller.max_script_bytes", cfg.max_script_bytes)
    positive(path, "controller.max_env_bytes", cfg.max_env_bytes)
    if not re.fullmatch(r"[a-z0-9][a-z0-9_-]{0,39}", cfg.cluster_name):
        raise ConfigError(f"{path}: controller.cluster_name must be 1-40 lowercase letters, digits, '-' or '_' "
                          f"(Slurm's ClusterName), got {cfg.cluster_name!r}")
    if not os.path.isabs(cfg.mail_program):
        raise ConfigError(f"{path}: controller.mail_program must be an absolute path, got {cfg.mail_program!r}")
    if not 0 <= cfg.max_grace <= MAX_GRACE_SECONDS:
        raise ConfigError(f"{path}: controller.max_grace must be between 0 and {MAX_GRACE_SECONDS} seconds, "
                          f"got {cfg.max_grace}")
    if cfg.max_script_bytes + cfg.max_env_bytes + 64 * 1024 > cfg.access.max_request_bytes:  # + options, argv
        raise ConfigError(f"{path}: access.max_request_bytes ({cfg.access.max_request_bytes}) is too small for a "
                          f"submission at controller.max_script_bytes + max_env_bytes "
                          f"({cfg.max_script_bytes + cfg.max_env_bytes}) and 64 KiB more")
    positive(path, "controller.node_down_after", cfg.node_down_after)
    positive(path, "controller.lease_duration", cfg.lease_duration)
    positive(path, "controller.ping_interval", cfg.ping_interval)
    positive(path, "controller.events_max_age_days", cfg.events_max_age_days)


def _partition_tables(path: str, raw: list) -> tuple[tuple[PartitionConfig, ...], str | None]:
    """[[partitions]] tables: name, nodes, max_time, allowed_users, allowed_groups, default."""
    out, default = [], None
    for i, item in enumerate(raw):
        sec = Section(path, f"partitions[{i}]", item)
        name = sec.get("name", str, None)
        if not name:
            raise ConfigError(f"{path}: partitions[{i}].name is required")
        max_time = sec.time_limit("max_time")
        nodes = sec.strings("nodes", None)
        part = PartitionConfig(name=name, max_time=max_time, allowed_users=sec.strings("allowed_users", None),
                               allowed_groups=sec.strings("allowed_groups", None), nodes=nodes,
                               idle=parse_rule(sec, "idle_"))
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


def _limits(sec: Section, d: LimitsConfig = LimitsConfig()) -> LimitsConfig:
    lim = LimitsConfig(max_gpus=sec.get("max_gpus", int, d.max_gpus),
                       max_pending=sec.get("max_pending", int, d.max_pending),
                       max_jobs=sec.get("max_jobs", int, d.max_jobs),
                       max_pending_bytes=sec.get("max_pending_bytes", int, d.max_pending_bytes))
    for key in ("max_gpus", "max_pending", "max_jobs", "max_pending_bytes"):
        if getattr(lim, key) < 0:
            raise ConfigError(f"{sec.path}: {sec.where}.{key} must be >= 0 (0: no limit)")
    return lim


def _tenancy(path: str, doc: Section):
    """[access], [limits], [[accounts]] and [fairshare]."""
    a = Section(path, "access", doc.get("access", dict, {}))
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
    lim = Section(path, "limits", doc.get("limits", dict, {}))
    class_limits = _class_limits(path, lim.get("classes", dict, {}))
    user_limits = _limits(lim, USER_LIMIT_DEFAULTS)
    lim.done()
    accounts = []
    for i, raw in enumerate(doc.get("accounts", list, [])):
        sec = Section(path, f"accounts[{i}]", raw)
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
    f = Section(path, "fairshare", doc.get("fairshare", dict, {}))
    fairshare = FairShareConfig(half_life=f.get("half_life", float, FairShareConfig.half_life),
                                enabled=f.get("enabled", bool, True))
    f.done()
    positive(path, "fairshare.half_life", fairshare.half_life)
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
        sec = Section(path, f"limits.classes.{name}", table)
        gpus = sec.get("max_gpus", int, 0)
        sec.done()
        if gpus < 0:
            raise ConfigError(f"{path}: limits.classes.{name}.max_gpus must be >= 0 (0: no limit)")
        out.append((name, gpus))
    return tuple(out)


def _numbers(sec: Section, key: str, default: tuple[float, ...]) -> tuple[float, ...]:
    value = sec.get(key, list, None)
    if value is None:
        return default
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        raise ConfigError(f"{sec.path}: {sec.where}.{key} must be a list of numbers")
    return tuple(float(v) for v in value)


def parse_scheduler(path: str, raw: Any, gpu_pack: str | None = None) -> SchedulerConfig:
    sec = Section(path, "scheduler", raw)
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
            order=sec.get("order", str, d.order),
            restart_cost=sec.get("restart_cost", float, d.restart_cost),
            level_ratio=sec.get("level_ratio", float, d.level_ratio),
            preempt_margin=sec.get("preempt_margin", int, d.preempt_margin),
            min_run_restarts=sec.get("min_run_restarts", float, d.min_run_restarts),
            finish_likely=sec.get("finish_likely", float, d.finish_likely),
            finish_window=sec.get("finish_window", float, d.finish_window),
            max_slowdown=sec.get("max_slowdown", float, d.max_slowdown),
            slowdown_floor=sec.get("slowdown_floor", float, d.slowdown_floor),
            max_preemptions=sec.get("max_preemptions", int, d.max_preemptions),
            lift_factor=sec.get("lift_factor", float, d.lift_factor),
            lift_floor=sec.get("lift_floor", float, d.lift_floor),
        )
    except ValueError as exc:
        raise ConfigError(f"{path}: [scheduler] {exc}") from None
    sec.done()
    if policy not in CONTROLLER_POLICIES:
        raise ConfigError(f"{path}: scheduler.policy must be {' or '.join(CONTROLLER_POLICIES)}, got {policy!r}")
    if max_prio not in PRIORITY_CLASSES:
        raise ConfigError(f"{path}: scheduler.max_user_priority must be one of {', '.join(PRIORITY_CLASSES)}")
    return SchedulerConfig(policy=policy, mlfq=mlfq, max_user_priority=max_prio)
