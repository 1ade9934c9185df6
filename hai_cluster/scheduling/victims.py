"""Indexes that keep the MLFQ pass from walking every node for every pending job.

`FreeIndex`: the nodes of a working copy by free GPU count, in place()'s order, so that placement
looks at the nodes it would choose first and stops once enough fit (place() orders by a total key).

`VictimIndex`: per job shape, each node's preemption option (the victims it would take there),
recomputed only for the nodes the pass changed since the shape was last asked. The choice it
makes is exactly that of the plain scan (`scan_options`, kept as the reference the differential
test compares against): the scan visits nodes by name, stops at the first node where one victim
of exactly the missing GPUs suffices (single-node jobs), and takes the cheapest options seen.
"""
from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from typing import TYPE_CHECKING, Iterable, NamedTuple

from ..core.model import JobView, NodeView
from ..core.resources import fits

if TYPE_CHECKING:
    from .mlfq import _Decision

URGENT = 0


class Candidate(NamedTuple):
    """A run the pass might preempt, as seen from one of its nodes."""
    run: JobView
    level: int
    rank: int  # its class rank (mlfq.CLASS_RANK)
    ripe: bool  # it has held its GPUs for its level's quantum
    gpus: int  # GPUs it holds on this node
    run_gpus: int  # GPUs it holds on all its nodes


class FreeIndex:
    """The nodes of a working copy by free GPU count, each count's nodes kept in place()'s order
    (free CPUs, then name), so that the nodes place() would choose are found by walking the counts
    and their nodes in that order until enough fit: place() sorts every fitting node by (free GPUs,
    free CPUs, name) and takes the first ones, which are exactly those (a total order)."""

    def __init__(self, nodes: dict[str, NodeView], mode: str) -> None:
        self.nodes = nodes
        self.sign = 1 if mode == "binpack" else -1  # binpack: fewest free first; spread: most
        self._at = {name: self._place_of(n) for name, n in nodes.items()}  # name -> (free GPUs, key)
        self._by_count: dict[int, list[tuple[int, str]]] = {}  # free GPUs -> sorted keys
        for count, key in self._at.values():
            self._by_count.setdefault(count, []).append(key)
        for keys in self._by_count.values():
            keys.sort()
        self._stale: set[str] = set()  # nodes changed since the last look-up

    def _place_of(self, n: NodeView) -> tuple[int, tuple[int, str]]:
        return len(n.free_gpus), (self.sign * (n.cpus - n.used_cpus), n.name)

    def update(self, name: str) -> None:
        """The node's working copy changed: it is placed again at the next look-up (a pass often
        changes a node twice in a row, as when it frees victims and claims their GPUs)."""
        self._stale.add(name)

    def _refresh(self) -> None:
        for name in self._stale:
            at = self._place_of(self.nodes[name])
            old = self._at.get(name)
            if old == at:
                continue
            if old is not None:
                keys = self._by_count[old[0]]
                del keys[bisect_left(keys, old[1])]
            self._at[name] = at
            insort(self._by_count.setdefault(at[0], []), at[1])
        self._stale.clear()

    def first_fitting(self, job: JobView, excluded: set[str]) -> list[NodeView] | None:
        """The job.nodes nodes place() would choose for this job (one partition, whole GPUs),
        leaving out `excluded`; None when fewer fit."""
        if self._stale:
            self._refresh()
        g = job.gpus_per_node
        counts = sorted((k for k, keys in self._by_count.items() if k >= g and keys), reverse=self.sign < 0)
        chosen: list[NodeView] = []
        for k in counts:
            for _, name in self._by_count[k]:
                if name not in excluded and fits(job, node := self.nodes[name]):
                    chosen.append(node)
                    if len(chosen) == job.nodes:
                        return chosen
        return None


def node_option(d: _Decision, job: JobView, level: int, name: str, rank: int, fit: bool | None = None):
    """The victims `job` (of this level and class rank) would take on node `name`: (count, their
    GPUs, name, victims) and the GPUs missing there before preempting; None when the node cannot
    give room. `fit`: whether one rank fits on the node empty, when the caller knows (it cannot
    change during a pass: see node_fits)."""
    node = d.future[name]
    need = job.gpus_per_node - len(node.free_gpus)
    candidates = d.candidates.get(name, ())
    if need > 0 and not candidates:
        return None
    if name in d.reserved or not (node_fits(job, node) if fit is None else fit):
        return None
    # Who may be taken (inline: this loop runs for every node a shape looks at): no run already
    # taken; an urgent job takes a run of a lower class at once, whatever its level (the grace
    # period still applies); otherwise only a run of a strictly lower level, no more important
    # class, that is ripe (it has held its GPUs for its quantum, so a checkpoint is amortised).
    chosen: list[JobView] = []
    freed = total = 0
    urgent = rank == URGENT
    taken = d.victims
    for c in candidates:
        if freed >= need:
            break
        if not urgent and c.level <= level:
            if d.cfg.prefer_idle_victims:
                continue  # idle runs came first, whatever their level: look further
            break  # candidates come lowest level first: the rest are not below this job
        if c.run.id not in taken and ((urgent and c.rank > URGENT) or (c.rank >= rank and c.level > level and c.ripe)):
            chosen.append(c.run)
            freed += c.gpus
            total += c.run_gpus
    if freed >= need:
        return (len(chosen), total, name, chosen), need
    return None


def node_fits(job: JobView, node: NodeView) -> bool:
    """Whether one rank of the job fits on the node once it is empty. It reads only what a pass
    never changes on its working copies (their usage aside), so a shape may keep the answer."""
    return node.schedulable and bool(fits(job, node, ignore_usage=True))


def scan_options(d: _Decision, job: JobView, level: int, rank: int) -> list | None:
    """The reference: every node in name order. Returns the options picked (one per rank) or None.
    Also the search when idle victims are preferred (options with fewer busy victims first),
    which the index does not model."""
    options = []
    for name in d.node_order:
        found = node_option(d, job, level, name, rank)
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
    """One job shape's options on the nodes of a prefix of the name order (`known`), with heaps to
    find the cheapest (stale entries are skipped by token)."""

    def __init__(self) -> None:
        self.seen = 0  # position in the change log up to which this shape is current
        # The options are known for the first `known` nodes by name. A single-node job needs only
        # the nodes up to the first exact one (the scan stops there), so the prefix grows as
        # needed; a gang's options need every node.
        self.known = 0
        self.fit: dict[str, bool] = {}  # name -> node_fits, asked once per node
        self.opts: dict[str, tuple] = {}  # name -> (token, class, exact, option)
        self.classes: dict[tuple[int, int], list] = {}  # (victims, GPUs) -> heap of (name, token)
        self.exact: list = []  # heap of (name, token): nodes where one victim of exactly the need suffices
        self.token = 0

    def set(self, name: str, found) -> bool:
        """Keep the node's option (None: it has none); whether it is an exact one."""
        self.opts.pop(name, None)
        if found is None:
            return False
        option, need = found
        self.token += 1
        cls = option[:2]
        exact = cls == (1, need)
        self.opts[name] = (self.token, cls, exact, option)
        heapq.heappush(self.classes.setdefault(cls, []), (name, self.token))
        if exact:
            heapq.heappush(self.exact, (name, self.token))
        return exact

    def _valid(self, name: str, token: int) -> bool:
        entry = self.opts.get(name)
        return entry is not None and entry[0] == token

    def _top(self, heap: list) -> str | None:
        while heap and not self._valid(*heap[0]):
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def first_exact(self) -> str | None:
        return self._top(self.exact)

    def pick(self, count: int) -> list | None:
        if len(self.opts) < count:
            return None
        order = sorted(self.classes)  # cheapest first; a class's heap may hold only stale entries
        if count == 1:
            # The scan stops at the first exact node: only nodes up to it (by name) are seen.
            stop = self.first_exact()
            for cls in order:
                name = self._top(self.classes[cls])
                if name is not None and (stop is None or name <= stop):
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
    """The options of every job shape a pass asked for. It keeps no reference to the pass (which
    holds it), so that the pass is freed as soon as it ends, without a cycle to collect."""

    def __init__(self, node_order: list[str]) -> None:
        self.log: list[str] = []  # nodes changed by the pass, in order
        self.shapes: dict[tuple, _Shape] = {}
        self.position = {name: i for i, name in enumerate(node_order)}

    def changed(self, names: Iterable[str]) -> None:
        self.log.extend(names)

    def options(self, d: _Decision, job: JobView, level: int, rank: int) -> list | None:
        # Everything node_option reads of the job: fits() (partition, sizes, runtime), the level
        # and the class rank (may_preempt, urgency).
        key = (job.gpus_per_node, job.partition, job.cpus_per_task, job.mem_mb, job.runtime, level, rank)
        shape = self.shapes.get(key)
        if shape is None:
            shape = self.shapes[key] = _Shape()
        # Bring the known prefix up to date; nodes past it are computed fresh when it grows.
        position, known = self.position, shape.known
        self._compute(d, shape, job, level, rank, [name for name in set(self.log[shape.seen:]) if position[name] < known])
        shape.seen = len(self.log)
        order = d.node_order
        rest = map(order.__getitem__, range(known, len(order)))  # the nodes past the prefix, by name
        if job.nodes > 1:
            self._compute(d, shape, job, level, rank, rest)
            shape.known = len(order)
        elif shape.first_exact() is None:
            shape.known += self._compute(d, shape, job, level, rank, rest, stop_at_exact=True)
        return shape.pick(job.nodes)

    @staticmethod
    def _compute(d: _Decision, shape: _Shape, job: JobView, level: int, rank: int, names: Iterable[str],
                 stop_at_exact: bool = False) -> int:
        """Compute the shape's options on these nodes, in order (one call for them all: this runs
        for thousands of nodes a pass); with stop_at_exact, up to the first exact one. Returns how
        many nodes it computed."""
        fit_of, future, whole = shape.fit, d.future, job.gpu_share is None
        done = 0
        for name in names:
            done += 1
            fit = None  # a share's fit reads the card's use, and the key does not name the share
            if whole:
                fit = fit_of.get(name)
                if fit is None:
                    fit = fit_of[name] = node_fits(job, future[name])
            if shape.set(name, node_option(d, job, level, name, rank, fit)) and stop_at_exact:
                break
        return done
