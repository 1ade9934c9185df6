"""The virtual clock: replay jobs through one policy's decide() and record what happened.

Events are arrivals, completions and the policy's own Plan.wake_at. At each distinct event time
the simulator builds one Snapshot (PENDING jobs waiting, RUNNING jobs holding GPUs) and calls
decide() once, then applies the plan: Preempts first (the run stops at once, its GPUs are free,
the job is PENDING again), then Starts, each checked against the simulator's own free-GPU map (a
double-booked GPU is a policy bug and fails loudly). Preemption is instantaneous here, while in
production the victim is PREEMPTING until its checkpoint is written, so policies answer a
preemption with Wait("WaitingForCheckpoint"); the simulator therefore decides again at the same
instant after any plan that preempted, which is the controller's next tick with a zero-length
checkpoint. With no job pending there is nothing to decide and decide() is not called; a wake_at
that is not in the future is ignored (a policy stuck on it would otherwise never let time move).

Restart cost: a preempted job resumes from its checkpoint but first redoes `restart_cost +
restart_cost_per_gpu x GPUs` seconds on all its GPUs; being preempted again during that redo starts
it over. Lost GPU-seconds are exactly the GPU-seconds spent redoing (busy minus useful).

Each job's true total duration is in JobView.time_limit (what SJF and backfill use as their
oracle); the restart redo is not included. Snapshots reuse the frozen views of jobs and nodes
that did not change, so a decision costs the policy's time plus O(jobs in the queue).
"""
from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

from ..core.model import JobView, NodeView, Snapshot
from ..core.reservation import Reservation
from ..core.resources import placement_misfit
from ..core.sharing import GpuShare
from ..core.sizemodel import FinishedJob, SizeModel, observe
from ..core.states import JobState
from ..scheduling.plan import Plan, Policy, Preempt, Start, Wait
from .cluster import Cluster
from .traces import TraceJob

PENDING, RUNNING, COMPLETED = JobState.PENDING, JobState.RUNNING, JobState.COMPLETED


class PolicyError(RuntimeError):
    """The policy returned a plan that cannot be applied (a bug in the policy)."""


class SimulationError(RuntimeError):
    """The replay cannot finish (a policy left jobs pending with nothing left to happen)."""


@dataclass(frozen=True)
class JobRecord:
    id: int
    trace_id: str
    submit: float
    duration: float
    gpus: int  # asked for
    gpus_alloc: int  # held (nodes x GPUs per node)
    first_start: float
    end: float
    preemptions: int
    busy_gpu_s: float
    lost_gpu_s: float

    @property
    def jct(self) -> float:
        return self.end - self.submit

    @property
    def queue_delay(self) -> float:
        return self.first_start - self.submit


@dataclass
class SimResult:
    policy: str
    cluster: Cluster
    restart_cost: float
    restart_cost_per_gpu: float
    records: list[JobRecord]
    timeline: list[tuple[float, int]]  # (time, busy GPUs) at every change
    events: int = 0
    decisions: int = 0
    wall_s: float = 0.0
    policy_s: float = 0.0  # of wall_s, inside decide()
    extra: dict = field(default_factory=dict)

    @property
    def preemptions(self) -> int:
        return sum(r.preemptions for r in self.records)


class _Job:
    __slots__ = ("id", "trace", "nodes", "gpn", "gpus", "remaining", "overhead", "state", "run_start",
                 "attained", "pending_since", "last_run_end", "restarts", "first_start", "token",
                 "busy", "lost", "alloc", "time_limit", "share")

    def __init__(self, id: int, trace: TraceJob, nodes: int, gpn: int):
        self.id, self.trace, self.nodes, self.gpn, self.gpus = id, trace, nodes, gpn, nodes * gpn
        # A share of one card (a fractional job on a sharing cluster): charged its fraction.
        self.share = GpuShare(fraction=trace.gpus) if gpn == 0 and 0 < trace.gpus < 1 else None
        if self.share is not None:
            self.gpus = trace.gpus
        self.remaining, self.overhead = trace.duration, 0.0
        self.state, self.run_start, self.attained = None, None, 0.0
        self.pending_since, self.last_run_end, self.restarts, self.first_start = None, None, 0, None
        self.token, self.busy, self.lost, self.alloc = 0, 0.0, 0.0, ()
        self.time_limit = math.ceil(trace.duration)

    def view(self) -> JobView:
        running = self.state == RUNNING
        return JobView(
            id=self.id, user=self.trace.user, state=self.state, submit_time=self.trace.submit,
            nodes=self.nodes, gpus_per_node=self.gpn, priority=self.trace.priority,
            restart_count=self.restarts, attained_gpu_seconds=self.attained,
            run_start=self.run_start if running else None,
            nodelist=tuple(n for n, _ in self.alloc) if running else (),
            allocation=self.alloc if running else (),
            pending_since=self.pending_since, last_run_end=self.last_run_end, time_limit=self.time_limit,
            gpu_share=self.share, gpu_charge=self.gpus if self.share is not None else 0.0, name=self.trace.name)

    def account(self, elapsed: float) -> None:
        """Book a run's first `elapsed` seconds: the restart redo first, then real progress."""
        redo = min(elapsed, self.overhead)
        self.overhead -= redo
        self.remaining = max(0.0, self.remaining - (elapsed - redo))
        self.lost += redo * self.gpus
        self.busy += elapsed * self.gpus
        self.attained += elapsed * self.gpus


def simulate(policy: Policy, jobs: Sequence[TraceJob], cluster: Cluster, *, restart_cost: float = 30.0,
             restart_cost_per_gpu: float = 0.0, progress: Callable[[int, int], None] | None = None,
             max_rounds: int = 1000, reservations: Sequence[Reservation] = (),
             known_sizes: bool = False) -> SimResult:
    """Replay `jobs` (in submit order, all fitting the cluster) through `policy`; `reservations`
    (times on the trace's clock) hold their nodes in their windows, as in the controller.

    known_sizes: the size model (Snapshot.sizes) is the trace's own distribution of job sizes from
    the first decision on, and learns nothing during the replay: what an order that reads the
    distribution (mlfq's Gittins order) could do knowing it exactly, still without any job's own
    duration. A bound to measure against, not a way to run a cluster."""
    engine = _Engine(policy, jobs, cluster, restart_cost, restart_cost_per_gpu, progress, max_rounds)
    engine.reservations = tuple(reservations)
    if known_sizes:
        engine.sizes, engine.learn = engine.trace_sizes(), False
    return engine.run()


def size_fact(tj: TraceJob, gpus: float, service_s: float) -> FinishedJob:
    """What the size model learns of one ended trace job on `gpus` (a trace's placeholder user is
    no user)."""
    return FinishedJob(gpus, service_s, tj.user if tj.user != "user" else "", tj.name)


class _Engine:
    def __init__(self, policy, jobs, cluster, restart_cost, per_gpu, progress, max_rounds):
        if restart_cost < 0 or per_gpu < 0:
            raise ValueError("restart costs must not be negative")
        self.policy, self.cluster, self.progress, self.max_rounds = policy, cluster, progress, max_rounds
        self.reservations: tuple[Reservation, ...] = ()
        self.restart_cost, self.per_gpu = float(restart_cost), float(per_gpu)
        self.jobs: list[_Job] = []
        for i, tj in enumerate(sorted(jobs, key=lambda j: j.submit)):
            if not cluster.can_run(tj.gpus):
                raise ValueError(f"job {tj.id} asks for {tj.gpus} GPUs, more than the {cluster} cluster has")
            self.jobs.append(_Job(i + 1, tj, *cluster.shape(tj.gpus)))
        self.node_views = cluster.node_views()
        self.node_index = {n.name: i for i, n in enumerate(self.node_views)}
        self.all_gpus = frozenset(range(cluster.gpus_per_node))
        self.free = [set(self.all_gpus) for _ in self.node_views]
        self.shared: list[dict[int, list[int]]] = [{} for _ in self.node_views]  # card -> [MiB, compute %, jobs]
        self.ranks = [0] * len(self.node_views)
        self.dirty: set[int] = set()
        self.views: dict[int, JobView] = {}  # the snapshot's jobs: pending and running
        self.n_pending = 0
        self.heap: list[tuple[float, int, int, int]] = []  # (end, seq, job id, run token)
        self.seq = 0
        self.busy = 0
        self.timeline: list[tuple[float, int]] = []
        self.records: list[JobRecord] = []
        self.events = self.decisions = 0
        self.policy_s = 0.0
        # Learned from the jobs that ended, in the order they ended, from nothing: as the controller
        # feeds it (core.sizemodel); or known from the start (simulate's known_sizes).
        self.sizes = SizeModel()
        self.learn = True

    def trace_sizes(self) -> SizeModel:
        """The size model of every job of the trace (its true duration), none forgotten (no decay)."""
        facts = [size_fact(j.trace, j.gpus, j.trace.duration) for j in self.jobs]
        return observe(SizeModel(memory=1e6 * max(1, len(facts))), facts)

    # ---- the loop --------------------------------------------------------------------
    def run(self) -> SimResult:
        t0 = time.perf_counter()
        jobs, heap, n = self.jobs, self.heap, len(self.jobs)
        ai, wake, total = 0, None, len(self.jobs)
        while True:
            while heap and self._stale(heap[0]):
                heapq.heappop(heap)
            t = jobs[ai].trace.submit if ai < n else math.inf
            if heap and heap[0][0] < t:
                t = heap[0][0]
            if wake is not None and wake < t:
                t = wake
            if t == math.inf:
                break
            if wake is not None and wake <= t:
                wake = None
                self.events += 1
            while heap and heap[0][0] <= t:
                entry = heapq.heappop(heap)
                if not self._stale(entry):
                    self._complete(jobs[entry[2] - 1], t)
                    self.events += 1
            while ai < n and jobs[ai].trace.submit <= t:
                self._arrive(jobs[ai], t)
                ai += 1
                self.events += 1
            wake = self._decide(t)
            if not self.timeline or self.timeline[-1][1] != self.busy:
                self.timeline.append((t, self.busy))
            if self.progress is not None and (len(self.records) % 200 == 0 or len(self.records) == total):
                self.progress(len(self.records), total)
        if self.n_pending:
            raise SimulationError(f"policy {self.policy.name!r} left {self.n_pending} job(s) pending with nothing "
                                  f"running, nothing arriving and no wake-up (at t={self.timeline[-1][0]:g})")
        if self.progress is not None:
            self.progress(total, total)
        return SimResult(self.policy.name, self.cluster, self.restart_cost, self.per_gpu,
                         sorted(self.records, key=lambda r: r.id), self.timeline, self.events,
                         self.decisions, time.perf_counter() - t0, self.policy_s)

    def _stale(self, entry) -> bool:
        job = self.jobs[entry[2] - 1]
        return job.token != entry[3] or job.state != RUNNING

    def _decide(self, t: float) -> float | None:
        for _ in range(self.max_rounds):
            if not self.n_pending:
                return None
            for idx in tuple(self.dirty):
                self._node_now(idx)
            snap = Snapshot(now=t, jobs=tuple(self.views.values()), nodes=tuple(self.node_views),
                            reservations=self.reservations, sizes=self.sizes)
            started = time.perf_counter()
            plan = self.policy.decide(snap)
            self.policy_s += time.perf_counter() - started
            self.decisions += 1
            if not self._apply(plan, t):
                return plan.wake_at if plan.wake_at is not None and plan.wake_at > t else None
        raise SimulationError(f"policy {self.policy.name!r} preempted in each of {self.max_rounds} decisions "
                              f"at t={t:g}: a preemption loop")

    # ---- applying a plan ---------------------------------------------------------------
    def _apply(self, plan: Plan, t: float) -> bool:
        """Apply the plan; True if it preempted anything (then the caller decides again)."""
        starts, preempts = [], []
        for a in plan.actions:  # most actions are Waits: the fast path skips them
            cls = a.__class__
            if cls is Wait:
                continue
            if cls is Start or isinstance(a, Start):
                starts.append(a)
            elif cls is Preempt or isinstance(a, Preempt):
                preempts.append(a)
            elif not isinstance(a, Wait):
                self._fail(t, f"returned an unknown action {a!r}")
        acted = [a.job_id for a in starts] + [a.job_id for a in preempts]
        if len(set(acted)) != len(acted):
            twice = next(i for i in acted if acted.count(i) > 1)
            self._fail(t, f"gives job {twice} two actions in one plan")
        for a in preempts:
            job = self._job(a.job_id, t)
            if job.state != RUNNING:
                self._fail(t, f"preempts job {job.id}, which is {job.state.value}")
            self._preempt(job, t)
        for a in starts:
            job = self._job(a.job_id, t)
            if job.state != PENDING:  # (a job preempted by this plan has no other action in it)
                self._fail(t, f"starts job {job.id}, which is {job.state.value if job.state else 'not submitted yet'}")
            self._start(job, t, self._check_placement(job, a, t))
        return bool(preempts)

    def _check_placement(self, job: _Job, a: Start, t: float) -> tuple:
        """The placement checked as the controller's applier checks it (core.resources)."""
        p, views = a.placement, {}
        for name in p.nodes:
            idx = self.node_index.get(name)
            if idx is None:
                self._fail(t, f"places job {job.id} on unknown node {name!r}")
            views[name] = self._node_now(idx)
        if why := placement_misfit(self.views[job.id], p, views):
            self._fail(t, f"cannot start job {job.id} as placed: {why}")
        return tuple((name, tuple(gpus)) for name, gpus in zip(p.nodes, p.gpus))

    def _node_now(self, idx: int) -> NodeView:
        if idx in self.dirty:
            self.node_views[idx] = replace(self.node_views[idx], used_gpus=self.all_gpus - self.free[idx],
                                           used_cpus=self.ranks[idx],
                                           shared=tuple((c, *u) for c, u in sorted(self.shared[idx].items())))
            self.dirty.discard(idx)
        return self.node_views[idx]

    def _fail(self, t: float, what: str):
        raise PolicyError(f"policy {self.policy.name!r} at t={t:g} {what}")

    def _job(self, job_id: int, t: float) -> _Job:
        if not isinstance(job_id, int) or not 1 <= job_id <= len(self.jobs):
            self._fail(t, f"names unknown job {job_id!r}")
        return self.jobs[job_id - 1]

    # ---- job transitions ---------------------------------------------------------------
    def _arrive(self, job: _Job, t: float) -> None:
        job.state, job.pending_since = PENDING, t
        self.views[job.id] = job.view()
        self.n_pending += 1

    def _start(self, job: _Job, t: float, alloc: tuple) -> None:
        for name, gpus in alloc:
            idx = self.node_index[name]
            self.free[idx].difference_update(gpus)
            if job.share is not None:
                u = self.shared[idx].setdefault(gpus[0], [0, 0, 0])
                u[0] += job.share.mem_on(self.node_views[idx].gpus[gpus[0]])
                u[1] += job.share.reserved_compute
                u[2] += 1
            self.ranks[idx] += 1
            self.dirty.add(idx)
        job.state, job.run_start, job.alloc = RUNNING, t, alloc
        if job.first_start is None:
            job.first_start = t
        job.token += 1
        heapq.heappush(self.heap, (t + job.overhead + job.remaining, self.seq, job.id, job.token))
        self.seq += 1
        self.busy += job.gpus
        self.n_pending -= 1
        self.views[job.id] = job.view()

    def _stop(self, job: _Job, t: float) -> None:
        job.account(t - job.run_start)
        for name, gpus in job.alloc:
            idx = self.node_index[name]
            if job.share is not None:
                u = self.shared[idx][gpus[0]]
                u[0] -= job.share.mem_on(self.node_views[idx].gpus[gpus[0]])
                u[1] -= job.share.reserved_compute
                u[2] -= 1
                if u[2] == 0:
                    del self.shared[idx][gpus[0]]
                    self.free[idx].add(gpus[0])
            else:
                self.free[idx].update(gpus)
            self.ranks[idx] -= 1
            self.dirty.add(idx)
        job.token += 1
        job.alloc, job.run_start = (), None
        self.busy -= job.gpus

    def _preempt(self, job: _Job, t: float) -> None:
        self._stop(job, t)
        job.overhead = self.restart_cost + self.per_gpu * job.gpus  # a fresh redo, whatever was left
        job.restarts += 1
        job.state, job.pending_since, job.last_run_end = PENDING, t, t
        self.n_pending += 1
        self.views[job.id] = job.view()

    def _complete(self, job: _Job, t: float) -> None:
        self._stop(job, t)
        job.remaining = 0.0
        job.state = COMPLETED
        del self.views[job.id]
        tj = job.trace
        if self.learn:
            self.sizes = observe(self.sizes, [size_fact(tj, job.gpus, job.attained / job.gpus if job.gpus else 0.0)])
        self.records.append(JobRecord(job.id, tj.id, tj.submit, tj.duration, tj.gpus, job.gpus, job.first_start,
                                      t, job.restarts, job.busy, job.lost))
