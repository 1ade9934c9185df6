"""Fair share's decayed usage, kept up to date from the runs table a few rows at a time.

Recomputing it from every run in the lookback (20 half-lives, 140 days by default) read 2,000,000
runs in 4 s on the store's one thread, every 10 s and for every `hshare` (ninth audit). Here each
refresh reads the runs recorded since the last one (through the primary key, at most CHUNK; a
store with a long history is caught up over several refreshes) and looks up only the runs that
were live then: the cost is that of what changed, not of the history. Measured at 1,000,000
runs: the full read 2.6 s; a refresh while catching up 0.25 s per 50,000 runs; then 0.2 ms."""
from __future__ import annotations

from ..core.fairshare import UsageLedger
from ..store import accounts as store

CHUNK = 20_000  # runs read per refresh while catching up with a long history (about 0.1 s each)


class UsageTracker:
    def __init__(self, half_life: float) -> None:
        self.ledger = UsageLedger(half_life)
        self.after_id = 0  # every run up to this id has been told to the ledger
        self.behind = True  # the last read was a full chunk: more runs may wait

    def refresh(self, engine, now: float) -> dict[tuple[str, str], float]:
        """The usage per (account, user) at `now`, after reading what changed (store thread)."""
        ledger = self.ledger
        ledger.advance(now)
        new, self.after_id, self.behind = store.runs_after(engine, self.after_id, CHUNK)
        was_live = list(ledger.live)
        for run_id, run in new:
            if run[4] is None:
                ledger.live[run_id] = run
            else:
                ledger.ended_run(run_id, run)
        if was_live:
            ends = store.run_ends(engine, was_live)
            for run_id in was_live:
                if run_id not in ends:  # its job is gone from the store: so is its usage
                    ledger.live.pop(run_id, None)
                elif (end := ends[run_id]) is not None:
                    account, user, gpus, start, _ = ledger.live[run_id]
                    ledger.ended_run(run_id, (account, user, gpus, start, end))
        return ledger.usage(now)
