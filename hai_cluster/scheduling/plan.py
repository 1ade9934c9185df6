"""What a policy decides: a list of actions, each with a reason a user can read."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from ..core.model import Placement


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


Action = Union[Start, Wait]


@dataclass(frozen=True)
class Plan:
    actions: tuple[Action, ...] = ()

    @property
    def starts(self) -> tuple[Start, ...]:
        return tuple(a for a in self.actions if isinstance(a, Start))

    @property
    def waits(self) -> tuple[Wait, ...]:
        return tuple(a for a in self.actions if isinstance(a, Wait))
