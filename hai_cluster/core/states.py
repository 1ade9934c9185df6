"""Job and run states, their Slurm short codes, and the legal transitions."""
from __future__ import annotations

import enum


class JobState(str, enum.Enum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    COMPLETING = "COMPLETING"
    PREEMPTING = "PREEMPTING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    NODE_FAIL = "NODE_FAIL"
    PREEMPTED = "PREEMPTED"  # a run's end state only; the job itself goes back to PENDING
    REQUEUED = "REQUEUED"  # a run's end state only (manual requeue)

    @property
    def code(self) -> str:
        return SHORT_CODES[self]

    @property
    def is_final(self) -> bool:
        return self in FINAL_STATES

    @property
    def holds_resources(self) -> bool:
        return self in ACTIVE_STATES


SHORT_CODES = {
    JobState.PENDING: "PD",
    JobState.RUNNING: "R",
    JobState.COMPLETING: "CG",
    JobState.PREEMPTING: "PR",
    JobState.COMPLETED: "CD",
    JobState.FAILED: "F",
    JobState.CANCELLED: "CA",
    JobState.TIMEOUT: "TO",
    JobState.OUT_OF_MEMORY: "OOM",
    JobState.NODE_FAIL: "NF",
    JobState.PREEMPTED: "PR",
    JobState.REQUEUED: "RQ",
}

FINAL_STATES = frozenset({
    JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT,
    JobState.OUT_OF_MEMORY, JobState.NODE_FAIL,
})
# States in which a job's run still owns GPUs on its nodes.
ACTIVE_STATES = frozenset({JobState.RUNNING, JobState.COMPLETING, JobState.PREEMPTING})

_LEGAL = {
    JobState.PENDING: {JobState.RUNNING, JobState.CANCELLED, JobState.FAILED},
    JobState.RUNNING: {JobState.COMPLETING, JobState.PREEMPTING, JobState.PENDING} | FINAL_STATES,
    JobState.COMPLETING: {JobState.PENDING} | FINAL_STATES,
    JobState.PREEMPTING: {JobState.PENDING, JobState.COMPLETING} | FINAL_STATES,
}


def can_transition(old: JobState, new: JobState) -> bool:
    return new in _LEGAL.get(old, frozenset())


def parse_state(text: str) -> JobState:
    """Accept a state name or short code, case-insensitively (as squeue -t does)."""
    t = text.strip().upper()
    for state in JobState:
        if t == state.value or t == state.code:
            return state
    raise ValueError(f"invalid job state specified: {text!r}")
