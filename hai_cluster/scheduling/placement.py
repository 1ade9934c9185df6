"""Gang placement: all ranks of a job get nodes at once, or none do.

Consolidation: each rank takes one node's share and a job gets the fewest nodes it asked for.
Node choice: binpack (best fit: the fewest free GPUs that still fit, so large holes stay open for
large jobs) or spread (the most free GPUs first, so jobs share cards' hosts less); ties by name.
GPU choice within a node: by topology (core.topology; the lowest free indices without topology data).
Sharing jobs (a share of one card per rank) are placed by core.sharing, packed per `pack`.
"""
from __future__ import annotations

from dataclasses import replace
from heapq import nsmallest
from itertools import filterfalse
from operator import attrgetter
from typing import Iterable

from ..core.model import JobView, NodeView, Placement
from ..core.resources import choose_nodes, fits, node_set_ok
from ..core.sharing import release_share, reserve_shares
from ..core.topology import choose_cards
from .shares import place_shared

_INDEX = attrgetter("index")
_NAME = attrgetter("name")


def place(job: JobView, nodes: dict[str, NodeView], mode: str = "binpack",
          only: Iterable[str] | None = None, pack: str | None = None) -> Placement | None:
    if len(job.partitions) > 1:  # -p a,b: the whole gang in one partition, the first that has room
        only = None if only is None else list(only)
        for p in job.partitions:
            placement = place(replace(job, partition=p), nodes, mode, only, pack)
            if placement is not None:
                return placement
        return None
    pool = nodes.values() if only is None else (nodes[n] for n in only)
    if job.gpu_share is not None:
        return place_shared(job, pool, pack or mode)
    g = job.gpus_per_node
    # The GPU count is the usual bottleneck and is cached on the view: test it before the rest.
    candidates = [n for n in pool if len(n.free_gpus) >= g and fits(job, n)]
    if len(candidates) < job.nodes:
        return None
    sign = 1 if mode == "binpack" else -1
    key = lambda n: (sign * len(n.free_gpus), sign * (n.cpus - n.used_cpus), n.name)  # noqa: E731
    if job.required_nodes:  # -w: those first, the rest of -N as usual
        named = [n for n in candidates if n.name in job.required_nodes]
        if len(named) < len(job.required_nodes):
            return None
        others = [n for n in candidates if n.name not in job.required_nodes]
        chosen = named + nsmallest(job.nodes - len(named), others, key=key)
        return placement_on(job, chosen) if node_set_ok(job, chosen) else None
    if job.constraint is not None and job.constraint.set_wide:  # [a|b], counts: the first nodes in order that meet them
        chosen = choose_nodes(job, sorted(candidates, key=key))
        return None if chosen is None else placement_on(job, chosen)
    # The first job.nodes in sorted order (the key is total: ties end on the name).
    best = nsmallest(job.nodes, candidates, key=key)
    return placement_on(job, best)


def place_on_each(job: JobView, nodes: list[NodeView]) -> Placement | None:
    """What place() returns for a job of one partition and whole GPUs offered exactly job.nodes
    nodes: all of them if one rank fits on each, else None (no ordering to do)."""
    g = job.gpus_per_node
    if len(nodes) != job.nodes or not all(len(n.free_gpus) >= g and fits(job, n) for n in nodes):
        return None
    if job.required_nodes and not set(job.required_nodes) <= {n.name for n in nodes}:
        return None
    return placement_on(job, nodes) if node_set_ok(job, nodes) else None


def placement_on(job: JobView, nodes: list[NodeView]) -> Placement:
    """The job's placement on these nodes (one rank each, whole GPUs), ranks in name order."""
    chosen = sorted(nodes, key=_NAME) if len(nodes) > 1 else nodes
    if job.exclusive:  # the node's every GPU, as Slurm allocates an exclusive job all its GRES
        gpus = tuple(tuple(g.index for g in n.gpus) for n in chosen)
    else:
        count = job.gpus_per_node
        gpus = tuple([choose_cards(n, count) for n in chosen])
    return Placement(nodes=tuple([n.name for n in chosen]), gpus=gpus)


def reserve(job: JobView, placement: Placement, nodes: dict[str, NodeView]) -> None:
    """Mark the placement's resources used in `nodes` (the policy's working copy)."""
    if placement.shares:
        reserve_shares(placement, nodes)
        placement = replace(placement, gpus=tuple(() for _ in placement.gpus))  # cards counted above
    for name, gpus in zip(placement.nodes, placement.gpus):
        n = nodes[name]
        nodes[name] = with_usage(n, n.used_gpus | frozenset(gpus), n.used_cpus + job.rank_cpus(n.cpus),
                                 n.used_mem_mb + (job.mem_mb or 0))


def release(job: JobView, node_name: str, gpus: Iterable[int], nodes: dict[str, NodeView]) -> None:
    """The opposite of reserve for one rank: its resources count as free in the working copy."""
    if job.gpu_share is not None:
        release_share(job, node_name, gpus, nodes)
        gpus = ()
    n = nodes[node_name]
    nodes[node_name] = with_usage(n, n.used_gpus - frozenset(gpus), max(0, n.used_cpus - job.rank_cpus(n.cpus)),
                                  max(0, n.used_mem_mb - (job.mem_mb or 0)))


def with_usage(n: NodeView, used_gpus: frozenset[int], used_cpus: int, used_mem_mb: int) -> NodeView:
    """`replace(n, used_gpus=..., used_cpus=..., used_mem_mb=...)` without its per-call field
    introspection and __init__ (a fifth of a large MLFQ pass went there): a copy of the frozen
    view's fields with the three usages set and its cached free_gpus computed as NodeView does
    (in C: the pass reads it right away)."""
    fields = dict(n.__dict__)
    fields["used_gpus"], fields["used_cpus"], fields["used_mem_mb"] = used_gpus, used_cpus, used_mem_mb
    fields["free_gpus"] = tuple(filterfalse(used_gpus.__contains__, map(_INDEX, n.gpus)))
    new = object.__new__(NodeView)
    new.__dict__.update(fields)
    return new
