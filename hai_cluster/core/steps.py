"""Job steps (pure, no I/O): which tasks of an `srun` go where, and what each one is told.

An allocation holds nodes with a number of tasks (and their CPUs) and GPUs on each. A step asks
for some of them: by default all the allocation's tasks on all its nodes, as srun does inside an
sbatch job (it reads SLURM_NNODES/SLURM_NTASKS/SLURM_NTASKS_PER_NODE as its defaults). Tasks are
laid out as Slurm's default `block` distribution does: consecutive ranks fill a node before the
next, and a count that does not divide evenly gives the first nodes one more ("2,1"). Refusals
carry Slurm 22.05's messages, checked against the real one:

    srun -n 99 (4 tasks allocated)  ->  Unable to create step for job 7: More processors requested than permitted
    srun -N 3 (2 nodes allocated)   ->  Only allocated 2 nodes asked for 3
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from .hostlist import compress
from .jobenv import master_port, step_master_port


class StepError(ValueError):
    """A step the allocation cannot hold; the text is srun's error (after `srun: error: `), and
    `warnings` what srun warned of before it (as Slurm's srun prints them first)."""

    def __init__(self, message: str, warnings: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.warnings = tuple(warnings)


@dataclass(frozen=True)
class Allocation:
    job_id: int
    nodes: tuple[str, ...]  # in rank order: nodes[0] runs the batch script
    tasks_per_node: int
    cpus_per_task: int
    gpus: tuple[tuple[int, ...], ...]  # each node's GPU indices, as the job holds them

    @property
    def cpus_per_node(self) -> int:
        return self.tasks_per_node * self.cpus_per_task


@dataclass(frozen=True)
class StepRequest:
    """What srun asked for; None: not given (the allocation's default)."""
    nodes: int | None = None  # -N
    ntasks: int | None = None  # -n
    ntasks_per_node: int | None = None
    cpus_per_task: int | None = None  # -c
    gpus_per_task: int | None = None
    nodelist: tuple[str, ...] = ()  # -w: these nodes must be in the step
    exclude: tuple[str, ...] = ()  # -x
    overcommit: bool = False  # -O (or SLURM_OVERCOMMIT, which a -O job exports): more tasks than CPUs


@dataclass(frozen=True)
class StepIO:
    """How a step started from a client (salloc's srun, srun outside a job) meets its terminal:
    srun's -i/--input (Slurm's default: its stdin to every task; "none"; or one task's id), --pty
    (task 0 on a pseudo-terminal of rows x cols; what the client types goes to it alone) and -u
    (output as it comes, not in whole lines; a terminal's always is)."""
    input: str | int = "all"
    pty: bool = False
    rows: int = 24
    cols: int = 80
    unbuffered: bool = False

    def reads_input(self, procid: int) -> bool:
        if self.pty:
            return procid == 0
        return self.input == "all" or self.input == procid

    def to_wire(self) -> dict:
        return {"input": self.input, "pty": self.pty, "rows": self.rows, "cols": self.cols,
                "unbuffered": self.unbuffered}


@dataclass(frozen=True)
class Task:
    procid: int  # SLURM_PROCID, RANK
    node: int  # index into StepLayout.nodes (SLURM_NODEID counts the step's nodes)
    localid: int  # SLURM_LOCALID, LOCAL_RANK
    gpus: tuple[int, ...]  # what its CUDA_VISIBLE_DEVICES holds


@dataclass(frozen=True)
class StepLayout:
    job_id: int
    step_id: int
    nodes: tuple[str, ...]
    counts: tuple[int, ...]  # tasks on each of `nodes`
    tasks: tuple[Task, ...]  # by procid
    cpus_per_task: int

    @property
    def ntasks(self) -> int:
        return len(self.tasks)

    def on(self, node: str) -> tuple[Task, ...]:
        if node not in self.nodes:
            return ()
        i = self.nodes.index(node)
        return tuple(t for t in self.tasks if t.node == i)

    def to_wire(self) -> dict:
        return {"job_id": self.job_id, "step_id": self.step_id, "nodes": list(self.nodes),
                "counts": list(self.counts), "cpus_per_task": self.cpus_per_task,
                "tasks": [[t.procid, t.node, t.localid, list(t.gpus)] for t in self.tasks]}


def tasks_per_node_text(counts: Sequence[int]) -> str:
    """Slurm's compressed count list: [2, 2, 1] -> "2(x2),1"."""
    out: list[str] = []
    i = 0
    while i < len(counts):
        j = i
        while j < len(counts) and counts[j] == counts[i]:
            j += 1
        out.append(f"{counts[i]}(x{j - i})" if j - i > 1 else str(counts[i]))
        i = j
    return ",".join(out)


def plan_step(alloc: Allocation, req: StepRequest, step_id: int) -> tuple[StepLayout, list[str]]:
    """The step's layout and srun's warnings, or StepError (with the warnings before it)."""
    warnings: list[str] = []
    try:
        return _layout(alloc, req, step_id, warnings), warnings
    except StepError as exc:
        raise StepError(str(exc), warnings) from None


def _layout(alloc: Allocation, req: StepRequest, step_id: int, warnings: list[str]) -> StepLayout:
    job = alloc.job_id
    unknown = [n for n in (*req.nodelist, *req.exclude) if n not in alloc.nodes]
    if unknown:
        raise StepError(f"Unable to create step for job {job}: Requested node configuration is not available "
                        f"(node {unknown[0]} is not in the job's allocation {compress(alloc.nodes)})")
    usable = [n for n in alloc.nodes if n not in req.exclude]
    if any(n in req.exclude for n in req.nodelist):
        raise StepError(f"Unable to create step for job {job}: Requested node configuration is not available")
    cpt = req.cpus_per_task or alloc.cpus_per_task
    per_node = max(1, alloc.cpus_per_node // cpt)  # tasks a node of the allocation has CPUs for
    nnodes = req.nodes
    if nnodes is not None and nnodes > len(alloc.nodes):
        raise StepError(f"Only allocated {len(alloc.nodes)} nodes asked for {nnodes}")
    ntasks = req.ntasks
    per_node_given = req.ntasks_per_node
    if ntasks is None:
        if req.ntasks_per_node is not None:
            ntasks = req.ntasks_per_node * (nnodes or len(usable))
        else:
            ntasks = (nnodes or len(usable)) * alloc.tasks_per_node
    if ntasks < 1:
        raise StepError(f"Invalid number of tasks ({ntasks})")
    if nnodes is None:
        nnodes = max(min(len(usable), ntasks), len(req.nodelist))
    elif ntasks < nnodes:
        warnings.append(f"can't run {ntasks} processes on {nnodes} nodes, setting nnodes to {ntasks}")
        nnodes = ntasks
    nnodes = max(nnodes, len(req.nodelist))
    if nnodes > len(usable) or ntasks < nnodes:
        raise StepError(f"Unable to create step for job {job}: Requested node configuration is not available")
    chosen = list(req.nodelist) + [n for n in usable if n not in req.nodelist]
    chosen = [n for n in alloc.nodes if n in chosen[:nnodes]]  # in the allocation's (rank) order
    # srun's own rule (opt.c): only a count that does not divide, and tasks beyond one node's
    if per_node_given is not None and per_node_given != ntasks // nnodes and ntasks > per_node_given:
        warnings.append(f"can't honor --ntasks-per-node set to {per_node_given} which doesn't match the "
                        f"requested tasks {ntasks} with the number of requested nodes {nnodes}. Ignoring "
                        f"--ntasks-per-node.")
    base, extra = divmod(ntasks, nnodes)
    counts = [base + (1 if i < extra else 0) for i in range(nnodes)]
    if max(counts) > per_node and not req.overcommit:
        raise StepError(f"Unable to create step for job {job}: More processors requested than permitted")
    tasks: list[Task] = []
    procid = 0
    for i, (name, count) in enumerate(zip(chosen, counts)):
        held = alloc.gpus[alloc.nodes.index(name)]
        g = req.gpus_per_task
        if g is not None and g * count > len(held):
            raise StepError(f"Unable to create step for job {job}: Requested node configuration is not available "
                            f"({count} task(s) x {g} GPU(s) on {name}, which holds {len(held)} for the job)")
        for local in range(count):
            gpus = held if g is None else held[local * g:(local + 1) * g]
            tasks.append(Task(procid, i, local, tuple(gpus)))
            procid += 1
    return StepLayout(job, step_id, tuple(chosen), tuple(counts), tuple(tasks), cpt)


def layout_from_wire(d: object) -> StepLayout:
    """A layout as the controller sends it; ValueError for anything malformed."""
    if not isinstance(d, dict) or set(d) != {"job_id", "step_id", "nodes", "counts", "cpus_per_task", "tasks"}:
        raise ValueError("a step layout must be a map with job_id, step_id, nodes, counts, cpus_per_task, tasks")
    ints = [d["job_id"], d["step_id"], d["cpus_per_task"]]
    nodes, counts, tasks = d["nodes"], d["counts"], d["tasks"]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in ints):
        raise ValueError("a step layout's ids and cpus_per_task must be non-negative integers")
    if not (isinstance(nodes, list) and nodes and all(isinstance(n, str) and n for n in nodes)):
        raise ValueError("a step layout's nodes must be a non-empty list of names")
    if not (isinstance(counts, list) and len(counts) == len(nodes)
            and all(isinstance(c, int) and not isinstance(c, bool) and c > 0 for c in counts)):
        raise ValueError("a step layout's counts must be a positive count per node")
    if not isinstance(tasks, list) or len(tasks) != sum(counts):
        raise ValueError("a step layout's tasks must list every task")
    out = []
    for i, t in enumerate(tasks):
        if not (isinstance(t, list) and len(t) == 4 and t[0] == i and isinstance(t[1], int)
                and 0 <= t[1] < len(nodes) and isinstance(t[2], int) and 0 <= t[2] < counts[t[1]]
                and isinstance(t[3], list) and all(isinstance(g, int) and not isinstance(g, bool) and g >= 0
                                                   for g in t[3])):
            raise ValueError(f"a step layout's task {i} is malformed")
        out.append(Task(t[0], t[1], t[2], tuple(t[3])))
    return StepLayout(d["job_id"], d["step_id"], tuple(nodes), tuple(counts), tuple(out), d["cpus_per_task"])


# The variables of the node a task runs on: a remote node's task takes them from that node's own
# job environment, not from srun's (which describes the node srun runs on).
NODE_VARIABLES = ("SLURMD_NODENAME", "HAI_NODE_RANK", "NODE_RANK", "HAI_GPUS_ON_NODE", "SLURM_GPUS_ON_NODE",
                  "SLURM_JOB_GPUS", "HAI_CONTROL_DIR", "HAI_STEP_SOCKET", "SLURM_CPUS_ON_NODE",
                  "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")


def task_environment(base: Mapping[str, str], node_env: Mapping[str, str], layout: StepLayout, task: Task,
                     master_addr: str) -> dict[str, str]:
    """A task's environment: srun's (`base`), the node's own variables (`node_env`, that node's
    job environment), then the step's and the task's as Slurm and torch.distributed name them."""
    env = dict(base)
    for k in NODE_VARIABLES:
        env.pop(k, None)
        if k in node_env:
            env[k] = node_env[k]
    step = str(layout.step_id)
    count = layout.counts[task.node]
    env.update({
        "SLURM_STEP_ID": step, "SLURM_STEPID": step,
        "SLURM_STEP_NUM_TASKS": str(layout.ntasks), "SLURM_STEP_NUM_NODES": str(len(layout.nodes)),
        "SLURM_STEP_NODELIST": compress(layout.nodes),
        "SLURM_STEP_TASKS_PER_NODE": tasks_per_node_text(layout.counts),
        "SLURM_PROCID": str(task.procid), "SLURM_LOCALID": str(task.localid), "SLURM_NODEID": str(task.node),
        "SLURM_NTASKS": str(layout.ntasks), "SLURM_NPROCS": str(layout.ntasks),
        "SLURM_NNODES": str(len(layout.nodes)), "SLURM_NODELIST": compress(layout.nodes),
        "SLURM_TASKS_PER_NODE": tasks_per_node_text(layout.counts),
        "SLURM_CPUS_PER_TASK": str(layout.cpus_per_task),
        "RANK": str(task.procid), "LOCAL_RANK": str(task.localid), "WORLD_SIZE": str(layout.ntasks),
        "LOCAL_WORLD_SIZE": str(count), "GROUP_RANK": str(task.node), "NODE_RANK": str(task.node),
    })
    # The step's first node, unless the script exported a master of its own (Slurm sets none: a
    # script's `export MASTER_ADDR=$(scontrol show hostnames | head -n 1)` must reach its tasks)
    if env.get("MASTER_ADDR") in (None, env.get("HAI_MASTER_ADDR")):
        env["MASTER_ADDR"] = master_addr
    if env.get("MASTER_PORT") == str(master_port(layout.job_id)):  # ours, not one the script exported
        env["MASTER_PORT"] = str(step_master_port(layout.job_id, layout.step_id))
    if task.gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, task.gpus))
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    else:
        env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def task_nodes(nodes: Sequence[str], counts: Sequence[int]) -> list[str]:
    """Each task's node, by rank: the block order plan_step numbers them in."""
    return [name for name, count in zip(nodes, counts) for _ in range(count)]


def step_name(argv: Sequence[str]) -> str:
    """A step's name, as Slurm gives it: its command's file name (`12.0 python`)."""
    return argv[0].rstrip("/").rsplit("/", 1)[-1] or argv[0]


def step_end_state(exit_code: int | None, signal: int | None, cancelled: bool) -> str:
    """A step's state once it ended, as sacct shows it: srun interrupted (scancel, Ctrl-C) is
    CANCELLED; otherwise a task's non-zero code or fatal signal makes it FAILED."""
    if cancelled:
        return "CANCELLED"
    return "FAILED" if exit_code or signal else "COMPLETED"
