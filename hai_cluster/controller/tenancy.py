"""Accounts, limits and fair share at the controller's edge.

The config (`[limits]`, `[[accounts]]`, `[fairshare]`) gives the starting values; admins change
limits and shares live (`hcontrol update Account=... / User=...`), stored in the `limits` table,
which wins over the config. At submission the pending and total job counts are checked; the
running-GPU limits and the fair-share factors go into each snapshot for the pure core
(core/quota.py, core/fairshare.py).
"""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from ..config import DEFAULT_ACCOUNT, ControllerConfig, LimitsConfig
from ..core import fairshare
from ..core.model import Snapshot
from ..core.quota import Quotas
from ..store import accounts as store
from ..transport.rpc import RequestError
from .access import Caller, deny, group_names, matches
from .submitcounts import NEAR, SubmissionCounts
from .usage import UsageTracker

FAIRSHARE_REFRESH = 10.0  # seconds between recomputations of the decayed usage
# Seconds the live limits are kept between reads: every submission and every pass wants them, and
# only `update` (which forgets them at once) changes them, unless another controller did before
# a takeover.
OVERRIDES_REFRESH = 2.0


class Tenancy:
    def __init__(self, cfg: ControllerConfig) -> None:
        self.cfg = cfg
        self.configured = {a.name: a for a in cfg.accounts}
        self._factors: dict[tuple[str, str], float] = {}
        self._rows: list[fairshare.ShareRow] = []
        self._computed_at = -1e18
        self._overrides: dict | None = None
        self._overrides_at = 0.0
        self._counts: SubmissionCounts | None = None  # per store engine (a takeover brings a new one)
        self._counts_engine = None
        self._usage: UsageTracker | None = None  # per store engine, as the counts
        self._usage_engine = None

    # ---- accounts and their users -----------------------------------------------------
    @property
    def account_names(self) -> list[str]:
        return list(dict.fromkeys([*self.configured, DEFAULT_ACCOUNT]))

    def accounts_of(self, caller: Caller) -> list[str]:
        """The accounts listing the caller (by name or group), in config order; else the default."""
        needs_groups = any(e.startswith("@") for a in self.cfg.accounts for e in a.users)
        groups = group_names(caller.user, caller.gid) if needs_groups else set()
        mine = [a.name for a in self.cfg.accounts if matches(a.users, caller.user, groups)]
        return mine or [DEFAULT_ACCOUNT]

    def account_for(self, caller: Caller, asked: str | None) -> str:
        mine = self.accounts_of(caller)
        if asked is None:
            return mine[0]
        if asked not in self.account_names:
            raise RequestError(f"Invalid account specified: {asked} (known: {', '.join(self.account_names)})")
        if asked not in mine and not caller.admin:
            raise deny(caller, f"user {caller.user} is not in account {asked} (yours: {', '.join(mine)})")
        return asked

    # ---- limits ------------------------------------------------------------------------
    def _limits(self, kind: str, name: str, overrides: dict) -> LimitsConfig:
        if kind == "user":
            base = self.cfg.user_limits
        else:
            acct = self.configured.get(name)
            base = acct.limits if acct else LimitsConfig()
        over = overrides.get((kind, name), {})
        return replace(base, **{k: over[k] for k in ("max_gpus", "max_pending", "max_jobs")
                                if over.get(k) is not None})

    def shares(self, overrides: dict) -> dict[str, int]:
        out = {}
        for name in self.account_names:
            acct = self.configured.get(name)
            set_live = overrides.get(("account", name), {}).get("shares")
            out[name] = set_live if set_live is not None else (acct.shares if acct else 1)
        return out

    def check_submission(self, engine, caller: Caller, account: str, adding: int = 1, adding_bytes: int = 0) -> None:
        """Runs on the store thread, right before the insert: the counts cannot move in between.
        `adding` is how many jobs the submission makes (every task of an array counts),
        `adding_bytes` what its spec takes in the store (an array's once)."""
        over = self._live_overrides(engine)
        user_lim, acct_lim = self._limits("user", caller.user, over), self._limits("account", account, over)
        if not (user_lim.max_pending or user_lim.max_jobs or user_lim.max_pending_bytes
                or acct_lim.max_pending or acct_lim.max_jobs):
            return
        key = (caller.user, account if acct_lim.max_pending or acct_lim.max_jobs else None)
        if self._counts is None or self._counts_engine is not engine:
            self._counts = SubmissionCounts(lambda k: store.job_counts(engine, *k))
            self._counts_engine = engine
        checks = ((user_lim.max_pending, "user_pending", adding, f"user {caller.user}: pending jobs"),
                  (user_lim.max_jobs, "user_jobs", adding, f"user {caller.user}: jobs"),
                  (user_lim.max_pending_bytes, "user_pending_bytes", adding_bytes,
                   f"user {caller.user}: bytes of pending job scripts and environments"),
                  (acct_lim.max_pending, "account_pending", adding, f"account {account}: pending jobs"),
                  (acct_lim.max_jobs, "account_jobs", adding, f"account {account}: jobs"))
        n = self._counts.get(key)
        if any(limit and n[k] + add > NEAR * limit for limit, k, add, _ in checks):
            n = self._counts.get(key, fresh=True)  # near a limit: on the store's own numbers
        for limit, k, add, what in checks:
            if limit and n[k] + add > limit:
                raise RequestError(f"Job violates accounting/QOS policy (job submit limit, {what} "
                                   f"{n[k]} of at most {limit}); wait for some to end")
        self._counts.added(key, adding, adding_bytes)

    def _live_overrides(self, engine) -> dict:
        """store.overrides, read at most every OVERRIDES_REFRESH seconds (on the store thread)."""
        if self._overrides is None or time.monotonic() - self._overrides_at >= OVERRIDES_REFRESH:
            self._overrides, self._overrides_at = store.overrides(engine), time.monotonic()
        return self._overrides

    def update(self, engine, caller: Caller, kind: str, name: str, values: dict[str, Any]) -> dict:
        if not caller.admin:
            raise deny(caller, f"only administrators may change the limits of {kind} {name}")
        if kind == "account" and name not in self.account_names:
            raise RequestError(f"Invalid account specified: {name} (accounts come from [[accounts]] in the "
                               f"controller config; known: {', '.join(self.account_names)})")
        if kind == "user" and "shares" in values:
            raise RequestError("Shares are set per account (users in an account weigh the same)")
        store.set_override(engine, kind, name, values, caller.user, time.time())
        self._overrides = None
        over = self._live_overrides(engine)
        self._computed_at = -1e18  # shares may have changed
        lim = self._limits(kind, name, over)
        out = {"kind": kind, "name": name, "max_gpus": lim.max_gpus, "max_pending": lim.max_pending,
               "max_jobs": lim.max_jobs}
        if kind == "account":
            out["shares"] = self.shares(over)[name]
        return out

    def listing(self, engine) -> list[dict]:
        """Every account and every user with a limit set, with the limits in force."""
        over = store.overrides(engine)
        shares = self.shares(over)
        rows = [{"kind": "account", "name": a, "shares": shares[a], "users": list(self.configured[a].users)
                 if a in self.configured else [], **vars(self._limits("account", a, over))}
                for a in self.account_names]
        rows.append({"kind": "user", "name": "*", **vars(self.cfg.user_limits)})
        rows += [{"kind": "user", "name": name, **vars(self._limits("user", name, over))}
                 for kind, name in sorted(over) if kind == "user"]
        rows += [{"kind": "class", "name": name, "max_gpus": gpus} for name, gpus in self.cfg.class_limits]
        return rows

    # ---- the snapshot ------------------------------------------------------------------
    def extras(self, engine, now: float) -> tuple[Quotas, dict[tuple[str, str], float]]:
        """Quotas and fair-share factors for a snapshot taken at `now` (store thread)."""
        over = self._live_overrides(engine)
        users = {name: self._limits("user", name, over).max_gpus for kind, name in over if kind == "user"}
        quotas = Quotas(user_gpus=users, default_user_gpus=self.cfg.user_limits.max_gpus,
                        account_gpus={a: self._limits("account", a, over).max_gpus for a in self.account_names},
                        class_user_gpus=dict(self.cfg.class_limits),
                        qos_user_gpus={q.name: q.max_gpus_per_user for q in self.cfg.qos if q.max_gpus_per_user},
                        qos_user_jobs={q.name: q.max_jobs_per_user for q in self.cfg.qos if q.max_jobs_per_user})
        if self.cfg.fairshare.enabled and (now - self._computed_at >= FAIRSHARE_REFRESH or self._catching_up(engine)):
            self._refresh_rows(engine, now, over)
        return quotas, (self._factors if self.cfg.fairshare.enabled else {})

    def _catching_up(self, engine) -> bool:
        return self._usage is None or self._usage_engine is not engine or self._usage.behind

    def _refresh_rows(self, engine, now: float, over: dict | None) -> None:
        self._rows = self.share_rows(engine, now, over)
        self._factors = fairshare.factors(self._rows)
        self._computed_at = now

    def current_rows(self, engine, now: float) -> list[fairshare.ShareRow]:
        """hshare: the rows of the last refresh if it is recent (what the scheduler uses), else
        fresh ones; never a read of the whole history per request."""
        if now - self._computed_at >= FAIRSHARE_REFRESH or self._catching_up(engine):
            self._refresh_rows(engine, now, None)
        return self._rows

    def share_rows(self, engine, now: float, over: dict | None = None) -> list[fairshare.ShareRow]:
        over = store.overrides(engine) if over is None else over
        if self._usage is None or self._usage_engine is not engine:
            self._usage, self._usage_engine = UsageTracker(self.cfg.fairshare.half_life), engine
        usage = self._usage.refresh(engine, now)
        members: dict[str, list[str]] = {a.name: [u for u in a.users if not u.startswith("@")]
                                         for a in self.cfg.accounts}
        for account, user in store.open_members(engine):
            members.setdefault(account, []).append(user)
        return fairshare.share_tree(self.shares(over), members, usage)

    def extend(self, engine, snapshot: Snapshot) -> Snapshot:
        quotas, factors = self.extras(engine, snapshot.now)
        return replace(snapshot, quotas=quotas, fairshare=factors)
