"""Shortest job first with oracle durations: a clairvoyant, non-preemptive reference.

The simulator puts each job's true duration in `time_limit`; jobs without one go last. Every job
that fits starts, shortest first (work-conserving: a job that does not fit is skipped, not a
barrier), so SJF is the mean-JCT bound a non-preemptive scheduler can reach with perfect knowledge.
"""
from __future__ import annotations

import math

from ...core.model import Snapshot
from ...core.reasons import RESOURCES
from ...core.states import JobState
from ..plan import Plan, Start, Wait
from .workspace import Workspace


class SjfPolicy:
    name = "sjf"

    def decide(self, snapshot: Snapshot) -> Plan:
        ws = Workspace(snapshot.nodes)
        pending = sorted((j for j in snapshot.jobs if j.state == JobState.PENDING),
                         key=lambda j: (j.time_limit if j.time_limit is not None else math.inf,
                                        j.submit_time, j.id))
        actions = []
        for job in pending:
            if (why := job.ineligible(snapshot.now)) is not None:
                actions.append(Wait(job.id, why))
                continue
            placement = ws.place(job)
            if placement is None:
                actions.append(Wait(job.id, RESOURCES))
                continue
            ws.take(job, placement)
            actions.append(Start(job.id, placement, f"shortest that fits ({job.time_limit} s)"))
        return Plan(tuple(actions))
