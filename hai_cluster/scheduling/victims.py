"""Indexes that keep the MLFQ pass from walking every node for every pending job.

`FreeIndex`: the nodes of a working copy by free GPU count, in place()'s order, so that placement
looks at the nodes it would choose first and stops once enough fit (place() orders by a total key).

`VictimIndex`: per job shape, each node's preemption option (the victims it would take there),
recomputed only for the nodes the pass changed since the shape was last asked, from the runs a
job of that level and class may take there (`Takeable`, shared by the shapes of that level and
class: they differ only in the GPUs they miss). The choice it
makes is exactly that of the plain scan (`scan_options`, kept as the reference the differential
test compares against): the scan visits nodes by name, stops at the first node where one victim
of exactly the missing GPUs suffices (single-node jobs), and takes the cheapest options seen.
"""
from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from dataclasses import dataclass
from typing import Iterable, NamedTuple

from ..core.model import JobView, NodeView
from ..core.resources import fits

URGENT = 0


class Candidate(NamedTuple):
    """A run the pass might preempt, as seen from one of its nodes."""
    run: JobView
    level: int
    rank: int  # its class rank (core.model.PRIORITY_RANK)
    ripe: bool  # it has held its GPUs for its level's quantum
    gpus: int  # GPUs it holds on this node
    run_gpus: int  # GPUs it holds on all its nodes


@dataclass(frozen=True)
class SearchContext:
    """What the victim search reads of one pass. The containers are the pass's own working copies,
    shared and not copied: the pass changes them, and tells the VictimIndex which nodes changed."""
    future: dict[str, NodeView]  # each node as it will be once the PREEMPTING runs have left
    candidates: dict[str, list[Candidate]]  # per node, the runs that could be preempted, cheapest first
    reserved: set[str]  # nodes held for a starving job
    taken: set[int]  # ids of the runs the pass already preempts
    node_order: list[str]  # every node, by name
    prefer_idle: bool  # idle runs are taken first, whatever their level

    def busy(self, victims: list[JobView]) -> int:
        """How many victims are not idle, when idle victims are preferred (else 0: no preference)."""
        return sum(not v.idle for v in victims) if self.prefer_idle else 0


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
        self._counts = sorted(self._by_count)  # every count that has (or had) a list, ascending
        self._stale: set[str] = set()  # nodes changed since the last look-up

    def copy_for(self, nodes: dict[str, NodeView], changed: Iterable[str]) -> FreeIndex:
        """The index of another working copy of the same nodes that differs from this one only on
        `changed` (they are placed again at its first look-up): no second sort of every node."""
        new = object.__new__(FreeIndex)
        new.nodes, new.sign = nodes, self.sign
        if self._stale:
            self._refresh()
        new._at = dict(self._at)
        new._by_count = {count: list(keys) for count, keys in self._by_count.items()}
        new._counts = list(self._counts)
        new._stale = set(changed)
        return new

    def _place_of(self, n: NodeView) -> tuple[int, tuple[int, str]]:
        return len(n.free_gpus), (self.sign * (n.cpus - n.used_cpus), n.name)

    def update(self, name: str) -> None:
        """The node's working copy changed: it is placed again at the next look-up (a pass often
        changes a node twice in a row, as when it frees victims and claims their GPUs)."""
        self._stale.add(name)

    def update_all(self, names: Iterable[str]) -> None:
        self._stale.update(names)

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
            keys = self._by_count.get(at[0])
            if keys is None:
                keys = self._by_count[at[0]] = []
                insort(self._counts, at[0])
            insort(keys, at[1])
        self._stale.clear()

    def first_fitting(self, job: JobView, excluded: set[str]) -> list[NodeView] | None:
        """The job.nodes nodes place() would choose for this job (one partition, whole GPUs),
        leaving out `excluded`; None when fewer fit."""
        if self._stale:
            self._refresh()
        g, by_count, nodes, want = job.gpus_per_node, self._by_count, self.nodes, job.nodes
        counts = self._counts[bisect_left(self._counts, g):]
        if self.sign < 0:
            counts.reverse()
        chosen: list[NodeView] = []
        for k in counts:
            for _, name in by_count[k]:
                if name not in excluded and fits(job, node := nodes[name]):
                    chosen.append(node)
                    if len(chosen) == want:
                        return chosen
        return None


def node_option(d: SearchContext, job: JobView, level: int, name: str, rank: int, fit: bool | None = None):
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
    chosen: list[JobView] = []
    freed = total = 0
    urgent = rank == URGENT
    taken = d.taken
    for c in candidates:
        if freed >= need:
            break
        if not urgent and c.level <= level:
            if d.prefer_idle:
                continue  # idle runs came first, whatever their level: look further
            break  # candidates come lowest level first: the rest are not below this job
        if may_take(c, level, rank, taken):
            chosen.append(c.run)
            freed += c.gpus
            total += c.run_gpus
    if freed >= need:
        return (len(chosen), total, name, chosen), need
    return None


def may_take(c: Candidate, level: int, rank: int, taken) -> bool:
    """Whether a job of this level and class rank may take the candidate run: not one already
    taken; an urgent job takes a run of a lower class at once, whatever its level (the grace period
    still applies), even one that cannot resume; otherwise only a run that can resume (time-slicing
    loses no work), of a strictly lower level, no more important class, that is ripe (it has held
    its GPUs for its quantum, so a checkpoint is amortised)."""
    return c.run.id not in taken and ((rank == URGENT and c.rank > URGENT)
                                      or (c.run.resumable and c.rank >= rank and c.level > level and c.ripe))


def node_fits(job: JobView, node: NodeView) -> bool:
    """Whether one rank of the job fits on the node once it is empty. It reads only what a pass
    never changes on its working copies (their usage aside), so a shape may keep the answer."""
    return node.schedulable and bool(fits(job, node, ignore_usage=True))


def scan_options(d: SearchContext, job: JobView, level: int, rank: int) -> list | None:
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
        if job.nodes == 1 and option[:2] == (1, need) and d.busy(option[3]) == 0:
            break  # one victim of exactly the size needed: nothing can be cheaper
    if len(options) < job.nodes:
        return None
    options.sort(key=lambda o: (d.busy(o[3]), *o[:3]))
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


class Takeable:
    """For jobs of one class rank (and, for urgent jobs, one level): on each node, the runs such a
    job may take, in the order node_option takes them, with the GPUs they free on the node and hold
    in all, summed over each prefix, and their levels (negated). node_option takes the shortest
    prefix that frees the GPUs missing, so a shape's option on a node is a bisection here instead
    of a walk over the node's candidates. A job that is not urgent takes only runs of a level below
    its own, and the candidates come lowest level first: what it may take is the prefix of the
    list of its class whose levels are below its own (`limit`), so one list serves every level."""

    def __init__(self, level: int, rank: int) -> None:
        self.level, self.rank = level, rank
        self.urgent = rank == URGENT
        self.seen = 0  # position in the log of taken runs' nodes up to which the lists are current
        # name -> (runs, freed, total, negated levels)
        self.on: dict[str, tuple[list[JobView], list[int], list[int], list[int]]] = {}

    def drop(self, names: Iterable[str]) -> None:
        """The pass took runs on these nodes (nothing else it changes matters here)."""
        for name in names:
            self.on.pop(name, None)

    def at(self, d: SearchContext, name: str) -> tuple[list[JobView], list[int], list[int], list[int]]:
        entry = self.on.get(name)
        if entry is None:
            entry = self.on[name] = self._walk(d, name)
        return entry

    def limit(self, entry, level: int) -> int:
        """How many of the node's takeable runs a job of this level may take."""
        return len(entry[1]) if self.urgent else bisect_left(entry[3], -level)

    def _walk(self, d: SearchContext, name: str) -> tuple[list[JobView], list[int], list[int], list[int]]:
        # The index is not used when idle runs are preferred, so the candidates come lowest level
        # first. An urgent job may take runs of any level (of a lower class).
        level, rank, urgent = self.level, self.rank, self.urgent
        taken = d.taken
        runs: list[JobView] = []
        freed: list[int] = []
        total: list[int] = []
        levels: list[int] = []
        f = t = 0
        for c in d.candidates.get(name, ()):
            if urgent:
                ok = may_take(c, level, rank, taken)
            else:  # may_take, but for the level (limit() cuts the list there)
                ok = c.run.id not in taken and c.run.resumable and c.rank >= rank and c.ripe
            if ok:
                f += c.gpus
                t += c.run_gpus
                runs.append(c.run)
                freed.append(f)
                total.append(t)
                levels.append(-c.level)
        return runs, freed, total, levels


class VictimIndex:
    """The options of every job shape a pass asked for. It keeps no reference to the pass (which
    holds it), so that the pass is freed as soon as it ends, without a cycle to collect."""

    def __init__(self, node_order: list[str]) -> None:
        self.log: list[str] = []  # nodes changed by the pass, in order
        self.taken_log: list[str] = []  # nodes of the runs the pass took, in order
        self.shapes: dict[tuple, _Shape] = {}
        # class rank (and level, for urgent jobs) -> the runs a job of that class may take, per node
        self.takeable: dict[tuple[int, int], Takeable] = {}
        self.position = {name: i for i, name in enumerate(node_order)}

    def changed(self, names: Iterable[str]) -> None:
        self.log.extend(names)

    def took(self, runs: Iterable[JobView]) -> None:
        """The pass takes these runs: they are no longer takeable on any of their nodes."""
        for run in runs:
            self.taken_log.extend(node for node, _ in run.allocation)

    def takeable_for(self, level: int, rank: int) -> Takeable:
        """The runs a job of this level and class may take, current with the runs taken."""
        key = (level if rank == URGENT else 0, rank)
        takeable = self.takeable.get(key)
        if takeable is None:
            takeable = self.takeable[key] = Takeable(level, rank)
        if takeable.seen < len(self.taken_log):
            takeable.drop(set(self.taken_log[takeable.seen:]))
            takeable.seen = len(self.taken_log)
        return takeable

    def options(self, d: SearchContext, job: JobView, level: int, rank: int) -> list | None:
        # Everything node_option reads of the job: fits() (partition, sizes, runtime), the level
        # and the class rank (may_preempt, urgency). Constrained jobs and passes with a reservation
        # ahead (fits() reads more of the job then) take the scan instead (MlfqPass.try_preempt).
        key = (job.gpus_per_node, job.partition, job.cpus_per_node, job.mem_mb, job.runtime, level, rank)
        shape = self.shapes.get(key)
        if shape is None:
            shape = self.shapes[key] = _Shape()
        takeable = self.takeable_for(level, rank)
        # Bring the known prefix up to date; nodes past it are computed fresh when it grows.
        position, known = self.position, shape.known
        self._compute(d, shape, takeable, job, level, [name for name in set(self.log[shape.seen:]) if position[name] < known])
        shape.seen = len(self.log)
        order = d.node_order
        rest = map(order.__getitem__, range(known, len(order)))  # the nodes past the prefix, by name
        if job.nodes > 1:
            self._compute(d, shape, takeable, job, level, rest)
            shape.known = len(order)
        elif shape.first_exact() is None:
            shape.known += self._compute(d, shape, takeable, job, level, rest, stop_at_exact=True)
        return shape.pick(job.nodes)

    @staticmethod
    def _compute(d: SearchContext, shape: _Shape, takeable: Takeable, job: JobView, level: int,
                 names: Iterable[str], stop_at_exact: bool = False) -> int:
        """Compute the shape's options on these nodes, in order (one loop for them all: this runs
        for thousands of nodes a pass); with stop_at_exact, up to the first exact one. Returns how
        many nodes it computed. An option is what node_option returns, read off the takeable runs."""
        fit_of, future, reserved, whole = shape.fit, d.future, d.reserved, job.gpu_share is None
        runs_on, drop = takeable.on, shape.opts.pop  # (a shape keeps no entry for a node without an option)
        g = job.gpus_per_node
        urgent, above = takeable.urgent, -level  # (takeable.limit, inlined)
        done = 0
        for name in names:
            done += 1
            entry = runs_on.get(name) or takeable.at(d, name)
            freed = entry[1]
            n = len(freed) if urgent else bisect_left(entry[3], above)  # how many it may take
            need = g - len(future[name].free_gpus)
            if need > 0 and (not n or freed[n - 1] < need) or name in reserved:
                drop(name, None)  # the runs it may take do not free enough (most nodes), or reserved
                continue
            if whole:
                fit = fit_of.get(name)
                if fit is None:
                    fit = fit_of[name] = node_fits(job, future[name])
            else:  # a share's fit reads the card's use, and the key does not name the share
                fit = node_fits(job, future[name])
            if not fit:
                drop(name, None)
                continue
            k = bisect_left(freed, need, 0, n) + 1 if need > 0 else 0  # the shortest prefix that frees enough
            found = (k, entry[2][k - 1] if k else 0, name, entry[0][:k]), need
            if shape.set(name, found) and stop_at_exact:
                break
        return done
