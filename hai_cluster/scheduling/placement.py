"""Gang placement: all ranks of a job get nodes at once, or none do.

Consolidation: each rank takes one whole node's share; nodes are chosen best-fit (the fewest
free GPUs that still fit, so large holes stay open for large jobs), ties by name.
GPU choice within a node: the lowest free indices.
"""
from __future__ import annotations

from dataclasses import replace

from ..core.model import JobView, NodeView, Placement
from ..core.resources import fits


def place(job: JobView, nodes: dict[str, NodeView]) -> Placement | None:
    candidates = [n for n in nodes.values() if fits(job, n)]
    if len(candidates) < job.nodes:
        return None
    candidates.sort(key=lambda n: (len(n.free_gpus), n.cpus - n.used_cpus, n.name))
    chosen = sorted(candidates[:job.nodes], key=lambda n: n.name)
    return Placement(
        nodes=tuple(n.name for n in chosen),
        gpus=tuple(n.free_gpus[:job.gpus_per_node] for n in chosen),
    )


def reserve(job: JobView, placement: Placement, nodes: dict[str, NodeView]) -> None:
    """Mark the placement's resources used in `nodes` (the policy's working copy)."""
    for name, gpus in zip(placement.nodes, placement.gpus):
        n = nodes[name]
        nodes[name] = replace(
            n,
            used_gpus=n.used_gpus | frozenset(gpus),
            used_cpus=n.used_cpus + job.cpus_per_task,
            used_mem_mb=n.used_mem_mb + (job.mem_mb or 0),
        )
