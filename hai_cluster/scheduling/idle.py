"""The idle clock of a running job, and what it calls for: nothing, a warning, or the action
(cancel or requeue) once the grace after the warning has run out. Pure: samples in, verdict out.

The clock runs on the telemetry's own sample times, never on a wall clock read here: a job whose
node sends no samples (its link is down, the agent is restarting) accumulates no idle time and
its grace does not run out, since nothing says it is still idle. A job is idle while every GPU
reading of every sample is under the threshold; the clock starts at the first such sample, and a
sample with any GPU at or over it (busy) resets the clock and lifts a warning. A sample without
readings (NVML failed to read the utilization) neither starts nor resets it.

The action comes only after the warning, and `grace` seconds of idle samples after it: a job is
never ended without a notice first, even when the clock was long past the window when it was
first judged (a controller that was down, a setting just lowered).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable, Sequence

NONE, WARN, ACT = "none", "warn", "act"


@dataclass(frozen=True)
class IdleClock:
    since: float | None = None  # sample time of the first idle sample of the current idle stretch
    last: float | None = None  # the newest sample time seen
    warned: float | None = None  # sample time at which the job was warned (None: not warned)

    @property
    def idle_for(self) -> float:
        """Seconds of idle samples so far (0 while busy or without samples)."""
        if self.since is None or self.last is None:
            return 0.0
        return max(0.0, self.last - self.since)


def observe(clock: IdleClock, t: float, utils: Sequence[float], threshold: float) -> IdleClock:
    """The clock after one sample at time `t` with these GPU utilizations (percent)."""
    if not utils:
        return clock
    last = t if clock.last is None else max(clock.last, t)
    if max(utils) >= threshold:
        return IdleClock(since=None, last=last, warned=None)
    return IdleClock(since=t if clock.since is None else min(clock.since, t), last=last, warned=clock.warned)


def observe_all(clock: IdleClock, samples: Iterable[tuple[float, Sequence[float]]], threshold: float) -> IdleClock:
    for t, utils in samples:
        clock = observe(clock, t, utils, threshold)
    return clock


@dataclass(frozen=True)
class Verdict:
    kind: str  # NONE, WARN or ACT
    idle_for: float
    # ACT: how long after the warning (sample time); WARN: when the action comes at the earliest
    grace_left: float = 0.0


def judge(clock: IdleClock, window: float, grace: float) -> Verdict:
    """What the clock calls for now. WARN once the job has been idle for `window` and was not
    warned; ACT once it was warned and has stayed idle `grace` seconds since (by sample time)."""
    idle = clock.idle_for
    if clock.warned is not None and clock.last is not None:
        left = grace - (clock.last - clock.warned)
        return Verdict(ACT if left <= 0 else NONE, idle, max(0.0, left))
    if clock.since is not None and idle >= window:
        return Verdict(WARN, idle, grace)
    return Verdict(NONE, idle)


def warned(clock: IdleClock) -> IdleClock:
    """The clock once the warning went out: the grace counts from its newest sample."""
    return replace(clock, warned=clock.last)
