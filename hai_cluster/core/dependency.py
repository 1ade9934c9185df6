"""Job dependencies, as sbatch --dependency takes them (pure, no I/O).

    after:ID[:ID...]       the jobs have started (or were cancelled, or ended)
    after:ID+MIN           ... and MIN minutes have passed since (Slurm's after:job_id+time)
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
from typing import Iterable, Mapping

from .jobids import MAX_ID
from .reasons import DEPENDENCY, DEPENDENCY_NEVER
from .states import JobState

KINDS = ("after", "afterok", "afternotok", "afterany")
WAITING, NEVER = DEPENDENCY, DEPENDENCY_NEVER  # the reasons (core/reasons.py) a dependency gives
_ID = re.compile(r"([0-9]+)(?:_([0-9]+))?(?:\+([0-9]+))?")
MAX_DELAY_MINUTES = 525600  # a year


class DependencyError(ValueError):
    """A bad --dependency value; the text names the problem."""


@dataclass(frozen=True)
class Term:
    kind: str  # one of KINDS, or "singleton"
    job_id: int | None = None
    task_id: int | None = None  # None: the job, or every task of the array
    delay: int = 0  # after:ID+MIN: minutes after the start (or the end of a job that never started)

    @property
    def target(self) -> tuple[int, int | None]:
        return (self.job_id, self.task_id)

    def __str__(self) -> str:
        if self.kind == "singleton":
            return "singleton"
        return (f"{self.kind}:{self.job_id}" + (f"_{self.task_id}" if self.task_id is not None else "")
                + (f"+{self.delay}" if self.delay else ""))


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

    @property
    def timed(self) -> bool:
        """A term waits for time to pass too: its verdict changes with the clock alone."""
        return any(t.delay for t in self.terms)


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
                hint = " (a delay is +MINUTES: after:12+30)" if "+" in ident else ""
                raise DependencyError(f"invalid job id {ident!r} in {item!r}{hint}")
            if int(m[1]) > MAX_ID or (m[2] is not None and int(m[2]) > MAX_ID):
                raise DependencyError(f"invalid job id {ident!r} in {item!r}: too large")
            delay = int(m[3]) if m[3] is not None else 0
            if m[3] is not None and kind != "after":
                raise DependencyError(f"{ident!r} in {item!r}: a +MINUTES delay is after's alone (after:ID+MIN)")
            if delay > MAX_DELAY_MINUTES:
                raise DependencyError(f"{ident!r} in {item!r}: a delay of at most {MAX_DELAY_MINUTES} minutes")
            terms.append(Term(kind, int(m[1]), int(m[2]) if m[2] is not None else None, delay))
    # A term said twice says nothing more, and would cost every pass its look again.
    return Dependency(tuple(dict.fromkeys(terms)), any_of)


@dataclass(frozen=True)
class Target:
    """What a dependency looks at in one job (or one task of an array)."""
    state: JobState
    started: bool  # has had a run
    since: float | None = None  # when its current run started, else when it ended (for after:ID+MIN)


@dataclass(frozen=True)
class Targets:
    """What a term needs to know of the jobs one id stands for (a job, or every task of an
    array), gathered once a pass: a term over a 1000-task array is then one look, not 1000."""
    ended: bool  # every one is in a final state
    started: bool  # every one has had a run, or has ended
    failed: bool  # one has ended, and not COMPLETED
    since: float | None = None  # the latest of their `since` (None: one has none yet)


def summarize(found: Iterable[Target]) -> Targets:
    ended = started = True
    failed = False
    since: float | None = 0.0
    for t in found:
        final = t.state.is_final
        ended = ended and final
        started = started and (t.started or final)
        failed = failed or (final and t.state != JobState.COMPLETED)
        since = None if since is None or t.since is None else max(since, t.since)
    return Targets(ended, started, failed, since)


def _term_state(term: Term, found: Targets | None, now: float) -> str | None:
    """None: satisfied; WAITING; NEVER."""
    if found is None:
        return NEVER  # the job is gone
    if term.kind == "after":
        if not found.started:
            return WAITING
        return None if not term.delay or (found.since is not None and now >= found.since + 60 * term.delay) \
            else WAITING
    if term.kind == "afterany":
        return None if found.ended else WAITING
    if term.kind == "afterok":
        if found.failed:
            return NEVER
        return None if found.ended else WAITING
    if term.kind == "afternotok":
        if not found.ended:
            return WAITING
        return None if found.failed else NEVER
    raise ValueError(f"unknown dependency kind {term.kind!r}")


@dataclass(frozen=True)
class Settled:
    """A dependency with the terms whose outcome can no longer change taken out: `rest` holds
    those that still can, or is None when the verdict (None: satisfied, or NEVER) is final."""
    rest: Dependency | None
    verdict: str | None = None


def settle(dep: Dependency, targets: Mapping[tuple[int, int | None], Targets], now: float) -> Settled:
    """Take out of `dep` the terms that are decided for good. A job leaves a final state never
    and a run, once started, stays started, so a term that is satisfied or never satisfiable
    now stays so: the scheduler need not look its targets up again, pass after pass. A term
    whose job is not found (yet) and a singleton stay, as does one still waiting."""
    decided: list[str | None] = []
    rest: list[Term] = []
    for term in dep.terms:
        found = targets.get(term.target) if term.kind != "singleton" else None
        state = _term_state(term, found, now) if found is not None else WAITING
        if state == WAITING:
            rest.append(term)
        else:
            decided.append(state)
    if dep.any_of and None in decided or not dep.any_of and NEVER in decided:
        return Settled(None, None if dep.any_of else NEVER)
    if not rest:  # every term decided, none of them decisive: all satisfied (,) or all never (?)
        return Settled(None, NEVER if dep.any_of else None)
    return Settled(Dependency(tuple(rest), dep.any_of) if decided else dep)


def evaluate(dep: Dependency, targets: Mapping[tuple[int, int | None], Targets],
             singleton_clear: bool = True, now: float = 0.0) -> str | None:
    """The pending reason a dependency gives now: None (satisfied), WAITING or NEVER.
    `targets` maps each (job id, task id or None) the terms name to the jobs it stands for
    (summarized; an id not found is not in it);
    `singleton_clear` says no earlier job of the same name and user is unfinished."""
    states = [(None if singleton_clear else WAITING) if t.kind == "singleton"
              else _term_state(t, targets.get(t.target), now) for t in dep.terms]
    if dep.any_of:
        if any(s is None for s in states):
            return None
        return NEVER if all(s == NEVER for s in states) else WAITING
    if any(s == NEVER for s in states):
        return NEVER
    return None if all(s is None for s in states) else WAITING
