"""Why a job waits: the pending reasons hqueue shows in NODELIST(REASON) and hcontrol show job as
Reason=, one table. Slurm's names where Slurm has the reason; ours where it has none."""
from __future__ import annotations

RESOURCES = "Resources"  # no room for it now
PRIORITY = "Priority"  # jobs ahead of it go first (or hold a reservation it would break)
WAITING_FOR_CHECKPOINT = "WaitingForCheckpoint"  # ours: the runs preempted for it are checkpointing
BEGIN_TIME = "BeginTime"  # --begin is later
DEPENDENCY = "Dependency"  # --dependency not satisfied yet
DEPENDENCY_NEVER = "DependencyNeverSatisfied"  # --dependency can no longer be satisfied
HELD_USER = "JobHeldUser"  # held by its owner (--hold, hcontrol hold)
HELD_ADMIN = "JobHeldAdmin"  # held by an operator or administrator: only they release it
QUOTA = "QuotaLimit"  # a running-GPU limit of its user, account or class
ARRAY_TASK_LIMIT = "JobArrayTaskLimit"  # --array=...%N tasks of its array run already
RESERVATION = "Reservation"  # its --reservation's window has not opened
RESERVATION_DELETED = "ReservationDeleted"  # its --reservation was deleted or has ended
QOS_GPUS = "QOSMaxGRESPerUser"  # its user's running jobs of its QOS hold max_gpus_per_user
QOS_JOBS = "QOSMaxJobsPerUserLimit"  # its user runs max_jobs_per_user jobs of its QOS

# Every reason, with what it means to the user who reads it (docs and hcontrol's help).
PENDING_REASONS = {
    RESOURCES: "no room for it now", PRIORITY: "jobs ahead of it go first",
    WAITING_FOR_CHECKPOINT: "runs preempted for it are writing their checkpoints",
    BEGIN_TIME: "its --begin time has not come", DEPENDENCY: "its --dependency is not satisfied yet",
    DEPENDENCY_NEVER: "its --dependency can no longer be satisfied", HELD_USER: "held by its owner",
    HELD_ADMIN: "held by an operator or administrator", QUOTA: "a running-GPU limit of its user, account or class",
    ARRAY_TASK_LIMIT: "its array's limit of tasks at once is reached",
    RESERVATION: "its reservation's window has not opened", RESERVATION_DELETED: "its reservation is gone",
    QOS_GPUS: "its user's running jobs of its QOS hold the QOS's GPUs per user",
    QOS_JOBS: "its user runs the QOS's most jobs per user",
}
# The end reason of a preempted run whose job never said it can resume (JobSpec.resumes): only an
# urgent job, an administrator or a node's removal preempts such a job, and hacct shows this.
WORK_LOST = "its work is lost: the job did not say it can resume (--requeue, --signal, --checkpoint-dir)"
