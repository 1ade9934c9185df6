"""Slurm-style EASY backfill, with each job's time limit as its runtime estimate.

Jobs go in priority-then-FIFO order. The first one that does not fit (the head) gets a
reservation: the earliest time (the "shadow time") at which enough running jobs will have
reached their time limits for it to fit, and the nodes it would get then. A later job may jump
ahead only if it fits now and either ends by the shadow time or leaves the head's reserved GPUs
alone, so the head's start is never delayed. The simulator passes true durations as time limits,
so the estimates are exact there; with unknown limits (None) no reservation can be made and
nothing is backfilled, which degrades to FIFO rather than starving the head.
"""
from __future__ import annotations

import math

from ...core.model import PRIORITY_RANK, JobView, Placement, Snapshot
from ...core.reasons import PRIORITY, RESOURCES
from ...core.states import JobState
from ..placement import place
from ..plan import Plan, Start, Wait
from .workspace import Workspace, release, shape


class BackfillPolicy:
    name = "backfill"

    def decide(self, snapshot: Snapshot) -> Plan:
        now = snapshot.now
        ws = Workspace(snapshot.nodes)
        pending = sorted((j for j in snapshot.jobs if j.state == JobState.PENDING),
                         key=lambda j: (PRIORITY_RANK.get(j.priority, 2), not j.interactive, j.submit_time, j.id))
        started: list[tuple[JobView, Placement]] = []
        actions = []
        head: JobView | None = None
        shadow: float | None = None
        spare: dict[str, int] = {}
        no_room: set[tuple] = set()  # shapes that found no spare room (it only shrinks)
        for job in pending:
            if (why := job.ineligible(now)) is not None:
                actions.append(Wait(job.id, why))
                continue
            if head is None:
                placement = ws.place(job)
                if placement is not None:
                    ws.take(job, placement)
                    started.append((job, placement))
                    actions.append(Start(job.id, placement, "first in priority order that fits"))
                    continue
                head = job
                shadow, spare = reservation(snapshot, ws, job, started)
                actions.append(Wait(job.id, RESOURCES))
                continue
            if shadow is None or not ws.total:
                actions.append(Wait(job.id, PRIORITY))
                continue
            end = now + job.time_limit if job.time_limit is not None else math.inf
            if end <= shadow:
                placement, why = ws.place(job), f"backfilled: ends before job {head.id}'s reservation"
            elif shape(job) in no_room:
                placement = None
            else:
                placement, why = _place_in_spare(job, ws, spare), f"backfilled beside job {head.id}'s reservation"
                if placement is None:
                    no_room.add(shape(job))
            if placement is None:
                actions.append(Wait(job.id, PRIORITY))
                continue
            ws.take(job, placement)
            if end > shadow:
                for name in placement.nodes:
                    spare[name] -= job.gpus_per_node
            actions.append(Start(job.id, placement, why))
        return Plan(tuple(actions))


def reservation(snapshot: Snapshot, ws: Workspace, head: JobView,
                started: list[tuple[JobView, Placement]]) -> tuple[float | None, dict[str, int]]:
    """(shadow time, GPUs per node that jobs running past it may still use), or (None, {})."""
    now = snapshot.now
    ends: list[tuple[float, JobView, tuple[str, ...] | None]] = []
    for j in snapshot.jobs:
        if j.state.holds_resources:
            end = j.run_start + j.time_limit if j.run_start is not None and j.time_limit is not None else math.inf
            ends.append((max(end, now), j, None))  # None: free its own allocation
    for j, p in started:
        ends.append((now + j.time_limit if j.time_limit is not None else math.inf, j, p.nodes))
    ends.sort(key=lambda e: e[0])
    future = dict(ws.nodes)
    i = 0
    while i < len(ends) and ends[i][0] < math.inf:
        t = ends[i][0]
        while i < len(ends) and ends[i][0] == t:
            release(future, ends[i][1], ends[i][2])
            i += 1
        placement = place(head, future)
        if placement is not None:
            spare = {name: (len(n.free_gpus) if n.schedulable else 0) for name, n in future.items()}
            for name in placement.nodes:
                spare[name] -= head.gpus_per_node
            return t, spare
    return None, {}


def _place_in_spare(job: JobView, ws: Workspace, spare: dict[str, int]) -> Placement | None:
    allowed = {name: n for name, n in ws.nodes.items() if spare.get(name, 0) >= job.gpus_per_node}
    if sum(1 for name in allowed if ws.free[name] >= job.gpus_per_node) < job.nodes:
        return None
    return place(job, allowed)
