"""The policy's working copy of node usage during one decide(), with cheap rejects.

`placement.place` checks every node with `fits()`; a queue of thousands of jobs that cannot fit
would cost O(jobs x nodes x GPUs) per decision. Two necessary conditions reject most of them in
O(1): enough nodes with enough free GPUs, and "a job of this shape already failed in this
decision" (usage only grows inside one decision, so a failure stays a failure).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Iterable

from ...core.model import JobView, NodeView, Placement
from ..placement import place, reserve


def shape(job: JobView) -> tuple:
    """Jobs of one shape fail together; the nodes a job may use are part of it (-w -x -C
    --exclusive --reservation)."""
    return (job.nodes, job.gpus_per_node, job.cpus_per_node, job.mem_mb, job.partition, job.exclusive,
            job.required_nodes, job.excluded_nodes, job.constraint, job.reservation)


class Workspace:
    def __init__(self, nodes: Iterable[NodeView]):
        self.nodes: dict[str, NodeView] = {n.name: n for n in nodes}
        self.free: dict[str, int] = {n.name: len(n.free_gpus) if n.schedulable else 0
                                     for n in self.nodes.values()}
        self.failed: set[tuple] = set()
        self.total = sum(self.free.values())  # free GPUs left; 0 means nothing else can start

    def could_fit(self, job: JobView) -> bool:
        if job.gpus > self.total or shape(job) in self.failed:
            return False
        need = job.gpus_per_node
        return sum(1 for f in self.free.values() if f >= need) >= job.nodes

    def place(self, job: JobView) -> Placement | None:
        placement = place(job, self.nodes) if self.could_fit(job) else None
        if placement is None:
            self.failed.add(shape(job))
        return placement

    def take(self, job: JobView, placement: Placement) -> None:
        reserve(job, placement, self.nodes)
        for name in placement.nodes:
            self.free[name] -= job.gpus_per_node
        self.total -= job.gpus

    def lock(self, names: Iterable[str]) -> None:
        """Nothing else starts on these nodes in this plan (their GPUs are promised elsewhere)."""
        for name in names:
            self.nodes.pop(name, None)
            self.total -= self.free.pop(name, 0)


def release(nodes: dict[str, NodeView], job: JobView, on: Iterable[str] | None = None) -> None:
    """Free a running job's share on each of its nodes (`on`, default where it runs) in a copy.

    With the job's allocation the exact GPUs are freed; without one (a job started in this very
    plan) the right *number* is, which is good for "would it fit" questions, never for a Start."""
    exact = dict(job.allocation) if on is None else {}
    for name in (on if on is not None else (exact or job.nodelist)):
        n = nodes.get(name)
        if n is None:
            continue
        gpus = exact.get(name)
        if gpus is None:
            used = sorted(n.used_gpus)
            gpus = used[max(0, len(used) - job.gpus_per_node):]
        nodes[name] = replace(n, used_gpus=n.used_gpus - frozenset(gpus),
                              used_cpus=max(0, n.used_cpus - job.cpus_per_node),
                              used_mem_mb=max(0, n.used_mem_mb - (job.mem_mb or 0)))
