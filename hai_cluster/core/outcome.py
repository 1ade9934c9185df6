"""How the ranks' exits of a run add up to the run's end state, and what happens to the job then."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from .states import JobState

# Agent-reported reasons for a rank ending that are not plain exits.
_REASON_STATE = {
    "cancel": JobState.CANCELLED,
    "timeout": JobState.TIMEOUT,
    "preempt": JobState.PREEMPTED,
    "requeue": JobState.REQUEUED,
    "node_fail": JobState.NODE_FAIL,
    "lost": JobState.NODE_FAIL,
    "launch_failed": JobState.FAILED,
    "oom": JobState.OUT_OF_MEMORY,
    "output_error": JobState.FAILED,  # the job's output could not be written (file system full)
}
# When ranks disagree, the run shows the most telling state.
_SEVERITY = [JobState.CANCELLED, JobState.NODE_FAIL, JobState.PREEMPTED, JobState.REQUEUED,
             JobState.TIMEOUT, JobState.OUT_OF_MEMORY, JobState.FAILED, JobState.COMPLETED]


@dataclass(frozen=True)
class RunOutcome:
    state: JobState
    exit_code: int | None
    signal: int | None
    message: str | None


def rank_state(status: Mapping) -> JobState:
    reason = status.get("reason")
    if reason in _REASON_STATE:
        return _REASON_STATE[reason]
    if status.get("exit_code") == 0 and not status.get("signal"):
        return JobState.COMPLETED
    return JobState.FAILED


def combine(ranks: Iterable[Mapping], end_request: str | None) -> RunOutcome:
    """The run's outcome from every rank's final status (all ranks must have ended)."""
    ranks = list(ranks)
    states = [rank_state(r) for r in ranks]
    if end_request == "cancel":
        state = JobState.CANCELLED
    else:
        # Without a user's cancel, a cancelled rank was stopped because a peer rank failed:
        # the run shows the peer's failure.
        own = [s for s in states if s != JobState.CANCELLED] or states
        state = min(own, key=_SEVERITY.index)
    # Exit code and signal: those of the first rank that failed, else rank 0's.
    culprit = next((r for r, s in zip(ranks, states) if s == state), ranks[0])
    return RunOutcome(state, culprit.get("exit_code"), culprit.get("signal"), culprit.get("message"))


def job_state_after(run: JobState, requeue: bool) -> JobState:
    """A preempted or requeued run sends the job back to the queue; so does a node failure when the
    job may be requeued (Slurm's JobRequeue=1 default)."""
    if run in (JobState.PREEMPTED, JobState.REQUEUED):
        return JobState.PENDING
    if run == JobState.NODE_FAIL and requeue:
        return JobState.PENDING
    return run
