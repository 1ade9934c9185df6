"""Indexes that keep the MLFQ pass from walking every node for every pending job.

`FreeIndex`: the nodes of a working copy by free GPU count, so that placement only looks at the
nodes that can hold a job's ranks (place() gives the same answer on that subset: it filters on
free GPUs itself and orders by a total key).

`VictimIndex`: per job shape, each node's preemption option (the victims it would take there),
recomputed only for the nodes the pass changed since the shape was last asked. The choice it
makes is exactly that of the plain scan (`scan_options`, kept as the reference the differential
test compares against): the scan visits nodes by name, stops at the first node where one victim
of exactly the missing GPUs suffices (single-node jobs), and takes the cheapest options seen.
"""
from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Iterable

from ..core.model import JobView, NodeView
from ..core.resources import fits

if TYPE_CHECKING:
    from .mlfq import _Decision

URGENT = 0


class FreeIndex:
    def __init__(self, nodes: dict[str, NodeView]) -> None:
        self.nodes = nodes
        self._count: dict[str, int] = {}
        self._by_count: dict[int, set[str]] = {}
        for name in nodes:
            self.update(name)

    def update(self, name: str) -> None:
        k = len(self.nodes[name].free_gpus)
        old = self._count.get(name)
        if old == k:
            return
        if old is not None:
            self._by_count[old].discard(name)
        self._count[name] = k
        self._by_count.setdefault(k, set()).add(name)

    def preferred(self, gpus: int, mode: str, excluded: set[str]) -> tuple[list[str], list[int]]:
        """The nodes with at least `gpus` free that place() prefers (the bucket with the fewest free
        for binpack, most for spread), and the other free counts in that order (their nodes by
        `names`, only when the first bucket had no room): place() on the first bucket alone gives
        the same answer as on all whenever it finds room there, since every other node sorts after it."""
        counts = sorted((k for k, names in self._by_count.items() if k >= gpus and names),
                        reverse=mode != "binpack")
        for i, k in enumerate(counts):
            first = [n for n in self._by_count[k] if n not in excluded]
            if first:
                return first, counts[i + 1:]
        return [], []

    def names(self, counts: list[int], excluded: set[str]) -> list[str]:
        return [n for k in counts for n in self._by_count[k] if n not in excluded]


def node_option(d: _Decision, job: JobView, level: int, name: str, urgent: bool):
    """The victims `job` would take on node `name`: (count, their GPUs, name, victims) and the
    GPUs missing there before preempting; None when the node cannot give room."""
    node = d.future[name]
    need = job.gpus_per_node - len(node.free_gpus)
    if need > 0 and name not in d.candidates:
        return None
    if name in d.reserved or not node.schedulable or not fits(job, node, ignore_usage=True):
        return None
    chosen: list[JobView] = []
    freed = 0
    for v in d.candidates.get(name, ()):
        if freed >= need:
            break
        if not urgent and d.level(v) <= level:
            if d.cfg.prefer_idle_victims:
                continue  # idle runs came first, whatever their level: look further
            break  # candidates come lowest level first: the rest are not below this job
        if d.may_preempt(v, job, level):
            chosen.append(v)
            for n, gs in v.allocation:  # a loop, not sum() over a generator: this runs very often
                if n == name:
                    freed += len(gs)
    if freed >= need:
        return (len(chosen), sum(v.gpus for v in chosen), name, chosen), need
    return None


def scan_options(d: _Decision, job: JobView, level: int, rank: int) -> list | None:
    """The reference: every node in name order. Returns the options picked (one per rank) or None.
    Also the search when idle victims are preferred (options with fewer busy victims first),
    which the index does not model."""
    options = []
    urgent = rank == URGENT
    for name in d.node_order:
        found = node_option(d, job, level, name, urgent)
        if found is None:
            continue
        option, need = found
        options.append(option)
        if job.nodes == 1 and option[:2] == (1, need) and d._busy(option[3]) == 0:
            break  # one victim of exactly the size needed: nothing can be cheaper
    if len(options) < job.nodes:
        return None
    options.sort(key=lambda o: (d._busy(o[3]), *o[:3]))
    return options[:job.nodes]


class _Shape:
    """One job shape's options on every node, with heaps to find the cheapest (stale entries are
    skipped by token)."""

    def __init__(self) -> None:
        self.seen = 0  # position in the change log up to which this shape is current
        self.opts: dict[str, tuple] = {}  # name -> (token, class, exact, option)
        self.classes: dict[tuple[int, int], list] = {}  # (victims, GPUs) -> heap of (name, token)
        self.exact: list = []  # heap of (name, token): nodes where one victim of exactly the need suffices
        self.token = 0

    def set(self, name: str, found) -> None:
        self.opts.pop(name, None)
        if found is None:
            return
        option, need = found
        self.token += 1
        cls = option[:2]
        exact = cls == (1, need)
        self.opts[name] = (self.token, cls, exact, option)
        heapq.heappush(self.classes.setdefault(cls, []), (name, self.token))
        if exact:
            heapq.heappush(self.exact, (name, self.token))

    def _valid(self, name: str, token: int) -> bool:
        entry = self.opts.get(name)
        return entry is not None and entry[0] == token

    def _top(self, heap: list) -> str | None:
        while heap and not self._valid(*heap[0]):
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def pick(self, count: int) -> list | None:
        if len(self.opts) < count:
            return None
        order = sorted(k for k, heap in self.classes.items() if self._top(heap) is not None)
        if count == 1:
            # The scan stops at the first exact node: only nodes up to it (by name) are seen.
            stop = self._top(self.exact)
            for cls in order:
                name = self._top(self.classes[cls])
                if stop is None or name <= stop:
                    return [self.opts[name][3]]
            return None  # not reached: the exact node itself is in some class
        picked: list = []
        for cls in order:
            heap, kept = self.classes[cls], []
            while heap and len(picked) < count:
                name, token = heapq.heappop(heap)
                if self._valid(name, token):
                    kept.append((name, token))
                    picked.append(self.opts[name][3])
            for entry in kept:
                heapq.heappush(heap, entry)
            if len(picked) == count:
                break
        return picked


class VictimIndex:
    def __init__(self, d: _Decision) -> None:
        self.d = d
        self.log: list[str] = []  # nodes changed by the pass, in order
        self.shapes: dict[tuple, _Shape] = {}

    def changed(self, names: Iterable[str]) -> None:
        self.log.extend(names)

    def options(self, job: JobView, level: int, rank: int) -> list | None:
        # Everything node_option reads of the job: fits() (partition, sizes, runtime), the level
        # and the class rank (may_preempt, urgency).
        key = (job.gpus_per_node, job.partition, job.cpus_per_task, job.mem_mb, job.runtime, level, rank)
        urgent = rank == URGENT
        shape = self.shapes.get(key)
        if shape is None:
            shape = self.shapes[key] = _Shape()
            for name in self.d.node_order:
                shape.set(name, node_option(self.d, job, level, name, urgent))
        else:
            for name in set(self.log[shape.seen:]):
                shape.set(name, node_option(self.d, job, level, name, urgent))
        shape.seen = len(self.log)
        return shape.pick(job.nodes)
