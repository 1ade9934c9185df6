"""The hook that keeps any policy within the running-GPU limits of core/quota.py.

Jobs that cannot start within their limits are taken out of the snapshot before the policy runs
(it neither starts them nor preempts for them); starts that together pass a limit become waits.
"""
from __future__ import annotations

from ..core.quota import admit, gate
from ..core.model import Snapshot
from .plan import Plan, Policy, Start, Wait


class WithinQuotas:
    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    def __getattr__(self, name: str):  # everything else is the policy's own
        return getattr(self.policy, name)

    def decide(self, snapshot: Snapshot) -> Plan:
        if not snapshot.quotas:
            return self.policy.decide(snapshot)
        inner, held = gate(snapshot)
        plan = self.policy.decide(inner)
        over = admit(snapshot, [a.job_id for a in plan.actions if isinstance(a, Start)])
        actions = tuple(Wait(a.job_id, over[a.job_id]) if a.job_id in over and isinstance(a, Start) else a
                        for a in plan.actions)
        return Plan(actions + tuple(Wait(job_id, reason) for job_id, reason in sorted(held.items())),
                    wake_at=plan.wake_at)
