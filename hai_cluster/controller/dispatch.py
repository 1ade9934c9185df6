"""Turn a started run into the per-rank RunSpec (protocol/runspec.py) each agent receives.

The environment is complete here except HAI_CONTROL_DIR, which the agent adds: only it knows
where its spool (and so the run's control directory for preemption notices) lives."""
from __future__ import annotations

import os
import posixpath
from typing import Mapping, Sequence

from ..core.jobenv import job_environment
from ..core.jobids import parse_array
from ..core.model import JobSpec
from ..core.patterns import resolve_output_path
from ..protocol.runspec import RunSpec
from ..store.records import JobRecord


def checkpoint_dir(spec: JobSpec, job_id: int) -> str:
    """Kept across every run of the job; by default beside the job's output, on shared storage."""
    if spec.checkpoint_dir:
        return spec.checkpoint_dir
    return posixpath.join(spec.workdir, ".hai", "checkpoints", str(job_id))


def warn_to(spec: JobSpec) -> str:
    """Who gets --signal's warning (RunSpec.warn_to); "job", left off the wire, without one."""
    if spec.signal is None:
        return "job"
    return "batch" if spec.signal_batch else "steps" if spec.script_once else "job"


def output_names(job: JobRecord, node: str) -> dict:
    """What a run's --output/--error pattern is expanded with on `node` (%j %x %u %N %r %A %a)."""
    return dict(job_id=job.id, job_name=job.name, user=job.user, node=node, restart_count=job.restart_count,
                array_job_id=job.array_job_id, array_task_id=job.array_task_id)


def rank_spec(job: JobRecord, attempt: int, rank: int, nodelist: Sequence[str], gpus: Sequence[int],
              addresses: Mapping[str, str], mig: str | None = None, cluster_name: str | None = None) -> RunSpec:
    """What rank `rank` of the job's run `attempt` is sent; `mig`: the MIG instance it holds."""
    spec = job.spec
    node = nodelist[rank]
    array = dict(array_job_id=job.array_job_id, array_task_id=job.array_task_id)
    names = output_names(job, node)
    stdout = resolve_output_path(spec.stdout, spec.workdir, **names)
    stderr = resolve_output_path(spec.stderr, spec.workdir, **names) if spec.stderr else None
    # not the script: the step server (JobSpec.script_once); an allocation of salloc or srun has no
    # script, and its first node serves the client's steps too
    step_server = spec.script_once and (rank > 0 or spec.interactive)
    if step_server:  # the output file is the batch script's alone (its tasks' come through srun)
        stdout, stderr = os.devnull, None
    ckpt = checkpoint_dir(spec, job.id)
    env = job_environment(
        spec.environment, job_id=job.id, job_name=job.name, user=job.user,
        partition=job.partition, nodelist=nodelist, rank=rank, node=node, gpus=gpus,
        cpus_per_task=spec.cpus_per_task, restart_count=job.restart_count, checkpoint_dir=ckpt,
        submit_dir=spec.submit_dir or spec.workdir, master_addr=addresses.get(nodelist[0], nodelist[0]),
        time_limit=spec.time_limit, preempt_signal=spec.signal, **array,
        array_indices=parse_array(spec.array, None).indices if spec.array else (),
        tasks_per_node=spec.tasks_per_node, ntasks=spec.ntasks, ntasks_per_node=spec.ntasks_per_node,
        gpus_per_task=spec.gpus_per_task, cluster_name=cluster_name, open_mode=spec.open_mode,
        qos=job.qos or "normal", overcommit=spec.overcommit)
    return RunSpec(
        job_id=job.id, attempt=attempt, rank=rank, user=job.user, uid=job.uid,
        gid=job.gid, script=spec.script, script_args=tuple(spec.script_args),
        workdir=spec.workdir, stdout=stdout, stderr=stderr, environment=env,
        time_limit=spec.time_limit, signal=spec.signal, signal_time=spec.signal_time,
        warn_to=warn_to(spec),
        grace=spec.grace, checkpoint_dir=ckpt,
        # isolation: the agent picks the runtime's default when None, limits the rank to these
        # resources and shows a container only its own GPUs' device nodes
        runtime=spec.runtime, container_image=spec.container_image, mem_mb=spec.mem_mb,
        # --exclusive: the node is the job's, every CPU of it (no CPU limit)
        cpus=None if spec.exclusive else spec.cpus_per_node, gpus=tuple(gpus), gpu_share=_share(spec, mig),
        umask=0o022 if spec.umask is None else spec.umask, step_server=step_server,
        truncate_output=None if spec.open_mode is None else spec.open_mode == "truncate",
    )


def _share(spec: JobSpec, mig: str | None) -> dict | None:
    """A sharing rank's share of its card (the agent turns it into MPS limits), and the MIG
    instance it holds on a MIG card."""
    if spec.gpu_fraction is None and spec.gpu_mem_mb is None:
        return None
    share = {"fraction": spec.gpu_fraction, "mem_mb": spec.gpu_mem_mb, "compute": spec.gpu_compute,
             "qos": spec.gpu_qos or "guaranteed"}
    if mig:
        share["mig"] = mig
    return share
