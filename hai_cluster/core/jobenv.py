"""The environment a job's script starts with on one node (pure, no I/O).

The user's exported environment comes first; the job's own variables are laid over it. Any
variable this module manages but does not set for this run (say CUDA_VISIBLE_DEVICES for a
job without GPUs) is removed from the user's environment, because a value exported from the
submit host (or from a job that submitted this one) describes some other allocation.
"""
from __future__ import annotations

import signal as _signal
from typing import Mapping, Sequence

from .hostlist import compress

PORT_BASE = 10000
PORT_SPAN = 20000  # ports 10000-29999: below Linux's default ephemeral range (32768+)

_MANAGED = frozenset({
    "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "HAI_PARTITION", "HAI_TIME_LIMIT",
    "SLURM_JOB_PARTITION", "SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS", "SLURM_CLUSTER_NAME", "SLURM_OPEN_MODE",
    "SLURM_JOB_QOS", "SLURM_OVERCOMMIT",
    "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_NTASKS_PER_NODE", "SLURM_GPUS_PER_TASK",
    *(f"{prefix}_ARRAY_{what}" for prefix in ("HAI", "SLURM")
      for what in ("JOB_ID", "TASK_ID", "TASK_COUNT", "TASK_MIN", "TASK_MAX", "TASK_STEP")),
})


def master_port(job_id: int) -> int:
    """The rendezvous port for torch.distributed: the same on every node of a job without any
    coordination, and different for jobs whose ids are less than 20000 apart."""
    return PORT_BASE + job_id % PORT_SPAN


STEP_STRIDE = 7919  # a prime: a job's steps land far from its neighbours' ports


def step_master_port(job_id: int, step_id: int) -> int:
    """A step's rendezvous port: step 0 has the job's; steps side by side (`srun ... &` twice,
    both with torch.distributed on the same first node) each have their own."""
    return PORT_BASE + (job_id + step_id * STEP_STRIDE) % PORT_SPAN


def per_node(value: int, nnodes: int) -> str:
    """Slurm's count for every node of a job alike: "4(x2)" on two nodes, "4" on one."""
    return f"{value}(x{nnodes})" if nnodes > 1 else str(value)


def job_environment(base_env: Mapping[str, str], *, job_id: int, job_name: str, user: str,
                    partition: str | None, nodelist: Sequence[str], rank: int, node: str,
                    gpus: Sequence[int], cpus_per_task: int, restart_count: int,
                    checkpoint_dir: str, submit_dir: str, master_addr: str,
                    time_limit: int | None, preempt_signal: int | None = None,
                    array_job_id: int | None = None, array_task_id: int | None = None,
                    array_indices: Sequence[int] = (), tasks_per_node: int = 1,
                    ntasks: int | None = None, ntasks_per_node: int | None = None,
                    gpus_per_task: int | None = None, cluster_name: str | None = None,
                    open_mode: str | None = None, qos: str | None = None,
                    overcommit: bool = False) -> dict[str, str]:
    """Environment for the script instance of rank `rank`, running on `node` with `gpus`.

    WORLD_SIZE is nnodes * max(1, GPUs on the node): the number of processes `torchrun
    --nproc-per-node=gpu` starts in all, one per GPU (one per node for CPU-only jobs).
    HAI_TIME_LIMIT is the limit in seconds, absent when there is none. CUDA_VISIBLE_DEVICES
    is left unset for a job without GPUs, as Slurm does. HAI_NODELIST is sorted, as Slurm's
    SLURM_JOB_NODELIST is, so it need not list nodes in rank order; MASTER_ADDR is rank 0's.
    HAI_PREEMPT_SIGNAL is the number of the signal that asks the job to checkpoint (its --signal,
    SIGTERM when None); hai_cluster.job installs its handler for that one. ($HAI_CONTROL_DIR, where
    the notices go, is added by the agent: only it knows its spool.)
    A task of a job array also gets HAI_ARRAY_JOB_ID, HAI_ARRAY_TASK_ID and the COUNT, MIN and MAX
    of `array_indices` (and Slurm's SLURM_ARRAY_* names; SLURM_ARRAY_TASK_STEP when the indices
    are evenly spaced).
    Tasks, as sbatch sets them: SLURM_TASKS_PER_NODE and SLURM_JOB_CPUS_PER_NODE always,
    SLURM_NTASKS/SLURM_NPROCS when -n or --ntasks-per-node was given (`ntasks`,
    `ntasks_per_node`: as given), SLURM_NTASKS_PER_NODE and SLURM_GPUS_PER_TASK when given.
    """
    nnodes = len(nodelist)
    # --overcommit: each node gives one task's CPUs (sbatch -O -n 64 -N 1: SLURM_CPUS_ON_NODE=1)
    node_cpus = cpus_per_task if overcommit else tasks_per_node * cpus_per_task
    if not 0 <= rank < nnodes:
        raise ValueError(f"rank {rank} is outside a job of {nnodes} nodes")
    hosts = compress(nodelist)
    gpu_list = ",".join(str(g) for g in gpus)
    env = {k: v for k, v in base_env.items() if k not in _MANAGED}
    env.update({
        "HAI_JOB_ID": str(job_id),
        "HAI_JOB_NAME": job_name,
        "HAI_NODELIST": hosts,
        "HAI_NNODES": str(nnodes),
        "HAI_NODE_RANK": str(rank),
        "HAI_GPUS_ON_NODE": str(len(gpus)),
        "HAI_RESTART_COUNT": str(restart_count),
        "HAI_CHECKPOINT_DIR": checkpoint_dir,
        "HAI_SUBMIT_DIR": submit_dir,
        "HAI_PREEMPT_SIGNAL": str(int(_signal.SIGTERM) if preempt_signal is None else preempt_signal),
        # torchrun / torch.distributed
        "MASTER_ADDR": master_addr,
        "HAI_MASTER_ADDR": master_addr,  # ours: tells a MASTER_ADDR the script exported from this one
        "MASTER_PORT": str(master_port(job_id)),
        "WORLD_SIZE": str(nnodes * max(1, len(gpus))),
        "NNODES": str(nnodes),
        "NODE_RANK": str(rank),
        # Slurm's names, so existing sbatch scripts run unchanged
        "SLURM_JOB_ID": str(job_id),
        "SLURM_JOBID": str(job_id),
        "SLURM_JOB_NAME": job_name,
        "SLURM_JOB_NODELIST": hosts,
        "SLURM_NODELIST": hosts,
        "SLURM_NNODES": str(nnodes),
        "SLURM_JOB_NUM_NODES": str(nnodes),
        "SLURM_NODEID": str(rank),
        "SLURM_PROCID": str(rank),  # the script runs once per node: one task per node
        "SLURM_LOCALID": "0",
        "SLURM_RESTART_COUNT": str(restart_count),
        "SLURM_SUBMIT_DIR": submit_dir,
        "SLURM_CPUS_PER_TASK": str(cpus_per_task),
        "SLURM_CPUS_ON_NODE": str(node_cpus),
        "SLURM_JOB_CPUS_PER_NODE": per_node(node_cpus, nnodes),
        "SLURM_TASKS_PER_NODE": per_node(tasks_per_node, nnodes),
        "SLURM_JOB_USER": user,
        "SLURMD_NODENAME": node,
    })
    if array_job_id is not None and array_task_id is not None:
        values = {"JOB_ID": array_job_id, "TASK_ID": array_task_id}
        if array_indices:
            values.update(TASK_COUNT=len(array_indices), TASK_MIN=min(array_indices), TASK_MAX=max(array_indices))
            steps = {b - a for a, b in zip(array_indices, array_indices[1:])}
            values["TASK_STEP"] = steps.pop() if len(steps) == 1 else 1
        for prefix in ("HAI", "SLURM"):
            env.update({f"{prefix}_ARRAY_{k}": str(v) for k, v in values.items()})
    if ntasks is not None or ntasks_per_node is not None:
        env["SLURM_NTASKS"] = env["SLURM_NPROCS"] = str(tasks_per_node * nnodes)
    if ntasks_per_node is not None:
        env["SLURM_NTASKS_PER_NODE"] = str(ntasks_per_node)
    if gpus_per_task is not None:
        env["SLURM_GPUS_PER_TASK"] = str(gpus_per_task)
    if overcommit:  # as sbatch exports it; the job's sruns read it as their -O
        env["SLURM_OVERCOMMIT"] = "1"
    if open_mode is not None:  # --open-mode, as slurmctld passes it on to the job's sruns
        env["SLURM_OPEN_MODE"] = "a" if open_mode == "append" else "t"
    if cluster_name is not None:  # Slurm's ClusterName (the controller's cluster_name)
        env["SLURM_CLUSTER_NAME"] = cluster_name
    if qos is not None:
        env["SLURM_JOB_QOS"] = qos
    if partition is not None:
        env["HAI_PARTITION"] = partition
        env["SLURM_JOB_PARTITION"] = partition
    if time_limit is not None:
        env["HAI_TIME_LIMIT"] = str(time_limit)
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = gpu_list
        # nvidia-smi numbers GPUs in PCI bus order; CUDA's default (fastest first) may not.
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["SLURM_GPUS_ON_NODE"] = str(len(gpus))
        env["SLURM_JOB_GPUS"] = gpu_list
    return env


# What salloc sets for its command on the submit host (Slurm 22.05's salloc, checked): the
# allocation's variables, none of a node's (SLURMD_NODENAME, SLURM_NODEID, CUDA_VISIBLE_DEVICES ...)
ALLOCATION_VARIABLES = (
    "SLURM_JOB_ID", "SLURM_JOBID", "SLURM_JOB_NAME", "SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURM_NNODES",
    "SLURM_JOB_NUM_NODES", "SLURM_JOB_CPUS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NTASKS", "SLURM_NPROCS",
    "SLURM_NTASKS_PER_NODE", "SLURM_GPUS_PER_TASK", "SLURM_JOB_PARTITION", "SLURM_SUBMIT_DIR", "SLURM_CLUSTER_NAME",
    "SLURM_JOB_QOS", "SLURM_OVERCOMMIT", "HAI_JOB_ID", "HAI_JOB_NAME", "HAI_NODELIST", "HAI_NNODES", "HAI_PARTITION", "HAI_TIME_LIMIT",
)


def allocation_variables(job_env: Mapping[str, str]) -> dict[str, str]:
    """salloc's variables, from the environment of the job's first node (job_environment)."""
    out = {k: job_env[k] for k in ALLOCATION_VARIABLES if k in job_env}
    if "SLURM_CPUS_PER_TASK" in job_env and job_env.get("SLURM_CPUS_PER_TASK") != "1":
        out["SLURM_CPUS_PER_TASK"] = job_env["SLURM_CPUS_PER_TASK"]  # salloc sets it for -c only
    return out
