"""Running-GPU limits per user, per account (Slurm's GrpTRES=gres/gpu / MaxTRESPerUser), and per
user within a priority class (`[limits.classes] urgent = {max_gpus = 8}`), and per user within a
named QOS (Slurm's QOS MaxTRESPerUser=gres/gpu and MaxJobsPerUser: `[[qos]]` tables).

Pure: the controller puts the limits into the snapshot; `gate` and `admit` keep every policy
inside them. A job that would take its user or account past a limit waits with `QuotaLimit`; past one of its
QOS with Slurm's `QOSMaxGRESPerUser` / `QOSMaxJobsPerUserLimit`.
Pending and total job counts are limits on submission, checked by the controller instead.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping

from .model import JobView, Snapshot
from .reasons import QOS_GPUS, QOS_JOBS, QUOTA
from .states import JobState

QUOTA_REASON = QUOTA  # core/reasons.py


@dataclass(frozen=True)
class Quotas:
    """Most GPUs the running jobs of one user / one account may hold. Absent or 0: no limit."""
    user_gpus: Mapping[str, int] = field(default_factory=dict)
    default_user_gpus: int = 0  # for users not in user_gpus
    account_gpus: Mapping[str, int] = field(default_factory=dict)
    class_user_gpus: Mapping[str, int] = field(default_factory=dict)  # priority class -> per user
    qos_user_gpus: Mapping[str, int] = field(default_factory=dict)  # QOS name -> per user
    qos_user_jobs: Mapping[str, int] = field(default_factory=dict)  # QOS name -> running jobs per user

    def __bool__(self) -> bool:
        return bool(self.default_user_gpus or any(self.user_gpus.values()) or any(self.account_gpus.values())
                    or any(self.class_user_gpus.values()) or any(self.qos_user_gpus.values())
                    or any(self.qos_user_jobs.values()))

    def user_limit(self, user: str) -> int:
        return self.user_gpus.get(user, self.default_user_gpus)


class Usage:
    """GPUs held per user and per account, as a pass admits jobs."""

    def __init__(self, quotas: Quotas, jobs: Iterable[JobView]) -> None:
        self.quotas = quotas
        self.users: dict[str, int] = {}
        self.accounts: dict[str, int] = {}
        self.classes: dict[tuple[str, str], int] = {}  # (user, priority class)
        self.qos: dict[tuple[str, str], tuple[int, int]] = {}  # (user, QOS) -> (GPUs, jobs)
        for j in jobs:
            if j.state.holds_resources:
                self.add(j)

    def add(self, job: JobView) -> None:
        self.users[job.user] = self.users.get(job.user, 0) + job.gpus
        self.accounts[job.account] = self.accounts.get(job.account, 0) + job.gpus
        key = (job.user, job.priority)
        self.classes[key] = self.classes.get(key, 0) + job.gpus
        gpus, count = self.qos.get(q := (job.user, job.qos), (0, 0))
        self.qos[q] = (gpus + job.gpus, count + 1)

    def fits(self, job: JobView) -> bool:
        return self.why_not(job) is None

    def why_not(self, job: JobView) -> str | None:
        """The reason the job would pass a limit if it started now (None: it would not)."""
        jobs_max = self.quotas.qos_user_jobs.get(job.qos, 0)
        gpus, count = self.qos.get((job.user, job.qos), (0, 0))
        if jobs_max and count + 1 > jobs_max:
            return QOS_JOBS
        if job.gpus == 0:
            return None
        qos_max = self.quotas.qos_user_gpus.get(job.qos, 0)
        if qos_max and gpus + job.gpus > qos_max:
            return QOS_GPUS
        user_max = self.quotas.user_limit(job.user)
        if user_max and self.users.get(job.user, 0) + job.gpus > user_max:
            return QUOTA
        acct_max = self.quotas.account_gpus.get(job.account, 0)
        if acct_max and self.accounts.get(job.account, 0) + job.gpus > acct_max:
            return QUOTA
        class_max = self.quotas.class_user_gpus.get(job.priority, 0)
        return QUOTA if class_max and self.classes.get((job.user, job.priority), 0) + job.gpus > class_max else None


def gate(snapshot: Snapshot) -> tuple[Snapshot, dict[int, str]]:
    """The snapshot without the pending jobs that could not start within their limits even alone,
    and a QuotaLimit reason for each (so no policy preempts anyone for them)."""
    quotas = snapshot.quotas
    if not quotas:
        return snapshot, {}
    usage = Usage(quotas, snapshot.jobs)
    held = {j.id: why for j in snapshot.jobs
            if j.state == JobState.PENDING and j.ineligible(snapshot.now) is None and (why := usage.why_not(j))}
    if not held:
        return snapshot, {}
    return replace(snapshot, jobs=tuple(j for j in snapshot.jobs if j.id not in held)), held


def admit(snapshot: Snapshot, start_ids: Iterable[int]) -> dict[int, str]:
    """Of the jobs a policy starts (in its order), those that would together pass a limit, each
    with the limit's reason."""
    quotas = snapshot.quotas
    if not quotas:
        return {}
    usage = Usage(quotas, snapshot.jobs)
    jobs = {j.id: j for j in snapshot.jobs}
    refused = {}
    for job_id in start_ids:
        job = jobs[job_id]
        if (why := usage.why_not(job)) is None:
            usage.add(job)
        else:
            refused[job_id] = why
    return refused
