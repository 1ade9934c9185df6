"""Job dependencies, as sbatch --dependency takes them (pure, no I/O).

    after:ID[:ID...]       the jobs have started (or were cancelled, or ended)
    afterok:ID[:ID...]     the jobs completed successfully
    afternotok:ID[:ID...]  the jobs ended, and not all of them successfully
    afterany:ID[:ID...]    the jobs ended, however
    singleton              no earlier job of the same name and user is still unfinished

Terms joined by ',' must all hold, by '?' any one (Slurm does not mix the two). An ID may be an
array (all its tasks) or one task (12_3). The repository gathers what the terms look at when it
builds a snapshot; `evaluate` turns that into the pending reason the core sees.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping, Sequence

from .jobids import MAX_ID
from .reasons import DEPENDENCY, DEPENDENCY_NEVER
from .states import JobState

KINDS = ("after", "afterok", "afternotok", "afterany")
WAITING, NEVER = DEPENDENCY, DEPENDENCY_NEVER  # the reasons (core/reasons.py) a dependency gives
_ID = re.compile(r"([0-9]+)(?:_([0-9]+))?")


class DependencyError(ValueError):
    """A bad --dependency value; the text names the problem."""


@dataclass(frozen=True)
class Term:
    kind: str  # one of KINDS, or "singleton"
    job_id: int | None = None
    task_id: int | None = None  # None: the job, or every task of the array

    @property
    def target(self) -> tuple[int, int | None]:
        return (self.job_id, self.task_id)

    def __str__(self) -> str:
        if self.kind == "singleton":
            return "singleton"
        return f"{self.kind}:{self.job_id}" + (f"_{self.task_id}" if self.task_id is not None else "")


@dataclass(frozen=True)
class Dependency:
    terms: tuple[Term, ...]
    any_of: bool = False  # '?': one satisfied term is enough

    @property
    def text(self) -> str:
        return ("?" if self.any_of else ",").join(str(t) for t in self.terms)

    @property
    def targets(self) -> set[tuple[int, int | None]]:
        return {t.target for t in self.terms if t.kind != "singleton"}

    @property
    def singleton(self) -> bool:
        return any(t.kind == "singleton" for t in self.terms)


def parse_dependency(text: str) -> Dependency:
    if not text:
        raise DependencyError("empty dependency")
    if "," in text and "?" in text:
        raise DependencyError("',' (all of) and '?' (any of) cannot be mixed")
    any_of = "?" in text
    terms: list[Term] = []
    for item in text.split("?" if any_of else ","):
        kind, colon, rest = item.partition(":")
        if kind == "singleton" and not colon:
            terms.append(Term("singleton"))
            continue
        if kind not in KINDS:
            raise DependencyError(f"invalid dependency type {kind!r} in {item!r} "
                                  f"(expected {', '.join(KINDS)} or singleton)")
        if not colon or not rest:
            raise DependencyError(f"{item!r}: {kind} needs at least one job id ({kind}:ID[:ID...])")
        for ident in rest.split(":"):
            m = _ID.fullmatch(ident)
            if m is None:
                hint = " (a +TIME delay is not supported)" if "+" in ident else ""
                raise DependencyError(f"invalid job id {ident!r} in {item!r}{hint}")
            if int(m[1]) > MAX_ID or (m[2] is not None and int(m[2]) > MAX_ID):
                raise DependencyError(f"invalid job id {ident!r} in {item!r}: too large")
            terms.append(Term(kind, int(m[1]), int(m[2]) if m[2] is not None else None))
    return Dependency(tuple(terms), any_of)


@dataclass(frozen=True)
class Target:
    """What a dependency looks at in one job (or one task of an array)."""
    state: JobState
    started: bool  # has had a run


def _term_state(term: Term, targets: Sequence[Target]) -> str | None:
    """None: satisfied; WAITING; NEVER."""
    if not targets:
        return NEVER  # the job is gone
    ended = all(t.state.is_final for t in targets)
    if term.kind == "after":
        return None if all(t.started or t.state.is_final for t in targets) else WAITING
    if term.kind == "afterany":
        return None if ended else WAITING
    if term.kind == "afterok":
        if any(t.state.is_final and t.state != JobState.COMPLETED for t in targets):
            return NEVER
        return None if ended else WAITING
    if term.kind == "afternotok":
        if not ended:
            return WAITING
        return None if any(t.state != JobState.COMPLETED for t in targets) else NEVER
    raise ValueError(f"unknown dependency kind {term.kind!r}")


def evaluate(dep: Dependency, targets: Mapping[tuple[int, int | None], Sequence[Target]],
             singleton_clear: bool = True) -> str | None:
    """The pending reason a dependency gives now: None (satisfied), WAITING or NEVER.
    `targets` maps each (job id, task id or None) the terms name to the jobs it stands for;
    `singleton_clear` says no earlier job of the same name and user is unfinished."""
    states = [(None if singleton_clear else WAITING) if t.kind == "singleton"
              else _term_state(t, targets.get(t.target, ())) for t in dep.terms]
    if dep.any_of:
        if any(s is None for s in states):
            return None
        return NEVER if all(s == NEVER for s in states) else WAITING
    if any(s == NEVER for s in states):
        return NEVER
    return None if all(s is None for s in states) else WAITING
