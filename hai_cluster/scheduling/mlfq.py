"""Multi-level feedback queue on attained GPU service (Tiresias' 2D-LAS), with preemption.

A job's level comes from the GPU-seconds it has received over all its runs: new jobs start at
level 0 and sink as they accumulate service. Pending jobs are served in order (urgent first, then
level, then interactive jobs before batch ones, then priority class, then fair-share factor, then
age; the lowest level round-robin by last run). Interactive jobs are never requeued, so
time-slicing never takes them. A job that does
not fit may preempt running jobs of a *strictly lower* level (larger index) that have held their
GPUs for at least their level's quantum, so that a checkpoint is amortised; preempting for a job
of the same level costs more than it gains on real traces. Urgent jobs preempt lower classes at
once. A job that has waited far longer than it has run is promoted to level 0 (starvation
guard), and one that has waited long reserves nodes so small jobs cannot starve it forever.
"""
from __future__ import annotations

import math
from bisect import bisect_right
from functools import partial
from operator import attrgetter, itemgetter
from typing import AbstractSet as Set, Mapping

from ..core.model import PRIORITY_RANK, JobView, NodeView, Snapshot
from ..core.sizemodel import bin_of
from ..core.reasons import PRIORITY, RESOURCES, WAITING_FOR_CHECKPOINT
from ..core.resources import fits
from ..core.states import JobState
from .gittins import Ranker, service_rate
from .mlfqconfig import MlfqConfig  # noqa: F401 (the policy's settings, imported from here too)
from .placement import place, place_on_each, placement_on, release, reserve, with_usage
from .plan import Plan, Preempt, Start, Wait
from .shares import best_effort_room
from .victims import Candidate, FreeIndex, SearchContext, VictimIndex, scan_options

# Enum members as plain names: looked up once, not once per job of a long list.
_PENDING, _RUNNING, _PREEMPTING = JobState.PENDING, JobState.RUNNING, JobState.PREEMPTING
_ID, _SUBMIT_TIME, _NICE = attrgetter("id"), attrgetter("submit_time"), attrgetter("nice")


def _round_robin_time(j: JobView) -> float:
    return j.last_run_end or -math.inf


def starvation(cfg: MlfqConfig, j: JobView, now: float) -> tuple[bool, float | None]:
    """The starvation guard on a pending job: (promoted to level 0 now, else when it will be or None)."""
    if cfg.starvation_factor > 0 and j.state == _PENDING and j.gpus > 0 and j.attained_gpu_seconds > 0:
        ran = j.attained_gpu_seconds / j.gpus
        promote_at = max(cfg.starvation_factor * ran, cfg.starvation_floor)
        if j.waited(now) >= promote_at:
            return True, None
        return False, now + promote_at - j.waited(now)
    return False, None


def pending_levels(cfg: MlfqConfig, pending: list[JobView], now: float) -> list[int]:
    """Each pending job's level as a pass serves it (the starvation guard's promotion included)."""
    if cfg.starvation_factor > 0:
        return [0 if starvation(cfg, j, now)[0] else cfg.level_of(j.attained(now)) for j in pending]
    # Without the guard a pending job's level is that of the service of its past runs (what
    # attained() is without a current run); level_of's bisection called from C, not once per job.
    return list(map(partial(bisect_right, cfg.thresholds), [j.attained_gpu_seconds for j in pending]))


def service_order(pending: list[JobView], levels: list[int], lowest: int,
                  fairshare: Mapping[tuple[str, str], float],
                  ranks: Mapping[int, float] | None = None,
                  lifted: Set[int] = frozenset()) -> list[tuple[JobView, int, int]]:
    """Pending jobs in service order, each with its level and class rank: the MLFQ's queue, and
    what sprio's PRIORITY follows (scheduling/priority.py).

    The order is that of the key (urgent first, level, interactive jobs before batch ones, class
    rank, best-effort share last,
    round-robin time at the lowest level, lower --nice, higher fair-share factor, the lower
    Gittins rank where `ranks` (job id -> rank) are given, submit time, id), the jobs `lifted`
    (lift_factor: old ones) first at level 0 in submit order. Its
    leading fields take few values: the jobs are grouped by them, and each group is ordered
    by the rest with one stable sort per field, least significant first, on plain numbers
    (one sort of a tuple per job was a tenth of a large pass)."""
    groups: dict[tuple[int, int, bool, int, bool], list[JobView]] = {}
    for j, level in zip(pending, levels):
        rank = PRIORITY_RANK.get(j.priority, 2)
        # Best-effort shares only use what is left: after the rest of their level and class (a
        # guaranteed share that preempted one must not lose the card to it again).
        best_effort = j.gpu_share is not None and j.gpu_share.qos == "best-effort"
        # Interactive jobs (salloc, srun) go ahead of the batch jobs of their level: a person waits on them
        key = (0 if rank == 0 else 1, level, not j.interactive, rank, best_effort)
        try:
            groups[key].append(j)
        except KeyError:
            groups[key] = [j]
    niced = any(map(_NICE, pending))
    out: list[tuple[JobView, int, int]] = []
    for key in sorted(groups):
        jobs, level, rank = groups[key], key[1], key[3]
        jobs.sort(key=_ID)
        jobs.sort(key=_SUBMIT_TIME)
        if ranks is not None:  # the lowest Gittins rank first within the level
            jobs.sort(key=lambda j: ranks[j.id])
            if level == 0 and lifted:  # old jobs first, in submit order
                jobs[:] = sorted((j for j in jobs if j.id in lifted), key=_SUBMIT_TIME) + \
                    [j for j in jobs if j.id not in lifted]
        if fairshare:  # the higher fair-share factor (less past use for its shares) first
            jobs.sort(key=lambda j: -fairshare.get((j.account, j.user), 1.0))
        if niced and any(map(_NICE, jobs)):  # --nice: its owner's say on the order of their own jobs
            jobs.sort(key=_NICE)
        if level == lowest:  # round-robin by the end of the previous run (never-run jobs first)
            jobs.sort(key=_round_robin_time)
        out.extend([(j, level, rank) for j in jobs])
    return out


class MlfqPolicy:
    name = "mlfq"

    def __init__(self, config: MlfqConfig | None = None) -> None:
        self.config = config or MlfqConfig()

    def decide(self, snapshot: Snapshot) -> Plan:
        return MlfqPass(self.config, snapshot).run()


class MlfqPass:
    """One scheduling pass over a snapshot; all state here is the pass's working copy."""
    # "index": placement and preemption look only at the nodes the indexes in victims.py name;
    # "scan": every node, the reference the differential test compares the indexes with.
    victim_search = "index"

    def __init__(self, cfg: MlfqConfig, snap: Snapshot) -> None:
        self.cfg, self.snap, self.now = cfg, snap, snap.now
        self.nodes: dict[str, NodeView] = {n.name: n for n in snap.nodes}  # free now
        self.future: dict[str, NodeView] = dict(self.nodes)  # free once PREEMPTING runs have left
        # The jobs by state, in one walk over a long job list.
        self.pending, self.running, preempting = [], [], []
        for j in snap.jobs:
            if j.state == _PENDING:
                self.pending.append(j)
            elif j.state == _RUNNING:
                self.running.append(j)
            elif j.state == _PREEMPTING:
                preempting.append(j)
        self._levels: dict[int, int] = {}
        self._lowest = cfg.levels - 1
        self.ranker = Ranker(snap.sizes, cfg.rank_settings) if cfg.order == "gittins" else None
        self.ranks: dict[int, float] = {}  # job id -> Gittins rank (GPU-seconds), where computed
        self._facts: dict[int, tuple] = {}  # job id -> Ranker.running_facts, where computed
        self._notes: dict[float, str] = {}  # rank -> its words in a reason
        self._promoted: set[int] = set()  # pending jobs the starvation guard moved to level 0
        self._lifted: set[int] = set()  # pending jobs that are old (lift_factor)
        # Runs that could ever be preempted, per node, cheapest first: lower levels (larger index),
        # then more service already received. Each as a Candidate: what the victim search asks of
        # a run, computed once instead of once per node and job shape it is looked at for. Card
        # shares are left out: they free no whole card while others share it (shares make room for
        # shares through preempt_best_effort only).
        self.candidates: dict[str, list[Candidate]] = {}
        keyed: dict[str, list[tuple]] = {}  # node -> (sort key, candidate); the key's service read once per run
        idle_first = cfg.prefer_idle_victims
        ranker, facts_of, now = self.ranker, self._facts, self.now
        quantum = self.quantum(0)  # (gittins: the same at every level)
        for j in self.running:
            if j.preemptible and j.run_start is not None and j.gpu_share is None:
                attained = j.attained(now)
                if ranker is None:
                    level = self.level(j)
                    ripe = now - j.run_start >= self.quantum(level)
                else:  # (level() and likely_done(), inlined: this runs for every running job)
                    facts = facts_of[j.id] = ranker.running_facts(j, now)
                    self.ranks[j.id], level = facts[3], facts[4]
                    self._levels[j.id] = level
                    ripe = now - j.run_start >= quantum and not self.likely_done(j) and not self.overdue(j) \
                        and not self.old(j)
                rank, run_gpus = PRIORITY_RANK.get(j.priority, 2), j.gpus
                key = (idle_first and not j.idle, -level, -attained, j.id)
                for node, gpus in j.allocation:
                    keyed.setdefault(node, []).append((key, Candidate(j, level, rank, ripe, len(gpus), run_gpus)))
        for node, lst in keyed.items():
            lst.sort(key=itemgetter(0))
            self.candidates[node] = [c for _, c in lst]
        self.victims: set[int] = set()
        self.node_order = sorted(self.nodes)  # deterministic, whatever the hash seed
        self.reserved: set[str] = set()  # nodes held for a starving job
        self.reserving: set[str | None] = set()  # partitions that already have one
        self.actions: list = []
        self.wake: list[float] = []
        leaving = []  # nodes of PREEMPTING runs: the only ones where the future differs from now
        for j in preempting:
            for node, gpus in j.allocation:
                if node in self.future:
                    release(j, node, gpus, self.future)
                    leaving.append(node)
        self.free_now = FreeIndex(self.nodes, cfg.placement)
        self._no_room_now: set[tuple] = set()  # job shapes place_in found no room for now (see there)
        # ... once the leaving runs have left: shape -> how many rooms had been left then
        self._no_room_future: dict[tuple, int] = {}
        # Room the pass's preemptions left in the future copy beyond what they were made for: per
        # preemption that left any, the most free GPUs it left on a node (a shape of g GPUs per
        # node that found no room finds none until a node is left with g free).
        self._rooms_left: list[float] = []
        self._fit_reads_limit = any(n.free_for is not None or n.reservation is not None for n in snap.nodes)
        # A reservation ahead makes fits() read the job's time limit, which the victim index's
        # shapes leave out: then (and for constrained jobs) the reference scan picks victims.
        self.windows_ahead = any(n.free_for is not None for n in snap.nodes)
        self.free_future = self.free_now.copy_for(self.future, changed=leaving)
        self.victim_index = VictimIndex(self.node_order)
        self.search = SearchContext(self.future, self.candidates, self.reserved, self.victims, self.node_order,
                                    cfg.prefer_idle_victims)

    def changed(self, names, *, now: bool = True) -> None:
        """Nodes whose working copies (or reservations, or victims) the pass just changed;
        now=False: only the future copy."""
        names = list(names)
        if now:
            self.free_now.update_all(names)
        self.free_future.update_all(names)
        self.victim_index.changed(names)

    # ---- levels and order --------------------------------------------------------------
    def level(self, j: JobView) -> int:
        try:
            return self._levels[j.id]
        except KeyError:
            if self.ranker is None:
                level = self.cfg.level_of(j.attained(self.now))
            else:
                facts = self._facts[j.id] = self.ranker.running_facts(j, self.now)
                self.ranks[j.id], level = facts[3], facts[4]
            self._levels[j.id] = level
            return level

    def quantum(self, level: int) -> float:
        """Seconds a run at this level keeps its GPUs before it may be preempted."""
        if self.ranker is None:
            return self.cfg.quanta[level]
        return self.cfg.min_run_restarts * self.cfg.restart_cost

    def likely_done(self, j: JobView) -> bool:
        """Gittins: the run is likely to end within a few restart costs, so preempting it costs more
        than waiting for it."""
        if self.ranker is None or self.cfg.finish_likely >= 1:
            return False
        window = self.cfg.finish_window * self.cfg.restart_cost
        if window <= 0:
            return False
        facts = self._facts.get(j.id)
        if facts is None:
            return self.ranker.finish_within(j, self.now, window) >= self.cfg.finish_likely
        return self.ranker.likely_within(facts[0], facts[1], facts[2], window, self.cfg.finish_likely)

    def overdue(self, j: JobView) -> bool:
        """Gittins: the job has been in the system max_slowdown times its service so far."""
        cfg = self.cfg
        if cfg.max_slowdown <= 0 or self.ranker is None:
            return False
        served = self.ranker.age(j, self.now)
        return self.now - j.submit_time >= cfg.max_slowdown * max(served, cfg.slowdown_floor)

    def lift_at(self, j: JobView) -> float:
        """When the job turns old (lift_factor; inf when off)."""
        cfg = self.cfg
        if cfg.lift_factor <= 0 or self.ranker is None:
            return math.inf
        kind = self.ranker.kind(j)
        return j.submit_time + max(cfg.lift_factor * self.ranker.service_quantile(kind, 0.9), cfg.lift_floor)

    def old(self, j: JobView) -> bool:
        return self.now >= self.lift_at(j)

    def victim_level(self, level: int) -> int:
        """A job of this level may preempt runs of levels above what this returns."""
        return level if self.ranker is None else level + self.cfg.preempt_margin - 1

    def starving(self, j: JobView) -> bool:
        return j.id in self._promoted

    def effective_level(self, j: JobView) -> int:
        """A pending job that starved is served as if it were new."""
        promoted, wake = starvation(self.cfg, j, self.now)
        if promoted:
            self._promoted.add(j.id)
            return 0
        if wake is not None:
            self.wake.append(wake)
        return self.level(j)

    # ---- the pass ----------------------------------------------------------------------
    def queue(self) -> list[tuple[JobView, int, int]]:
        """Pending jobs in service order, each with its (effective) level and class rank."""
        pending, ranks = self.pending, None
        if self.ranker is not None:
            ranks, levels = self._pending_ranks(pending)
            self._levels.update(zip([j.id for j in pending], levels))
            if self.cfg.max_slowdown > 0:
                levels = [0 if self.overdue(j) else lv for j, lv in zip(pending, levels)]
            if self.cfg.lift_factor > 0:
                lift = list(map(self.lift_at, pending))
                now = self.now
                for j, t in zip(pending, lift):
                    if t <= now:
                        self._lifted.add(j.id)
                    else:
                        self.wake.append(t)
                levels = [0 if t <= now else lv for t, lv in zip(lift, levels)]
            if self.cfg.starvation_factor > 0:
                levels = [self.effective_level(j) for j in pending]  # notes promotions and wake times
        elif self.cfg.starvation_factor > 0:
            levels = [self.effective_level(j) for j in pending]  # notes promotions and wake times
        else:
            levels = pending_levels(self.cfg, pending, self.now)
        return service_order(pending, levels, self._lowest, self.snap.fairshare,
                             self.ranks if ranks is not None else None, self._lifted)

    def _pending_ranks(self, pending: list[JobView]) -> tuple[list[float], list[int]]:
        """The pending jobs' Gittins ranks and levels, from the ranker's table of each job kind and
        age bin (a pending job's age is the service of its past runs; most of a long queue has
        none). Ranker.running_facts, inlined: this runs for every pending job."""
        ranker = self.ranker
        memo, row = ranker._memo, ranker._kind_row
        out = []
        for j in pending:
            rate = j.nodes * j.gpus_per_node if j.gpu_share is None else service_rate(j)
            a = j.attained_gpu_seconds
            kind = (rate, j.user, j.name)
            b = bin_of(a / rate) if a > 0 and rate > 0 else 0
            r = memo.get(("row", kind, b))
            out.append(row(kind, b) if r is None else r)
        ranks = [r[0] for r in out]
        self.ranks.update(zip([j.id for j in pending], ranks))
        return ranks, [r[1] for r in out]

    def run(self) -> Plan:
        waiting_ahead: dict[str | None, int] = {}  # partition -> best level of a job left waiting
        # partition -> shapes (level, GPUs per node, nodes, class rank) that found no room; a new
        # one replaces those it is no bigger than in every way (they can match no job it does not).
        failed: dict[str | None, list[tuple[int, int, int, int]]] = {}
        # (partition, shape) of jobs a failed shape covers: most of a long queue, asked in O(1).
        # It stays true, as failed only ever covers more.
        covered: set[tuple] = set()
        now, act = self.now, self.actions.append  # (names read once: this loop runs per pending job)
        for job, level, rank in self.queue():
            if (job.hold or job.dependency is not None or job.begin_time is not None) \
                    and (why := job.ineligible(now)) is not None:
                act(Wait(job.id, why))
                if job.begin_time is not None and job.begin_time > now:
                    self.wake.append(job.begin_time)
                continue
            # A constrained job (-w -x -C --exclusive --reservation) neither uses nor leaves a
            # failed shape: its nodes are not the others' (a reservation's are only its own).
            whole = job.gpu_share is None and not job.constrained
            partition = job.partition
            if whole and partition in failed:
                shape = (partition, level, job.gpus_per_node, job.nodes, rank)
                if shape in covered or any(level >= lv and job.gpus_per_node >= g and job.nodes >= n and rank >= c
                                           for lv, g, n, c in failed[partition]):
                    # A job at least as big and no more important already found no room: so does
                    # this. It was left waiting in this partition, so this one waits for Priority.
                    covered.add(shape)
                    act(Wait(job.id, PRIORITY))
                    continue
            # What the free-GPU and victim indexes serve: whole GPUs in one partition.
            plain = whole and job.nodes >= 1 and (not partition or "," not in partition)
            if self.try_start(job, level, waiting_ahead, plain):
                continue
            if self.wait_for_checkpoint(job, plain):
                waiting_ahead.setdefault(partition, level)
                continue
            if self.try_preempt(job, level, plain) or self.preempt_best_effort(job):
                waiting_ahead.setdefault(partition, level)
                continue
            reason = self._blocked_reason(job, waiting_ahead)
            waiting_ahead.setdefault(job.partition, level)
            if whole:  # a share's room is not a GPU count
                shape = (level, job.gpus_per_node, job.nodes, rank)
                failed[job.partition] = [f for f in failed.get(job.partition, ()) if any(a < b for a, b in zip(f, shape))]
                failed[job.partition].append(shape)
            if job.waited(self.now) >= self.cfg.reservation_after and self.starving(job):
                if job.partition not in self.reserving:
                    # One reservation per partition (as in EASY backfill): it bounds the idle
                    # GPUs a reservation costs, and the first starving job in order gets it.
                    self.reserving.add(job.partition)
                    self.reserve_for(job)
            else:
                self.wake.append(self.now + self.cfg.reservation_after - job.waited(self.now))
            self.actions.append(Wait(job.id, reason))
        self.note_quantum_ends()
        future = [t for t in self.wake if t > self.now]
        return Plan(tuple(self.actions), wake_at=min(future) if future else None)

    def _blocked_reason(self, job: JobView, waiting_ahead: dict) -> str:
        return PRIORITY if job.partition in waiting_ahead else RESOURCES

    def place_in(self, job: JobView, nodes: dict[str, NodeView], free: FreeIndex, plain: bool | None = None):
        """place() on the nodes this job may use (not those reserved for a starving job), looking
        at them in place()'s order through the free-GPU index and stopping at the first that fit.
        plain: the job asks whole GPUs in one partition and is not constrained (the caller knows)."""
        if plain is None:
            plain = job.gpu_share is None and len(job.partitions) <= 1 and job.nodes >= 1 and not job.constrained
        if self.victim_search == "scan" or not plain:  # -w, -x, --exclusive: the free-GPU index knows none of them
            # The reference, card shares (their room is not a free-GPU count) and jobs that may use
            # several partitions (place() tries them one by one): every node that is not reserved.
            return place(job, nodes, self.cfg.placement, only=[n for n in nodes if n not in self.reserved],
                         pack=self.cfg.gpu_pack)
        # A shape (what fits() reads of the job) that found no room finds none again while the
        # working copy has gained none: the copy of now never does in a pass (starts and claims
        # only take room), the future one only when a preemption leaves GPUs free (_rooms_left).
        key = (job.gpus_per_node, job.nodes, job.partition, job.cpus_per_node, job.mem_mb, job.runtime,
               job.time_limit if self._fit_reads_limit else None)
        if free is self.free_now:
            if key in self._no_room_now:
                return None
        else:
            seen = self._no_room_future.get(key)
            if seen is not None and (seen == len(self._rooms_left)
                                     or max(self._rooms_left[seen:]) < job.gpus_per_node):
                return None
        chosen = free.first_fitting(job, self.reserved)
        if chosen is None:
            if free is self.free_now:
                self._no_room_now.add(key)
            elif job.gpus_per_node > 0:  # (room for CPU-only jobs is not counted in GPUs)
                self._no_room_future[key] = len(self._rooms_left)
            return None
        return placement_on(job, chosen)

    def try_start(self, job: JobView, level: int, waiting_ahead: dict, plain: bool | None = None) -> bool:
        placement = self.place_in(job, self.nodes, self.free_now, plain)
        if placement is None:
            return False
        if not (job.preemptible and job.resumable) and job.partition in waiting_ahead \
                and waiting_ahead[job.partition] < level:
            # A job time-slicing can never preempt must not take GPUs a higher-level job waits for.
            self.actions.append(Wait(job.id, PRIORITY))
            return True
        # Where no run is leaving, the future copy is the very view of now: reserve once, share it.
        shared = all(self.future[name] is self.nodes[name] for name in placement.nodes)
        reserve(job, placement, self.nodes)
        if shared:
            for name in placement.nodes:
                self.future[name] = self.nodes[name]
        else:
            reserve(job, placement, self.future)
        self.changed(placement.nodes)
        self.actions.append(Start(job.id, placement, f"level {level}{self._rank_note(job)}, first in order that fits"))
        return True

    def wait_for_checkpoint(self, job: JobView, plain: bool | None = None) -> bool:
        """Room will be there once the runs already told to leave have left: wait, and claim it."""
        placement = self.place_in(job, self.future, self.free_future, plain)
        if placement is None:
            return False
        self.claim(job, placement)
        self.actions.append(Wait(job.id, WAITING_FOR_CHECKPOINT))
        return True

    def claim(self, job: JobView, placement) -> None:
        reserve(job, placement, self.future)
        # What is free now on those nodes is kept for this job too (GPUs still busy now, a
        # victim's, need no new copy).
        nodes = self.nodes
        for name, gpus in zip(placement.nodes, placement.gpus):
            n = nodes[name]
            if not n.used_gpus.issuperset(gpus):
                nodes[name] = with_usage(n, n.used_gpus.union(gpus), n.used_cpus, n.used_mem_mb)
        self.changed(placement.nodes)

    # ---- preemption --------------------------------------------------------------------
    def preemptions_spent(self) -> bool:
        """The pass told as many runs to leave as one pass may (max_preemptions)."""
        return 0 < self.cfg.max_preemptions <= len(self.victims)

    def try_preempt(self, job: JobView, level: int, plain: bool | None = None) -> bool:
        if self.preemptions_spent():
            return False
        rank = PRIORITY_RANK.get(job.priority, 2)
        above = self.victim_level(level)
        constrained = job.constrained if plain is None else not plain and job.constrained
        if self.victim_search == "scan" or self.cfg.prefer_idle_victims or constrained or self.windows_ahead:
            picked = scan_options(self.search, job, above, rank)
        else:
            picked = self.victim_index.options(self.search, job, above, rank)
        if picked is None:
            return False
        # (one node's victims are distinct runs; a gang's options may share a gang victim)
        victims = picked[0][3] if len(picked) == 1 else list({v.id: v for o in picked for v in o[3]}.values())
        if not victims:
            return False  # room without preempting anyone would have been found earlier
        # Tentatively free the victims on the picked nodes and place the job there.
        trial = {o[2]: self.future[o[2]] for o in picked}
        for v in victims:
            for node, gpus in v.allocation:
                if node in trial:
                    release(v, node, gpus, trial)
        if plain and len(trial) == 1 == job.nodes:  # (place_on_each for one node: no -w, no -C)
            node = next(iter(trial.values()))
            placement = placement_on(job, [node]) if len(node.free_gpus) >= job.gpus_per_node and fits(job, node) \
                else None
        elif plain or job.gpu_share is None and len(job.partitions) <= 1:
            placement = place_on_each(job, list(trial.values()))  # one node per rank was picked
        else:
            placement = place(job, trial, self.cfg.placement)
        if placement is None:
            return False  # CPUs or memory still short
        future = self.future
        future.update(trial)  # the picked nodes, their victims released
        freed = list(trial)
        why = f"{'urgent job' if rank == 0 else f'level {level} job'} {job.id}{self._rank_note(job)}"
        for v in victims:
            for node, gpus in v.allocation:  # a gang victim frees its other nodes too
                if node in future and node not in trial:
                    release(v, node, gpus, future)
                    freed.append(node)
            self.victims.add(v.id)
            self.actions.append(Preempt(v.id, f"level {self.level(v)} run past its quantum; GPUs go to {why}",
                                        for_job=job.id))
        self.victim_index.took(victims)
        self.changed(freed, now=False)
        self.claim(job, placement)
        left = max(len(future[name].free_gpus) for name in freed)
        if left:
            self._rooms_left.append(left)  # the victims left room beyond this job's
        self.actions.append(Wait(job.id, WAITING_FOR_CHECKPOINT))
        return True

    def preempt_best_effort(self, job: JobView) -> bool:
        """A guaranteed sharing job takes its share from best-effort sharing runs on a card, at
        once, whatever their level (they only ever use idle compute)."""
        if job.gpu_share is None or job.gpu_share.qos != "guaranteed" or self.preemptions_spent():
            return False
        for name in self.node_order:
            node = self.future[name]
            if name in self.reserved or not node.schedulable or not fits(job, node, ignore_usage=True):
                continue
            room = best_effort_room(job, node, self.running, self.victims)
            if room is None:
                continue
            card, victims = room
            trial = {name: node}
            for v in victims:
                release(v, name, (card,), trial)
            placement = place(job, trial, self.cfg.placement, pack=self.cfg.gpu_pack)
            if placement is None:
                continue
            for v in victims:
                release(v, name, (card,), self.future)
                self.victims.add(v.id)
                self.actions.append(Preempt(v.id, f"best-effort share of {name} GPU {card} goes to guaranteed "
                                                  f"job {job.id}", for_job=job.id))
            self.changed([name], now=False)
            self.claim(job, placement)
            self._rooms_left.append(math.inf)  # (a card may be left free)
            self.actions.append(Wait(job.id, WAITING_FOR_CHECKPOINT))
            return True
        return False

    def reserve_for(self, job: JobView) -> None:
        """Hold the nodes where this starving job gets room soonest: the most GPUs that are free or
        held by runs below level 0 (which it, promoted to level 0, preempts once their quantum ends)."""
        below: dict[str, int] = {}
        for v in self.running:
            if v.preemptible and v.resumable and self.level(v) > 0:
                for node, gpus in v.allocation:
                    below[node] = below.get(node, 0) + len(gpus)
        pool = [n for n in self.future.values() if n.name not in self.reserved and n.schedulable
                and fits(job, n, ignore_usage=True)]
        pool.sort(key=lambda n: (-(len(n.free_gpus) + below.get(n.name, 0)), n.name))
        for n in pool[:job.nodes]:
            self.reserved.add(n.name)
        self.changed(n.name for n in pool[:job.nodes])

    def _rank_note(self, job: JobView) -> str:
        r = self.ranks.get(job.id)
        if r is None:
            return ""
        note = self._notes.get(r)  # (ranks repeat: one per job kind and age bin)
        if note is None:
            note = self._notes[r] = f" (Gittins rank {r / 3600:.3g} GPU-h)"
        return note

    def note_quantum_ends(self) -> None:
        """When a running job's quantum ends or it sinks a level, the plan may change."""
        if self.ranker is not None:
            ranker, now, wake, facts_of = self.ranker, self.now, self.wake.append, self._facts
            quantum = self.quantum(0)  # the same at every level
            for j in self.running:
                if j.run_start is None or j.gpu_rate == 0:
                    continue
                end = j.run_start + quantum
                if end > now:
                    wake(end)
                facts = facts_of.get(j.id) or ranker.running_facts(j, now)
                change = ranker.next_change_of(facts[0], facts[1], facts[2], now, j.gpu_rate)
                if change is not None:
                    wake(change)
            return
        for j in self.running:
            if j.run_start is None or j.gpu_rate == 0:
                continue
            level = self.level(j)
            end = j.run_start + self.cfg.quanta[level]
            if end > self.now:
                self.wake.append(end)
            if level < len(self.cfg.thresholds):
                self.wake.append(self.now + (self.cfg.thresholds[level] - j.attained(self.now)) / j.gpu_rate)
