"""The hook that keeps any policy within the advance reservations (core/reservation.py): the
policy sees the nodes marked with their reservations and not the jobs whose reservation is not
open now (those wait with its reason)."""
from __future__ import annotations

from ..core.model import Snapshot
from ..core.reservation import apply
from .plan import Plan, Policy, Wait


class WithinReservations:
    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    def __getattr__(self, name: str):  # everything else is the policy's own
        return getattr(self.policy, name)

    def decide(self, snapshot: Snapshot) -> Plan:
        if not snapshot.reservations and not any(j.reservation for j in snapshot.jobs):
            return self.policy.decide(snapshot)
        inner, held = apply(snapshot, snapshot.reservations)
        plan = self.policy.decide(inner)
        return Plan(plan.actions + tuple(Wait(job_id, why) for job_id, why in sorted(held.items())),
                    wake_at=_earliest(plan.wake_at, snapshot))


def _earliest(wake_at: float | None, snapshot: Snapshot) -> float | None:
    """A window that opens or closes is a reason to plan again then."""
    edges = [t for r in snapshot.reservations for t in (r.start, r.end) if t > snapshot.now]
    if wake_at is not None:
        edges.append(wake_at)
    return min(edges) if edges else None
