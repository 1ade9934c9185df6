"""Priority-then-FIFO policy with gang placement (Slurm's sched/builtin behaviour).

Jobs are considered in order of priority class (interactive jobs first within it), then submit
time. The first job that cannot start blocks the jobs behind it in the same partition (reason
`Priority`), so a large job is never starved by a stream of small ones; it shows `Resources`
itself.
"""
from __future__ import annotations

from typing import Iterable

from ..core.model import PRIORITY_RANK, JobView, Snapshot
from ..core.reasons import PRIORITY, RESOURCES
from ..core.states import JobState
from .placement import place, reserve
from .plan import Plan, Start, Wait



class FifoPolicy:
    name = "fifo"

    def decide(self, snapshot: Snapshot) -> Plan:
        return decide(snapshot)


def service_order(pending: Iterable[JobView]) -> list[JobView]:
    """Pending jobs in the order FIFO serves them (and sprio's PRIORITY follows): class,
    interactive jobs (salloc, srun) before batch ones of their class (a person waits on them),
    --nice, submit time, id."""
    return sorted(pending, key=lambda j: (PRIORITY_RANK.get(j.priority, 2), not j.interactive, j.nice,
                                          j.submit_time, j.id))


def decide(snapshot: Snapshot) -> Plan:
    nodes = {n.name: n for n in snapshot.nodes}
    pending = service_order(j for j in snapshot.jobs if j.state == JobState.PENDING)
    # partition and reservation: a job that waits blocks those behind it in its lane only (a
    # reservation's jobs use nodes no other job may, and the others nodes they may not)
    blocked: set[tuple[str | None, str | None]] = set()
    actions = []
    for job in pending:
        if (why := job.ineligible(snapshot.now)) is not None:
            actions.append(Wait(job.id, why))
            continue
        if (job.partition, job.reservation) in blocked:
            actions.append(Wait(job.id, PRIORITY))
            continue
        placement = place(job, nodes)
        if placement is None:
            blocked.add((job.partition, job.reservation))
            actions.append(Wait(job.id, RESOURCES))
            continue
        reserve(job, placement, nodes)
        actions.append(Start(job.id, placement, "first in priority order that fits"))
    return Plan(tuple(actions))
