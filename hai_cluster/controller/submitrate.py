"""How fast one user may add jobs to the store ([access] submit_rate, submit_burst), a token
bucket per uid as Slurm 23.02's rl_enable has for RPCs (root is never limited). The same
buckets, taken at once or not at all (take_now), pace a uid's new connections (connlimit.py).

The store keeps a row for every job it was ever given (its script and environment go when it
is final): a user submitting and cancelling in a loop adds rows as fast as the controller takes
them. The bucket holds submit_burst jobs (every task of an array counts) and refills at
submit_rate per second; a submission beyond it waits for its jobs' tokens, up to MAX_WAIT, and is
refused with the time it would need beyond that. Pure but for the clock it is given.
"""
from __future__ import annotations

import math
from typing import Callable

MAX_WAIT = 30.0  # seconds a submission may be held back before it is refused
MAX_KEPT = 10_000  # buckets kept; full ones are forgotten first


class SubmitRate:
    def __init__(self, rate: float, burst: int, clock: Callable[[], float]) -> None:
        self.rate, self.burst, self._clock = rate, burst, clock
        self._buckets: dict[int, tuple[float, float]] = {}  # uid -> (tokens, when counted); may be < 0

    def take(self, uid: int, jobs: int) -> float:
        """Seconds the submission of `jobs` jobs must wait before it is recorded (0: at once), its
        tokens taken; raises OverRate when that would be more than MAX_WAIT (nothing taken)."""
        if not self.rate or uid == 0:
            return 0.0
        now = self._clock()
        tokens = self._tokens(uid, now)
        need = min(jobs, self.burst)  # an array larger than the bucket waits for all of it
        wait = max(0.0, (need - tokens) / self.rate)
        if wait > MAX_WAIT:
            raise OverRate(f"submitting too fast: at most {self.rate:g} jobs a second and {self.burst} at once "
                           f"([access] submit_rate, submit_burst); these {jobs} can go in {math.ceil(wait)} s")
        self._keep(uid, tokens - need, now)
        return wait

    def take_now(self, uid: int) -> bool:
        """Take one token if there is one now (True), else take nothing (False): no waiting."""
        if not self.rate or uid == 0:
            return True
        now = self._clock()
        tokens = self._tokens(uid, now)
        if tokens < 1:
            return False  # the bucket as kept refills to the same count: nothing to write
        self._keep(uid, tokens - 1, now)
        return True

    def _tokens(self, uid: int, now: float) -> float:
        """The uid's tokens at `now`: what was kept, refilled at the rate up to the burst."""
        tokens, then = self._buckets.get(uid, (float(self.burst), now))
        return min(float(self.burst), tokens + (now - then) * self.rate)

    def _keep(self, uid: int, tokens: float, now: float) -> None:
        if len(self._buckets) >= MAX_KEPT:
            self._forget_full(now)
        self._buckets[uid] = (tokens, now)

    def _forget_full(self, now: float) -> None:
        for uid, (tokens, then) in list(self._buckets.items()):
            if tokens + (now - then) * self.rate >= self.burst:
                del self._buckets[uid]


class OverRate(Exception):
    pass
