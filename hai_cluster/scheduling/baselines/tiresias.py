"""Tiresias' discretized 2D-LAS (NSDI'19): queues by attained GPU-seconds, FIFO inside a queue.

A job's queue is how much GPU time it has received (GPUs x seconds, the current run included):
below thresholds[0] it is in queue 0, and so on. Queues are served in order, jobs within a queue
by submit time; a job that does not fit is skipped (the next one may start), as in Tiresias.
A running job is preempted only for a job of a *strictly* higher queue (lower number), never for
one of its own queue (Tiresias' own simulator does the same: same-queue swaps cost restarts and
gain nothing). Victims are taken lowest priority first (highest queue, newest), then pruned to
the ones actually needed. The freed GPUs are not started on in the same plan: in production the
victims stay PREEMPTING until their checkpoint is written, so the job waits
(`WaitingForCheckpoint`) and starts on the next decision; jobs already PREEMPTING count as free-able.

No starvation guard (the paper's promotion knob is off by default there too); `thresholds` is the
one knob. wake_at is the next time a running job crosses into a queue below a waiting job's.
"""
from __future__ import annotations

import bisect
import math
from typing import Sequence

from ...core.model import JobView, Snapshot
from ...core.reasons import RESOURCES, WAITING_FOR_CHECKPOINT
from ...core.states import JobState
from ..placement import place
from ..plan import Plan, Preempt, Start, Wait
from .workspace import Workspace, release, shape

EPS = 1e-6  # GPU-seconds: a job woken exactly at its threshold crossing counts as crossed


class TiresiasPolicy:
    name = "tiresias"

    def __init__(self, thresholds: Sequence[float] = (3600.0, 36000.0)):
        self.thresholds = tuple(float(t) for t in thresholds)
        if any(t <= 0 for t in self.thresholds) or list(self.thresholds) != sorted(set(self.thresholds)):
            raise ValueError(f"tiresias thresholds must be positive and increasing: {list(thresholds)}")

    def level(self, attained: float) -> int:
        return bisect.bisect_right(self.thresholds, attained + EPS)

    def decide(self, snapshot: Snapshot) -> Plan:
        now = snapshot.now
        ws = Workspace(snapshot.nodes)
        running, pending = [], []
        for j in snapshot.jobs:
            if j.state.holds_resources:
                running.append(j)
            elif j.state == JobState.PENDING:
                pending.append(j)
        lvl = {j.id: self.level(j.attained(now)) for j in running}
        lvl.update((j.id, self.level(j.attained_gpu_seconds)) for j in pending)
        pending.sort(key=lambda j: (lvl[j.id], j.submit_time, j.id))
        # Victims, least deserving first; PREEMPTING ones are already leaving (free to count on).
        pool = sorted((j for j in running if j.state == JobState.PREEMPTING or (j.preemptible and j.resumable)),
                      key=lambda j: (j.state != JobState.PREEMPTING, -lvl[j.id], -j.submit_time, -j.id))
        taken: set[int] = set()
        hopeless: set[tuple] = set()  # (shape, queue) that fails even with every victim gone
        actions = []
        started: list[JobView] = []
        started_ids: set[int] = set()
        waiting_for_ckpt: set[int] = set()
        for job in pending:
            level = lvl[job.id]
            if (why := job.ineligible(now)) is not None:
                actions.append(Wait(job.id, why))
                continue
            placement = ws.place(job)
            if placement is not None:
                ws.take(job, placement)
                started.append(job)
                started_ids.add(job.id)
                actions.append(Start(job.id, placement, f"2D-LAS queue {level}: first that fits"))
                continue
            victims = None if (shape(job), level) in hopeless else self._victims(job, level, pool, taken, lvl, ws)
            if victims is None:
                hopeless.add((shape(job), level))
                actions.append(Wait(job.id, RESOURCES))
                continue
            victims, target = victims
            taken.update(v.id for v in victims)
            ws.lock(set(target) | {n for v in victims for n in v.nodelist})
            for v in victims:
                if v.state != JobState.PREEMPTING:
                    actions.append(Preempt(v.id, f"2D-LAS: queue {lvl[v.id]} yields to job {job.id} of queue {level}",
                                           for_job=job.id))
            waiting_for_ckpt.add(job.id)
            actions.append(Wait(job.id, WAITING_FOR_CHECKPOINT))
        placed = started_ids | waiting_for_ckpt
        waiting = [lvl[j.id] for j in pending if not j.hold and j.id not in placed]
        return Plan(tuple(actions), wake_at=self._next_crossing(now, running, started, taken, lvl, waiting))

    def _victims(self, job: JobView, level: int, pool: list[JobView], taken: set[int], lvl: dict[int, int],
                 ws: Workspace):
        """The fewest lowest-priority running jobs whose GPUs make `job` fit, and where it would go."""
        cands = [v for v in pool if v.id not in taken and (v.state == JobState.PREEMPTING or lvl[v.id] > level)
                 and all(n in ws.nodes for n in v.nodelist)]
        if not cands:
            return None
        chosen: list[JobView] = []
        target = None
        for v in cands:
            chosen.append(v)
            target = _fits_without(job, chosen, ws)
            if target is not None:
                break
        if target is None:
            return None
        # Prune: keep the most deserving victims running when the others suffice.
        for v in reversed(chosen[:-1]):
            rest = [c for c in chosen if c is not v]
            alt = _fits_without(job, rest, ws)
            if alt is not None:
                chosen, target = rest, alt
        return chosen, target

    def _next_crossing(self, now, running, started, taken, lvl, waiting) -> float | None:
        if not waiting:
            return None
        best = min(waiting)
        wake = math.inf
        for j in list(running) + started:
            level = lvl[j.id]
            if j.id in taken or level >= len(self.thresholds) or best >= level + 1 or j.gpus <= 0:
                continue  # crossing would not let any waiting job preempt it
            at = now + (self.thresholds[level] - j.attained(now)) / j.gpus
            if at > now:
                wake = min(wake, at)
        return wake if wake < math.inf else None


def _fits_without(job: JobView, victims: list[JobView], ws: Workspace):
    nodes = dict(ws.nodes)
    for v in victims:
        release(nodes, v)
    placement = place(job, nodes)
    return placement.nodes if placement is not None else None
