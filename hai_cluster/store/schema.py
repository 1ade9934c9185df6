"""The job table and its neighbours, as SQLAlchemy Core tables.

Every schema change is an Alembic migration in migrations/versions; a test checks that the
migrations build exactly these tables.
"""
from __future__ import annotations

from sqlalchemy import (JSON, BigInteger, Boolean, Column, Float, ForeignKey, Index, Integer, MetaData, String,
                        Table, Text, UniqueConstraint, false, text)

metadata = MetaData()

jobs = Table(
    "jobs", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("name", String(200), nullable=False),
    Column("user", String(64), nullable=False),
    Column("uid", Integer, nullable=False),
    Column("gid", Integer, nullable=False),
    Column("partition", String(64), nullable=False),
    Column("state", String(16), nullable=False),
    Column("reason", String(200), nullable=False, default="None"),
    Column("priority", String(16), nullable=False, default="normal"),
    Column("submit_time", Float, nullable=False),
    Column("start_time", Float),
    Column("end_time", Float),
    Column("nodes", Integer, nullable=False),
    Column("gpus_per_node", Integer, nullable=False),
    Column("cpus_per_task", Integer, nullable=False),
    Column("mem_mb", Integer),
    Column("time_limit", Integer),
    Column("hold", Boolean, nullable=False, default=False),
    Column("spec", JSON, nullable=False),
    Column("restart_count", Integer, nullable=False, default=0),
    Column("attempts", Integer, nullable=False, default=0),  # runs started so far
    Column("exit_code", Integer),
    Column("exit_signal", Integer),
    Column("nodelist", String(1000), nullable=False, default=""),
    Column("end_request", String(16)),  # cancel: the user asked the running job to end
    Column("attained_gpu_seconds", Float, nullable=False, default=0.0),
    Column("version", Integer, nullable=False, default=1),
    # 0002: time-slicing
    Column("pending_since", Float),  # when it last entered the queue (submit, requeue, preemption)
    Column("last_run_end", Float),
    Column("preemptible", Boolean, nullable=False, default=True),
    Column("end_reason", String(300)),  # why the controller asked the run to end (shown on the run)
    Column("hold_admin", Boolean, nullable=False, default=False),  # held by an admin: users cannot release
    Column("runtime", String(16)),  # 0004: the runtime the job needs ("container": any container runtime)
    Column("begin_time", Float),  # 0005: --begin
    # 0007: a task of a job array (the array's id is its first task's job id), and --dependency
    Column("array_job_id", Integer),
    Column("array_task_id", Integer),
    Column("array_task_limit", Integer),  # --array=...%N, on every task
    Column("dependency", String(1000)),  # canonical text; the snapshot evaluates it
    # 0017: with the task id, so that a task named by (array, task) is one seek (hcancel 12_4), and
    # with the id, so that a listing walks an array's tasks in id order (store/listing.py)
    Index("ix_jobs_array_task", "array_job_id", "array_task_id"),
    Index("ix_jobs_array_id", "array_job_id", "id"),
    Column("account", String(64)),  # 0008: -A/--account (None: before accounts existed, "default")
    # 0009: fractional GPUs (core.sharing): a share of one card per rank
    Column("gpu_fraction", Float),
    Column("gpu_mem_mb", Integer),
    Column("gpu_compute", Integer),
    Column("gpu_qos", String(16)),
    Index("ix_jobs_state", "state"),
    # 0013: bytes of the spec this row stores (an array's once, on its first task): what a user's
    # pending jobs hold in the store is bounded by it ([limits] max_pending_bytes); the index
    # answers a user's counts at every submission without reading the rows
    Column("spec_bytes", Integer),
    # 0016: tasks on each node (-n, --ntasks-per-node): a rank takes tasks x cpus_per_task CPUs
    Column("tasks_per_node", Integer, nullable=False, default=1, server_default="1"),
    # 0015: with the id, for listings by user (store/listing.py); the counts at submission still
    # read the index alone (0013)
    Index("ix_jobs_user_state", "user", "state", "id", "spec_bytes"),
    # 0015: listings filtered by name, partition or end (hacct -S) over every job, without a scan
    Index("ix_jobs_name", "name", "state", "id"),
    Index("ix_jobs_partition", "partition", "state", "id"),
    Index("ix_jobs_end_time", "end_time"),
    Column("resumes", String(16)),  # 0019: how it resumes after a preemption (JobSpec.resumes); None: not
    # 0020: --exclusive, -w and -x (comma lists of node names; None: not given)
    Column("exclusive", Boolean, nullable=False, default=False, server_default=false()),
    Column("required_nodes", String(1000)),
    Column("excluded_nodes", String(1000)),
    Column("constraint", String(1024)),  # 0021: -C, as Slurm shows it (core.constraint); None: not given
    Column("qos", String(64)),  # 0022: its [[qos]] table's name; None: jobs from before QOS ("normal")
    Column("nice", Integer, nullable=False, default=0, server_default="0"),  # 0023: --nice
    Column("reservation", String(64)),  # 0024: --reservation (core.reservation)
    # 0028: an allocation of salloc or srun (JobSpec.interactive): the interactive class
    Column("interactive", Boolean, nullable=False, default=False, server_default=false()),
    # 0031: -O/--overcommit: a rank takes one task's CPUs (JobSpec.overcommit)
    Column("overcommit", Boolean, nullable=False, default=False, server_default=false()),
)

# 0013: an array's spec, stored once for all its tasks. A task's own `spec` holds only what was
# changed for it alone (hcontrol update); the task's spec is this one with those on top.
array_specs = Table(
    "array_specs", metadata,
    Column("array_job_id", Integer, ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
    Column("spec", JSON, nullable=False),
)

# One row per attempt of a job (sacct shows a requeued job the same way).
runs = Table(
    "runs", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_id", Integer, ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("state", String(16), nullable=False),
    Column("start_time", Float, nullable=False),
    Column("end_time", Float),
    Column("exit_code", Integer),
    Column("exit_signal", Integer),
    Column("nodelist", String(1000), nullable=False),
    Column("gpus", Integer, nullable=False),
    Column("reason", String(200)),
    # 0006: telemetry rollups over the run (controller/telemetry.py), for hacct
    Column("gpu_util_mean", Float),  # percent, over every sample of every GPU of the run
    Column("gpu_util_max", Float),
    Column("gpu_mem_max_mb", Integer),  # peak GPU memory of the run's processes on one node
    Column("energy_j", Float),  # joules drawn by the run's GPUs
    Column("cpu_mean", Float),  # percent of one CPU, per rank, averaged
    Column("telemetry_samples", Integer),
    Column("gpu_charge", Float),  # 0012: a sharing run's GPU-equivalents (core.sharing.share_charge)
    # 0026: what the run's cgroups were charged (its ranks' RunStatus): CPU seconds of all ranks,
    # and the highest and the mean of the ranks' memory peaks (sacct MaxRSS, AveRSS)
    Column("cpu_seconds", Float),
    Column("max_rss_kb", BigInteger),
    Column("ave_rss_kb", BigInteger),
    # 0030: the run's idle clock (scheduling/idle.py), in telemetry sample times, so that a restarted
    # controller goes on with it: its idle stretch's first sample, and when it was warned
    Column("idle_since", Float),
    Column("idle_warned", Float),
    UniqueConstraint("job_id", "attempt", name="uq_runs_job_attempt"),
)

# One row per rank (node) of a run; a rank that has not ended holds its GPUs.
run_ranks = Table(
    "run_ranks", metadata,
    Column("run_id", Integer, ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
    Column("rank", Integer, primary_key=True),
    Column("node", String(64), nullable=False),
    Column("gpus", JSON, nullable=False),
    Column("cpus", Integer, nullable=False),
    Column("mem_mb", Integer, nullable=False, default=0),
    Column("state", String(16), nullable=False),  # starting | running | ended
    Column("exit_code", Integer),
    Column("exit_signal", Integer),
    Column("reason", String(32)),
    Column("killed", Boolean, nullable=False, default=False),
    Column("message", Text),
    Column("end_time", Float),
    Column("gpu_mem_mb", Integer),  # 0009: a sharing rank's share of its card (MiB, reserved compute %)
    Column("gpu_compute", Integer),
    Column("mig_uuid", String(100)),  # 0012: the MIG instance a sharing rank holds
    Column("cpu_seconds", Float),  # 0026: the rank's cgroup, at its end
    Column("mem_peak_kb", BigInteger),
    Index("ix_run_ranks_node_state", "node", "state"),
    # 0014: the live ranks only, what every pass and every cancel looks for (the history is kept)
    Index("ix_run_ranks_live", "run_id", "node", sqlite_where=text("state != 'ended'"),
          postgresql_where=text("state != 'ended'")),
)

# 0018: one row per job step (an srun inside the job), of one run; the batch step is the run itself.
run_steps = Table(
    "run_steps", metadata,
    Column("run_id", Integer, ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
    Column("step_id", Integer, primary_key=True),
    Column("name", String(200), nullable=False),  # the command srun ran, as Slurm names a step
    Column("nodelist", String(1000), nullable=False),  # comma list, as runs.nodelist
    Column("counts", String(1000), nullable=False),  # tasks on each of them ("2,2"): its routing, rebuilt
    Column("ntasks", Integer, nullable=False),
    Column("cpus", Integer, nullable=False),  # its tasks' CPUs together (sacct's AllocCPUS)
    Column("origin", String(64), nullable=False),  # the node where srun runs: only its agent ends the step
    Column("start_time", Float, nullable=False),
    Column("end_time", Float),
    Column("state", String(16), nullable=False),  # RUNNING | COMPLETED | FAILED | CANCELLED
    Column("exit_code", Integer),
    Column("exit_signal", Integer),
    # the open steps only, which a run's end closes
    Index("ix_run_steps_open", "run_id", sqlite_where=text("end_time IS NULL"),
          postgresql_where=text("end_time IS NULL")),
)

nodes = Table(
    "nodes", metadata,
    Column("name", String(64), primary_key=True),
    Column("address", String(255), nullable=False),
    Column("state", String(16), nullable=False, default="up"),  # up | drain | down
    Column("reason", String(200)),
    Column("responding", Boolean, nullable=False, default=False),
    Column("cpus", Integer, nullable=False, default=0),
    Column("mem_mb", Integer, nullable=False, default=0),
    Column("gpu_backend", String(16)),
    Column("partitions", JSON, nullable=False),
    Column("last_seen", Float),
    Column("unreachable_since", Float),  # 0003: when the link went down; None while responding
    Column("runtimes", JSON),  # 0004: what the agent can run jobs in
    Column("container_runtime", String(16)),  # 0004: its default for --container-image
    # 0011: a node an admin added with `hcontrol node add` (not from [[nodes]]), and how to reach it.
    Column("added", Boolean, nullable=False, default=False),
    Column("port", Integer),
    Column("ssh_user", String(64)),
    Column("agent_socket", String(255)),
    Column("features", JSON),  # 0021: what the agent declares (agent.features), for -C
)

gpus = Table(
    "gpus", metadata,
    Column("node", String(64), ForeignKey("nodes.name", ondelete="CASCADE"), primary_key=True),
    Column("index", Integer, primary_key=True),
    Column("uuid", String(128), nullable=False),
    Column("name", String(200), nullable=False),
    Column("memory_mb", Integer, nullable=False),
    # 0009: sharing and topology, as the agent reports them
    Column("shareable", Boolean, nullable=False, server_default=false()),
    Column("isolation", String(8), nullable=False, server_default="none"),  # mps | mig | none
    Column("links", JSON),  # [[peer, NVLinks, common-ancestor level], ...]
    Column("mig", JSON),  # 0012: the MIG layout, [[instance UUID, profile, MiB, compute %], ...]
)

# 0008: limits and shares set live by admins (hcontrol update Account=/User=); they override the
# config's. kind: account | user; a None value leaves the config's.
limits = Table(
    "limits", metadata,
    Column("kind", String(8), primary_key=True),
    Column("name", String(64), primary_key=True),
    Column("shares", Integer),
    Column("max_gpus", Integer),
    Column("max_pending", Integer),
    Column("max_jobs", Integer),
    Column("updated_by", String(64)),
    Column("updated_at", Float),
)

# 0024: advance reservations (scontrol create reservation): nodes held for users or accounts in a
# window (core.reservation). Rows ended are deleted when the next one is created.
reservations = Table(
    "reservations", metadata,
    Column("name", String(64), primary_key=True),
    Column("nodes", JSON, nullable=False),
    Column("start_time", Float, nullable=False),
    Column("end_time", Float, nullable=False),
    Column("users", JSON, nullable=False),
    Column("accounts", JSON, nullable=False),
    Column("flags", JSON),  # 0031: Flags= (core.reservation.FLAGS); None: none (rows from before)
    Column("created_by", String(64)),
    Column("created_at", Float),
)

# 0010: the active controller's lease. One row; `epoch` goes up at every takeover and fences
# every write of an older leader (see store/lease.py). Times are the database server's clock.
controller_lease = Table(
    "controller_lease", metadata,
    Column("name", String(32), primary_key=True),
    Column("holder", String(300), nullable=False),  # host:socket of the active controller
    Column("epoch", Integer, nullable=False),
    Column("expires_at", Float, nullable=False),
    Column("acquired_at", Float, nullable=False),
)

# 0011: what happened to a job or a node and why (hcontrol show events); pruned by age.
events = Table(
    "events", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("time", Float, nullable=False),
    Column("kind", String(32), nullable=False),
    Column("job_id", Integer),  # no foreign key: the history may outlive the job row
    Column("node", String(1000)),  # one node, or the nodes of a gang start, comma-separated
    Column("detail", JSON, nullable=False),
    Index("ix_events_job", "job_id"),
    Index("ix_events_time", "time"),
)

# 0015: the nodes an event names, one row each: a node's history is read through ix_event_nodes_node
event_nodes = Table(
    "event_nodes", metadata,
    Column("event_id", Integer, ForeignKey("events.id", ondelete="CASCADE"), primary_key=True),
    Column("node", String(64), primary_key=True),
    Index("ix_event_nodes_node", "node", "event_id"),
)

# 0025: a submission's idempotency key (store/submit_keys.py): a retried submission finds its job
submit_keys = Table(
    "submit_keys", metadata,
    Column("uid", Integer, primary_key=True),
    Column("key", String(64), primary_key=True),
    Column("job_id", Integer, nullable=False),  # no foreign key: pruned by age, like events
    Column("created", Float, nullable=False),
    Index("ix_submit_keys_created", "created"),
)

# 0027: what the scheduler learned (core.sizemodel's wire form), and up to which ended job:
# the jobs that ended after `through` are folded in at the controller's start (store/sizes.py)
scheduler_state = Table(
    "scheduler_state", metadata,
    Column("name", String(32), primary_key=True),
    Column("state", JSON, nullable=False),
    Column("through_end", Float, nullable=False),
    Column("through_id", BigInteger, nullable=False),
    Column("updated", Float, nullable=False),
)
