"""Limits every policy obeys, applied around it: job array task limits (--array=...%N), and
(inside them, scheduling/quotas.py) the running-GPU quotas of users and accounts.

Before the policy runs, an array with N tasks allowed at once and R of them holding resources
keeps only its first N - R eligible pending tasks in the snapshot; the others wait with reason
`JobArrayTaskLimit`. The policy can then never start more than the limit allows, whatever it is.
"""
from __future__ import annotations

from dataclasses import replace

from ..core.model import Snapshot
from ..core.reasons import ARRAY_TASK_LIMIT
from ..core.states import JobState
from .collector import collector_paused
from .plan import Plan, Policy, Wait
from .quotas import WithinQuotas
from .reservations import WithinReservations

ARRAY_LIMIT = ARRAY_TASK_LIMIT  # core/reasons.py


def throttled(snapshot: Snapshot) -> set[int]:
    """Ids of pending array tasks that must wait for their array's task limit."""
    pending = sorted((j for j in snapshot.jobs if j.array_task_limit is not None and j.array_job_id is not None
                      and j.state == JobState.PENDING), key=lambda j: j.id)
    if not pending:
        return set()  # the usual case, found in one cheap walk over a long job list
    running: dict[int, int] = {}
    for j in snapshot.jobs:
        if j.array_job_id is not None and j.state.holds_resources:
            running[j.array_job_id] = running.get(j.array_job_id, 0) + 1
    room: dict[int, int] = {}
    out: set[int] = set()
    for j in pending:
        if j.ineligible(snapshot.now) is not None:
            continue  # held or waiting anyway: it takes no slot
        left = room.setdefault(j.array_job_id, j.array_task_limit - running.get(j.array_job_id, 0))
        if left > 0:
            room[j.array_job_id] = left - 1
        else:
            out.add(j.id)
    return out


class Limited:
    """A policy with the limits applied; everything else is the policy's own."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    def __getattr__(self, name: str):
        return getattr(self.policy, name)

    def decide(self, snapshot: Snapshot) -> Plan:
        with collector_paused():  # the same plan, sooner (collector.py)
            held = throttled(snapshot)
            if not held:
                return self.policy.decide(snapshot)
            plan = self.policy.decide(replace(snapshot, jobs=tuple(j for j in snapshot.jobs if j.id not in held)))
            return replace(plan, actions=plan.actions + tuple(Wait(i, ARRAY_LIMIT) for i in sorted(held)))


def with_limits(policy: Policy) -> Limited:
    """The policy inside every limit: array task limits around running-GPU quotas (quotas.py)
    around advance reservations (reservations.py)."""
    return policy if isinstance(policy, Limited) else Limited(WithinQuotas(WithinReservations(policy)))


__all__ = ["ARRAY_LIMIT", "Limited", "throttled", "with_limits"]
