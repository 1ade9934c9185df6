"""Does a request fit on a node? One function, used by the policy and by the applier's re-check."""
from __future__ import annotations

from dataclasses import dataclass

from .model import JobView, NodeView
from .sharing import share_misfit


@dataclass(frozen=True)
class Fit:
    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


_FITS = Fit(True)  # the common answer, built once (frozen, so it can be shared)


def fits(job: JobView, node: NodeView, *, ignore_usage: bool = False) -> Fit:
    """Whether one rank of `job` fits on `node` now (or on an empty node with ignore_usage)."""
    if job.partition and node.partitions and not any(p in node.partitions for p in job.partitions):
        return Fit(False, f"{node.name} is not in partition {job.partition}")
    if len(node.gpus) < job.gpus_per_node:
        return Fit(False, f"{node.name} has {len(node.gpus)} GPUs, job needs {job.gpus_per_node}")
    if node.cpus < job.cpus_per_task:
        return Fit(False, f"{node.name} has {node.cpus} CPUs, job needs {job.cpus_per_task}")
    if job.mem_mb and node.mem_mb < job.mem_mb:
        return Fit(False, f"{node.name} has {node.mem_mb} MiB memory, job needs {job.mem_mb}")
    if job.runtime == "container":
        if node.container_runtime not in node.runtimes:
            return Fit(False, f"{node.name} has no container runtime")
    elif job.runtime and job.runtime not in node.runtimes:
        return Fit(False, f"{node.name} has no {job.runtime} runtime")
    if job.gpu_share is not None and (why := share_misfit(job.gpu_share, node, ignore_usage=True)):
        return Fit(False, why)
    if ignore_usage:
        return _FITS
    if not node.schedulable:
        why = "not responding" if not node.responding else node.state
        return Fit(False, f"{node.name} is {why}")
    if len(node.free_gpus) < job.gpus_per_node:
        return Fit(False, f"{node.name} has {len(node.free_gpus)} free GPUs")
    if node.cpus - node.used_cpus < job.cpus_per_task:
        return Fit(False, f"{node.name} has {node.cpus - node.used_cpus} free CPUs")
    if job.mem_mb and node.mem_mb - node.used_mem_mb < job.mem_mb:
        return Fit(False, f"{node.name} has {node.mem_mb - node.used_mem_mb} MiB free memory")
    if job.gpu_share is not None and (why := share_misfit(job.gpu_share, node)):
        return Fit(False, why)
    return _FITS


def could_ever_fit(job: JobView, nodes: tuple[NodeView, ...]) -> Fit:
    """Whether the cluster, empty, could run the job at all (else the submission is refused)."""
    candidates = [n for n in nodes if fits(job, n, ignore_usage=True)]
    if len(candidates) >= job.nodes:
        return Fit(True)
    if not nodes:
        return Fit(False, "the cluster has no nodes")
    best = max(len(n.gpus) for n in nodes)
    if job.gpu_share is not None:
        return Fit(False, f"{job.nodes} node(s) with a shared GPU that can take {job.gpu_share.label()} are "
                          f"needed; {len(candidates)} node(s) qualify")
    return Fit(False, f"{job.nodes} node(s) with {job.gpus_per_node} GPUs, {job.cpus_per_task} CPUs"
                      f"{f', {job.mem_mb} MiB' if job.mem_mb else ''}"
                      f"{f', the {job.runtime} runtime' if job.runtime else ''} each are needed; "
                      f"{len(candidates)} node(s) qualify (largest node has {best} GPUs)")
