"""Frozen data shared by the scheduler, the controller, the simulator and the CLI.

Nothing here does I/O. `JobSpec` is what a submission asks for (built by core.jobscript and
validated there); `Snapshot` is everything `decide()` may look at.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from functools import cached_property
from typing import TYPE_CHECKING, Any, Mapping

from .grace import DEFAULT_GRACE_SECONDS
from .reasons import BEGIN_TIME, HELD_ADMIN, HELD_USER
from .sizemodel import SizeModel
from .states import JobState

if TYPE_CHECKING:
    from .constraint import Constraint
    from .quota import Quotas
    from .reservation import Reservation
    from .sharing import GpuShare

PRIORITY_CLASSES = ("urgent", "high", "normal", "low")  # --priority, highest first
PRIORITY_RANK = {name: rank for rank, name in enumerate(PRIORITY_CLASSES)}  # 0 = first in line


@dataclass(frozen=True)
class JobSpec:
    """A validated job request. Times in seconds, memory in MiB."""
    script: str  # full text of the batch script (for --wrap a generated one)
    workdir: str  # absolute path; the job starts there (-D, default: submit dir)
    name: str = "script"
    script_args: tuple[str, ...] = ()
    nodes: int = 1
    gpus_per_node: int = 0  # with --gpus-per-task: that times the tasks on a node
    cpus_per_task: int = 1
    mem_mb: int | None = None  # per node
    # Tasks as given (None: not given), for Slurm's variables; tasks_per_node is what they ask.
    ntasks: int | None = None  # -n/--ntasks: the job's tasks in all
    ntasks_per_node: int | None = None  # --ntasks-per-node
    gpus_per_task: int | None = None  # --gpus-per-task
    time_limit: int | None = None  # seconds; None = partition's / unlimited
    partition: str | None = None
    stdout: str | None = None  # pattern; None -> slurm-%j.out (slurm-%A_%a.out) in workdir
    stderr: str | None = None  # pattern; None -> same file as stdout
    environment: Mapping[str, str] = field(default_factory=dict)
    signal: int | None = None  # --signal: number sent signal_time s before the limit and on preemption
    signal_time: int = 60
    signal_batch: bool = False  # --signal=B:...: the warning to the batch shell only (else to the steps)
    grace: int = DEFAULT_GRACE_SECONDS  # seconds between the signal and SIGKILL
    priority: str = "normal"
    requeue: bool = True
    hold: bool = False
    # --every-node: the script runs on every node of the job (one task per node, the launch of
    # releases before job steps) instead of once, on the first node, with srun launching the rest.
    every_node: bool = False
    checkpoint_dir: str | None = None
    submit_dir: str | None = None  # where hsubmit ran (SLURM_SUBMIT_DIR); workdir when unknown
    container_image: str | None = None  # rootfs dir or tarball (absolute), or a reference for podman
    runtime: str | None = None  # none | bwrap | runc | podman | apptainer | enroot; None: the node's default
    begin_time: float | None = None  # --begin: not eligible before this (epoch seconds)
    array: str | None = None  # --array, canonical (core.jobids): one job per task
    dependency: str | None = None  # --dependency, canonical (core.dependency)
    umask: int | None = None  # the submitter's umask: output files are created with it (None: 022)
    account: str | None = None  # -A/--account; None: the user's default account
    # Fractional GPUs (core.sharing): a share of one card per rank instead of whole cards.
    gpu_fraction: float | None = None  # --gpus-per-node below 1
    gpu_mem_mb: int | None = None  # --gpu-mem
    gpu_compute: int | None = None  # --gpu-compute, percent
    gpu_qos: str | None = None  # --gpu-qos: guaranteed | burstable | best-effort
    # sbatch's, kept with the job (scontrol show job): free text, a workload key, a lowest limit
    comment: str | None = None
    wckey: str | None = None
    time_min: int | None = None  # --time-min, seconds
    # How the job resumes after a preemption, as it said: "requeue" (--requeue given), "checkpoint"
    # (--checkpoint-dir), "signal" (--signal: it is warned and may requeue itself), "announced" (its
    # processes said so at run time, hai_cluster.job); None: it did not say, so time-slicing never
    # preempts it (its work would be lost).
    resumes: str | None = None
    # --open-mode: "append" (never wipe the output files) or "truncate" (wipe them at every run);
    # None: sbatch's default, a job's first run truncates and a requeued run appends
    open_mode: str | None = None
    # --exclusive: the job's nodes are its alone, every GPU and CPU of each (memory as asked);
    # -w/--nodelist: nodes the job must have; -x/--exclude: nodes it must not have
    exclusive: bool = False
    required_nodes: tuple[str, ...] = ()
    excluded_nodes: tuple[str, ...] = ()
    constraint: str | None = None  # -C/--constraint over the nodes' features (core.constraint), as Slurm shows it
    qos: str | None = None  # --qos: a [[qos]] table's name; the controller sets the default's
    nice: int = 0  # --nice: later in its queue by that much (negative: sooner, administrators only)
    reservation: str | None = None  # --reservation=NAME (core.reservation)
    # --mail-type (BEGIN END FAIL REQUEUE ALL ARRAY_TASKS) and --mail-user (default: the job's user)
    mail_type: tuple[str, ...] = ()
    mail_user: str | None = None
    # An allocation for an interactive client (salloc, srun outside a job): no batch script runs,
    # every node (the first too) runs the step server, the client's srun starts the steps; the
    # interactive class (never preempted, ahead of batch jobs of its level, [interactive] limits).
    interactive: bool = False
    # ... that no client holds (salloc --no-shell): the controller does not end it as abandoned
    detached: bool = False
    # -O/--overcommit: more tasks than CPUs; a node's share is one task's CPUs (Slurm's meaning)
    overcommit: bool = False

    @property
    def tasks_per_node(self) -> int:
        """Tasks on each node: every node of a job holds the same number (core.jobscript)."""
        return self.ntasks_per_node or (self.ntasks // self.nodes if self.ntasks else 1)

    @property
    def script_once(self) -> bool:
        """Slurm's model: the script runs once, on the first node, and the other nodes run the
        step server for srun (agent: job/stepd.py). --every-node keeps the script on every node."""
        return not self.every_node

    @property
    def cpus_per_node(self) -> int:
        """CPUs each node gives the job: --overcommit asks one task's (the tasks share them)."""
        return self.cpus_per_task if self.overcommit else self.tasks_per_node * self.cpus_per_task

    @property
    def reason_at_submission(self) -> str | None:
        """A job held as a whole (--hold, no array) waits for that from its submission on, so its
        reason is stored with it; an array's tasks get theirs from a pass."""
        return held_reason(False) if self.hold and self.array is None else None

    def to_wire(self) -> dict[str, Any]:
        d = asdict(self)
        d["script_args"] = list(self.script_args)
        d["environment"] = dict(self.environment)
        d["required_nodes"], d["excluded_nodes"] = list(self.required_nodes), list(self.excluded_nodes)
        d["mail_type"] = list(self.mail_type)
        return d

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> "JobSpec":
        names = {f.name for f in fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown job spec fields: {sorted(unknown)}")
        kw = dict(d)
        for key in ("script_args", "required_nodes", "excluded_nodes", "mail_type"):
            if key in kw:
                kw[key] = tuple(kw[key])
        if "environment" in kw:
            kw["environment"] = dict(kw["environment"])
        return cls(**kw)


@dataclass(frozen=True)
class GpuInfo:
    index: int
    uuid: str
    name: str
    memory_mb: int
    shareable: bool = False  # the node offers it to sharing jobs (core.sharing)
    isolation: str = "none"  # how shares are enforced on it: mps | mig | none
    links: tuple[tuple[int, int, int], ...] = ()  # (peer index, NVLinks, common-ancestor level)
    # The admin's MIG layout of a card in MIG mode: (instance UUID, profile, MiB, compute %) each.
    mig: tuple[tuple[str, str, int, int], ...] = ()


@dataclass(frozen=True)
class NodeView:
    """A node as the scheduler sees it. `used_gpus` are indices held by active runs."""
    name: str
    gpus: tuple[GpuInfo, ...]
    cpus: int
    mem_mb: int
    partitions: tuple[str, ...] = ()
    state: str = "up"  # up | drain | down (administrative / health)
    responding: bool = True
    used_gpus: frozenset[int] = frozenset()
    used_cpus: int = 0
    used_mem_mb: int = 0
    runtimes: tuple[str, ...] = ("none",)  # what the agent can run jobs in (none, bwrap, runc, ...)
    container_runtime: str | None = None  # its runtime for --container-image without --runtime
    # Cards holding shares of sharing jobs: (index, MiB, reserved compute %, jobs); they are in used_gpus too.
    shared: tuple[tuple[int, int, int, int], ...] = ()
    mig_used: frozenset[str] = frozenset()  # MIG instances (UUIDs) held by sharing runs
    features: frozenset[str] = frozenset()  # what -C/--constraint matches (agent.toml's agent.features)
    # Set by core.reservation.apply for the policy: the reservation it is in now, or the seconds
    # until one starts on it (then only jobs whose time limit ends before may start here);
    # overlapping windows (Flags=MAINT or OVERLAP): their names, comma-joined
    reservation: str | None = None
    free_for: float | None = None

    @property
    def schedulable(self) -> bool:
        return self.state == "up" and self.responding

    @cached_property  # views are frozen, and a policy asks this very often
    def free_gpus(self) -> tuple[int, ...]:
        return tuple(g.index for g in self.gpus if g.index not in self.used_gpus)

    @cached_property  # (kept by the policy's working copies, whose cards never change)
    def linked(self) -> bool:
        """Whether any card lists its links to the others (core.topology chooses cards by them)."""
        return any(g.links for g in self.gpus)


def attained_service(ended_runs: float, gpu_rate: float, run_start: float | None, now: float) -> float:
    """GPU-seconds a job has received: its ended runs' plus the current run's so far (the rule of
    Tiresias' 2D-LAS; one function for the policy's view and the API's listings)."""
    if run_start is None:
        return ended_runs
    return ended_runs + gpu_rate * max(0.0, now - run_start)


def held_reason(by_admin: bool) -> str:
    """A held job's pending reason (Slurm's names)."""
    return HELD_ADMIN if by_admin else HELD_USER


@dataclass(frozen=True)
class JobView:
    """A job as the scheduler sees it (pending or holding resources)."""
    id: int
    user: str
    state: JobState
    submit_time: float
    nodes: int
    gpus_per_node: int
    cpus_per_task: int = 1
    mem_mb: int | None = None
    partition: str | None = None
    priority: str = "normal"
    tasks_per_node: int = 1
    overcommit: bool = False  # -O: a rank takes one task's CPUs (JobSpec.cpus_per_node)
    hold: bool = False
    held_by_admin: bool = False
    restart_count: int = 0
    attained_gpu_seconds: float = 0.0  # GPUs x seconds over the runs that ended (not the current one)
    run_start: float | None = None  # start of the current run, if any
    nodelist: tuple[str, ...] = ()
    # What a job holding resources holds: per rank, its node and GPU indices.
    allocation: tuple[tuple[str, tuple[int, ...]], ...] = ()
    preemptible: bool = True  # False for --no-requeue jobs (and admin-pinned ones)
    # It can resume after a preemption (JobSpec.resumes): time-slicing takes only such runs; an
    # urgent job may take the others too (their work is lost, and their record says so).
    resumable: bool = True
    exclusive: bool = False  # --exclusive: it takes idle nodes whole (every GPU and CPU of each)
    required_nodes: tuple[str, ...] = ()  # -w: its nodes include these
    excluded_nodes: tuple[str, ...] = ()  # -x: none of these
    constraint: Constraint | None = None  # -C: the features its nodes must have
    qos: str = "normal"  # whose per-user limits apply (core.quota)
    nice: int = 0  # --nice: among jobs of its level and class, the higher goes later
    reservation: str | None = None  # --reservation: only that reservation's nodes, in its window
    pending_since: float | None = None  # when it last entered the queue (submit or requeue)
    last_run_end: float | None = None  # end of its previous run, for round-robin at low levels
    time_limit: int | None = None  # seconds; the simulator puts the true duration here for oracles
    runtime: str | None = None  # a runtime the job asked for; "container": any node's container default
    begin_time: float | None = None  # not eligible before this (--begin)
    idle: bool = False  # its GPUs stayed under the idle threshold (controller telemetry)
    array_job_id: int | None = None  # the array this job is a task of
    array_task_limit: int | None = None  # --array=...%N: tasks of the array running at once
    dependency: str | None = None  # the store's verdict on --dependency: a pending reason, None = satisfied
    account: str = "default"  # whose limits and fair share apply (-A)
    gpu_share: GpuShare | None = None  # a sharing job: one card share per rank (gpus_per_node is 0)
    gpu_charge: float = 0.0  # a sharing job's current run: GPU-equivalents charged (sharing.share_charge)
    mig: tuple[str, ...] = ()  # a sharing job on MIG cards: per rank of allocation, its instance ("" none)
    interactive: bool = False  # salloc's or srun's allocation: ahead of batch jobs of its level (MLFQ) or class (FIFO)
    version: int = 0  # the store's row version: the applier starts a job only as the policy saw it
    name: str = ""  # its job name (--job-name): a key of the learned size model (core.sizemodel)

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def script_once(self) -> bool:
        """Slurm's model: the script runs once, on the first node, and the other nodes run the
        step server for srun (agent: job/stepd.py). --every-node keeps the script on every node."""
        return not self.every_node

    @property
    def cpus_per_node(self) -> int:
        """What one rank (one node's share of the job) takes of the node's CPUs."""
        return self.cpus_per_task if self.overcommit else self.tasks_per_node * self.cpus_per_task

    def rank_cpus(self, node_cpus: int) -> int:
        """CPUs one rank takes on a node with node_cpus: all of them for an --exclusive job."""
        return node_cpus if self.exclusive else self.cpus_per_node

    @property
    def constrained(self) -> bool:
        """It cannot take any node that has room: --exclusive, -w, -x, -C or --reservation."""
        return (self.exclusive or bool(self.required_nodes or self.excluded_nodes) or self.constraint is not None
                or self.reservation is not None)

    @property
    def partitions(self) -> tuple[str, ...]:
        """The candidate partitions (-p a,b: whichever can start the job first); () for any."""
        return tuple(self.partition.split(",")) if self.partition else ()

    @property
    def gpu_rate(self) -> float:
        """GPUs charged per second of a run: the whole GPUs, or a sharing run's share of its cards."""
        return self.gpus if self.gpu_share is None else self.gpu_charge

    def attained(self, now: float) -> float:
        """GPU-seconds received so far, the current run included (Tiresias' 2D-LAS service)."""
        return attained_service(self.attained_gpu_seconds, self.gpu_rate,
                                self.run_start if self.state.holds_resources else None, now)

    @property
    def hold_reason(self) -> str:
        return held_reason(self.held_by_admin)

    def ineligible(self, now: float) -> str | None:
        """Why the job may not start at all now, whatever the resources (a pending reason)."""
        if self.hold:
            return self.hold_reason
        if self.dependency is not None:
            return self.dependency
        if self.begin_time is not None and self.begin_time > now:
            return BEGIN_TIME
        return None

    def waited(self, now: float) -> float:
        return max(0.0, now - (self.pending_since if self.pending_since is not None else self.submit_time))


@dataclass(frozen=True)
class Snapshot:
    now: float
    jobs: tuple[JobView, ...]
    nodes: tuple[NodeView, ...]
    quotas: Quotas | None = None  # running-GPU limits per user and account (None: none)
    # Fair-share factor per (account, user), in (0, 1]; absent: 1 (core/fairshare.py)
    fairshare: Mapping[tuple[str, str], float] = field(default_factory=dict)
    reservations: tuple[Reservation, ...] = ()  # not ended (core.reservation.apply reads them)
    # What the cluster learned of job sizes from the jobs that ended before `now` (the MLFQ's
    # Gittins order); empty: attained-service order until jobs end.
    sizes: SizeModel = field(default_factory=SizeModel)


@dataclass(frozen=True)
class Placement:
    """Where each rank of a gang goes: rank i runs on nodes[i] with gpus[i]."""
    nodes: tuple[str, ...]
    gpus: tuple[tuple[int, ...], ...]
    shares: tuple[tuple[int, int], ...] = ()  # sharing jobs: per rank (GPU MiB, reserved compute %)
    mig: tuple[str, ...] = ()  # sharing jobs on MIG cards: per rank the instance's UUID ("" for none)
