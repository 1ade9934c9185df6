"""The job counts a submission is checked against ([limits] max_pending, max_jobs,
max_pending_bytes), kept between reads of the store.

Counting a user's pending jobs at every submission costs in proportion to how many there are
(10,000 by default: a few ms each). So the counts are read from the store at most every REFRESH
seconds per (user, account), and every submission accepted in between is added to them, on the
store thread like the check and the insert: concurrent submissions still cannot overshoot. Jobs
that start or end in between only make the kept counts too high, and a limit within NEAR of the
kept count is checked against a fresh read: a refusal is never on stale numbers. A requeue (a
running job pending again) is not seen until the next read: a user's pending count may pass
max_pending by the requeues of REFRESH seconds, which add nothing to the store.
"""
from __future__ import annotations

import time
from typing import Callable

REFRESH = 2.0
NEAR = 0.9  # a count past this share of its limit is read again before it is trusted
MAX_KEPT = 10_000  # (user, account) entries kept; beyond, they are forgotten and read again

Key = tuple[str, "str | None"]  # (user, account or None when no account limit asks for its count)


class SubmissionCounts:
    def __init__(self, read: Callable[[Key], dict[str, int]], clock: Callable[[], float] = time.monotonic) -> None:
        self._read, self._clock = read, clock
        self._kept: dict[Key, tuple[dict[str, int], float]] = {}

    def get(self, key: Key, fresh: bool = False) -> dict[str, int]:
        kept = self._kept.get(key)
        now = self._clock()
        if fresh or kept is None or now - kept[1] >= REFRESH:
            if len(self._kept) >= MAX_KEPT:
                self._kept.clear()
            kept = self._kept[key] = (self._read(key), now)
        return kept[0]

    def added(self, key: Key, jobs: int, nbytes: int) -> None:
        """A submission of `jobs` jobs and `nbytes` of spec was accepted for this key."""
        kept = self._kept.get(key)
        if kept is not None:
            n = kept[0]
            for k in ("user_pending", "user_jobs", "account_pending", "account_jobs"):
                n[k] += jobs
            n["user_pending_bytes"] += nbytes

    def forget(self) -> None:
        self._kept.clear()
