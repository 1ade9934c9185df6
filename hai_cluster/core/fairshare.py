"""Slurm's classic fair share, over a two-level tree: accounts under the root, users under each.

Usage is GPU-seconds with exponential decay (a GPU-second `half_life` ago counts half). For an
account a: NormShares S_a = shares_a / all shares; NormUsage U_a = usage_a / all usage; its
EffectvUsage is U_a (its parent is the root). For a user u in a (users weigh 1 each): S_u = S_a /
users(a); EffectvUsage E_u = U_u + (E_a - U_u) / users(a); the factor is F = 2^(-E/S), in (0, 1]:
1 for whoever has used nothing, 0.5 for exactly its share, less beyond. Pure; the controller
computes it from the runs table and passes the factors in the snapshot.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

Run = tuple[str, str, int, float, "float | None"]  # (account, user, gpus, start, end or None: running)


def decayed_usage(runs: Iterable[Run], now: float, half_life: float) -> dict[tuple[str, str], float]:
    """GPU-seconds per (account, user), each second weighted by 2^(-age / half_life)."""
    lam = math.log(2) / half_life
    usage: dict[tuple[str, str], float] = {}
    for account, user, gpus, start, end in runs:
        end = now if end is None else min(end, now)
        if end <= start or gpus <= 0:
            continue
        # integral of gpus * exp(-lam (now - t)) dt from start to end
        used = gpus * (math.exp(-lam * (now - end)) - math.exp(-lam * (now - start))) / lam
        usage[(account, user)] = usage.get((account, user), 0.0) + used
    return usage


@dataclass
class UsageLedger:
    """decayed_usage kept up to date run by run instead of recomputed over every run: the ended
    runs' sums decay as a whole (every term decays by the same factor), and the runs still going
    are added fresh each time. A run is told once as ended (end) and may be told before as live."""
    half_life: float
    ended: dict[tuple[str, str], float] = field(default_factory=dict)  # valued at `as_of`
    as_of: float = -math.inf
    live: dict[int, Run] = field(default_factory=dict)  # run id -> its run, end None

    def advance(self, now: float) -> None:
        """Value the ended sums at `now` (a clock that went back leaves them as they are)."""
        if now > self.as_of:
            if self.ended and self.as_of > -math.inf:
                k = math.exp(-math.log(2) / self.half_life * (now - self.as_of))
                self.ended = {key: v * k for key, v in self.ended.items() if v * k > 0.0}
            self.as_of = now

    def ended_run(self, run_id: int, run: Run) -> None:
        """An ended run (valued at as_of: advance first); a live one of that id is replaced."""
        self.live.pop(run_id, None)
        for key, used in decayed_usage([run], self.as_of, self.half_life).items():
            self.ended[key] = self.ended.get(key, 0.0) + used

    def usage(self, now: float) -> dict[tuple[str, str], float]:
        """What decayed_usage would give over every run told (runs older than 20 half-lives
        aside, which weigh less than 1e-6 there and are not read)."""
        self.advance(now)
        out = dict(self.ended)
        for key, used in decayed_usage(self.live.values(), self.as_of, self.half_life).items():
            out[key] = out.get(key, 0.0) + used
        return out


@dataclass(frozen=True)
class ShareRow:
    account: str
    user: str | None  # None: the account's own row
    raw_shares: int
    norm_shares: float
    raw_usage: float  # decayed GPU-seconds
    effective_usage: float
    factor: float


def factor(effective_usage: float, norm_shares: float) -> float:
    return 2.0 ** (-effective_usage / norm_shares) if norm_shares > 0 else 0.0


def share_tree(shares: Mapping[str, int], members: Mapping[str, Sequence[str]],
               usage: Mapping[tuple[str, str], float]) -> list[ShareRow]:
    """Rows like sshare's: each account, then its users (sorted). `members`: the users of each
    account (those with usage are added)."""
    users: dict[str, set[str]] = {a: set(members.get(a, ())) for a in shares}
    for (account, user) in usage:
        users.setdefault(account, set()).add(user)
    total_shares = sum(shares.get(a, 1) for a in users) or 1
    total_usage = sum(usage.values())
    rows = []
    for account in sorted(users):
        raw = shares.get(account, 1)
        s_a = raw / total_shares
        acct_usage = sum(v for (a, _), v in usage.items() if a == account)
        e_a = acct_usage / total_usage if total_usage > 0 else 0.0
        rows.append(ShareRow(account, None, raw, s_a, acct_usage, e_a, factor(e_a, s_a)))
        n = len(users[account]) or 1
        for user in sorted(users[account]):
            mine = usage.get((account, user), 0.0)
            u = mine / total_usage if total_usage > 0 else 0.0
            e_u = u + (e_a - u) / n
            rows.append(ShareRow(account, user, 1, s_a / n, mine, e_u, factor(e_u, s_a / n)))
    return rows


def factors(rows: Iterable[ShareRow]) -> dict[tuple[str, str], float]:
    """(account, user) -> fair-share factor, for the snapshot."""
    return {(r.account, r.user): r.factor for r in rows if r.user is not None}
