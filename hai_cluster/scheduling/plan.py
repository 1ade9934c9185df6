"""What a policy decides: a list of actions, each with a reason a user can read."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Union

from ..core.model import Placement, Snapshot


@dataclass(frozen=True)
class Start:
    job_id: int
    placement: Placement
    reason: str


@dataclass(frozen=True)
class Wait:
    """The job stays pending; `reason` is what hqueue shows (Slurm's words where they exist)."""
    job_id: int
    reason: str


@dataclass(frozen=True)
class Preempt:
    """Tell a running job to checkpoint and leave its GPUs; it goes back to the queue.

    `for_job` is the job the GPUs are freed for (None for a drain or an admin request)."""
    job_id: int
    reason: str
    for_job: int | None = None


Action = Union[Start, Wait, Preempt]


@dataclass(frozen=True)
class Plan:
    actions: tuple[Action, ...] = ()
    # The earliest time at which this policy could decide differently with no new event (a quantum
    # ends, a job crosses a level threshold, a starvation guard fires). None: only events matter.
    # The simulator jumps its clock to it; the controller ticks anyway.
    wake_at: float | None = None

    @property
    def starts(self) -> tuple[Start, ...]:
        return tuple(a for a in self.actions if isinstance(a, Start))

    @property
    def waits(self) -> tuple[Wait, ...]:
        return tuple(a for a in self.actions if isinstance(a, Wait))

    @property
    def preempts(self) -> tuple[Preempt, ...]:
        return tuple(a for a in self.actions if isinstance(a, Preempt))


class Policy(Protocol):
    """Every policy (the MLFQ and the baselines) is a pure function of the snapshot.

    The controller and the simulator both call `decide`; nothing else about a policy is visible to
    them. Jobs in the snapshot: PENDING ones wait, RUNNING ones hold GPUs, PREEMPTING ones hold
    GPUs that will be free once their checkpoint is written."""
    name: str

    def decide(self, snapshot: Snapshot) -> Plan: ...
