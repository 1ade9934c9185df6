"""What sprio shows (pure): each pending job's priority factors as the running policy uses them,
and a PRIORITY that orders the jobs exactly as the policy serves them.

Slurm's multifactor PRIORITY is a weighted sum of factors in [0, 1]. Our policies order pending
jobs lexicographically instead (MLFQ: urgent class, level, class, best-effort share, round-robin
at the lowest level, --nice, fair-share factor, submit time; FIFO: class, --nice, submit time),
and no sum of bounded factors reproduces an order on two continuous keys (fair share, then age).
So PRIORITY is the job's place in the policy's own order (MlfqPass.queue, fifo.service_order),
counted from the end: of N listed jobs the first served has N, the last 1. The factor columns are
the values the policy compares, normalized as Slurm normalizes its factors; the weights only
scale them for display (and say which factors the policy reads: 0 for those it does not).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..core.model import PRIORITY_CLASSES, JobView, Snapshot
from ..core.states import JobState
from . import fifo
from .mlfq import MlfqConfig, MlfqPass

MAX_AGE = 7 * 86400.0  # Slurm's PriorityMaxAge default: AGE reaches 1 after a week pending
# The classes as a QOS factor (Slurm: the QOS's priority over the highest): urgent 1 ... low 0.
CLASS_FACTOR = {name: (len(PRIORITY_CLASSES) - 1 - rank) / (len(PRIORITY_CLASSES) - 1)
                for rank, name in enumerate(PRIORITY_CLASSES)}


@dataclass(frozen=True)
class JobPriority:
    job_id: int
    user: str
    partitions: tuple[str, ...]
    priority: int  # its place in the policy's order, from the end (the first served: the most)
    level: int | None  # the MLFQ level it is served at (None under FIFO)
    age: float  # normalized factors, in [0, 1]
    fairshare: float
    qos: float
    nice: int


def weights(policy: str, fairshare: bool) -> dict[str, int]:
    """sprio -w: the factors' weights; 0 for a factor the policy does not read (Slurm hides those
    columns). The magnitudes follow the factors' significance in the order (class before fair
    share before age); they scale the columns, PRIORITY is the order itself."""
    return {"age": 1000, "fairshare": 10000 if policy == "mlfq" and fairshare else 0, "qos": 100000,
            "jobsize": 0, "partition": 0, "assoc": 0}


def listed(job: JobView, now: float) -> bool:
    """Whether sprio lists the job: pending, not held, its --begin time passed (as Slurm's, which
    skips jobs of priority 0 and those not yet eligible by time; a Dependency wait is listed)."""
    return (job.state == JobState.PENDING and not job.hold
            and (job.begin_time is None or job.begin_time <= now))


def priorities(snapshot: Snapshot, policy: str, mlfq: MlfqConfig) -> list[JobPriority]:
    """The listed pending jobs with their factors, in the order the policy serves them."""
    now = snapshot.now
    pending = [j for j in snapshot.jobs if listed(j, now)]
    if policy == "mlfq":  # the policy's own queue (either order), over the listed jobs alone
        listed_only = replace(snapshot, jobs=tuple(pending), nodes=())
        order = [(j, level) for j, level, _rank in MlfqPass(mlfq, listed_only).queue()]
    else:
        order = [(j, None) for j in fifo.service_order(pending)]
    share = snapshot.fairshare if policy == "mlfq" else {}
    out = []
    for place, (j, level) in enumerate(order):
        out.append(JobPriority(
            job_id=j.id, user=j.user, partitions=j.partitions, priority=len(order) - place, level=level,
            age=min(1.0, max(0.0, now - j.submit_time) / MAX_AGE),
            fairshare=share.get((j.account, j.user), 1.0) if share else 1.0,
            qos=CLASS_FACTOR.get(j.priority, CLASS_FACTOR["normal"]), nice=j.nice))
    return out
