"""Running-GPU limits per user, per account (Slurm's GrpTRES=gres/gpu / MaxTRESPerUser), and per
user within a priority class (Slurm's QOS MaxTRESPerUser: `[limits.classes] urgent = {max_gpus = 8}`).

Pure: the controller puts the limits into the snapshot; `gate` and `admit` keep every policy
inside them. A job that would take its user or account past a limit waits with `QuotaLimit`.
Pending and total job counts are limits on submission, checked by the controller instead.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping

from .model import JobView, Snapshot
from .reasons import QUOTA
from .states import JobState

QUOTA_REASON = QUOTA  # core/reasons.py


@dataclass(frozen=True)
class Quotas:
    """Most GPUs the running jobs of one user / one account may hold. Absent or 0: no limit."""
    user_gpus: Mapping[str, int] = field(default_factory=dict)
    default_user_gpus: int = 0  # for users not in user_gpus
    account_gpus: Mapping[str, int] = field(default_factory=dict)
    class_user_gpus: Mapping[str, int] = field(default_factory=dict)  # priority class -> per user

    def __bool__(self) -> bool:
        return bool(self.default_user_gpus or any(self.user_gpus.values()) or any(self.account_gpus.values())
                    or any(self.class_user_gpus.values()))

    def user_limit(self, user: str) -> int:
        return self.user_gpus.get(user, self.default_user_gpus)


class Usage:
    """GPUs held per user and per account, as a pass admits jobs."""

    def __init__(self, quotas: Quotas, jobs: Iterable[JobView]) -> None:
        self.quotas = quotas
        self.users: dict[str, int] = {}
        self.accounts: dict[str, int] = {}
        self.classes: dict[tuple[str, str], int] = {}  # (user, priority class)
        for j in jobs:
            if j.state.holds_resources:
                self.add(j)

    def add(self, job: JobView) -> None:
        self.users[job.user] = self.users.get(job.user, 0) + job.gpus
        self.accounts[job.account] = self.accounts.get(job.account, 0) + job.gpus
        key = (job.user, job.priority)
        self.classes[key] = self.classes.get(key, 0) + job.gpus

    def fits(self, job: JobView) -> bool:
        if job.gpus == 0:
            return True
        user_max = self.quotas.user_limit(job.user)
        if user_max and self.users.get(job.user, 0) + job.gpus > user_max:
            return False
        acct_max = self.quotas.account_gpus.get(job.account, 0)
        if acct_max and self.accounts.get(job.account, 0) + job.gpus > acct_max:
            return False
        class_max = self.quotas.class_user_gpus.get(job.priority, 0)
        return not (class_max and self.classes.get((job.user, job.priority), 0) + job.gpus > class_max)


def gate(snapshot: Snapshot) -> tuple[Snapshot, dict[int, str]]:
    """The snapshot without the pending jobs that could not start within their limits even alone,
    and a QuotaLimit reason for each (so no policy preempts anyone for them)."""
    quotas = snapshot.quotas
    if not quotas:
        return snapshot, {}
    usage = Usage(quotas, snapshot.jobs)
    held = {j.id: QUOTA_REASON for j in snapshot.jobs
            if j.state == JobState.PENDING and j.ineligible(snapshot.now) is None and not usage.fits(j)}
    if not held:
        return snapshot, {}
    return replace(snapshot, jobs=tuple(j for j in snapshot.jobs if j.id not in held)), held


def admit(snapshot: Snapshot, start_ids: Iterable[int]) -> set[int]:
    """Of the jobs a policy starts (in its order), those that would together pass a limit."""
    quotas = snapshot.quotas
    if not quotas:
        return set()
    usage = Usage(quotas, snapshot.jobs)
    jobs = {j.id: j for j in snapshot.jobs}
    refused = set()
    for job_id in start_ids:
        job = jobs[job_id]
        if usage.fits(job):
            usage.add(job)
        else:
            refused.add(job_id)
    return refused
