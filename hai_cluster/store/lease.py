"""The controller lease and the fence on every write.

PostgreSQL lets two controllers share a store, one active and one standby. Which one is active is
one row of `controller_lease`: holder (host:socket), epoch and expiry, on the database's clock so
the controllers' clocks do not matter.

- `acquire`: in one transaction, lock the row (FOR UPDATE, short lock timeout) and take it when it
  has expired or is already ours (same host and socket: our own restart; the socket check at start
  refuses a second daemon on a live socket), bumping the epoch.
- `renew`: push the expiry out WHERE epoch = ours; no row means someone took over.
- the fence (`check_epoch`): every write transaction of the active controller first reads the row
  FOR SHARE and compares the epoch. The share lock lasts to commit and a takeover needs the row
  exclusively, so a takeover is ordered after every write that passed the check, and every write
  after a takeover sees the new epoch: an old leader that wakes up (SIGSTOP, a stalled VM) cannot
  change the store. Its sessions end after `idle_in_transaction_session_timeout` (the lease
  duration), so a leader stopped inside a transaction cannot hold the row forever.

We chose a lease row over a session advisory lock because an advisory lock lives as long as a TCP
session: a leader cut off from the database keeps believing it holds it until its socket times out,
and the lock carries no epoch to fence with. The row gives both the epoch and a bounded takeover.

SQLite serves one controller only: a lock file beside the database (held while the process lives)
makes a second controller on the same file refuse to start.
"""
from __future__ import annotations

import fcntl
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

from sqlalchemy import Engine, create_engine, insert, select, text, update

from .engine import _alembic_config, access_error, make_engine, upgrade
from .schema import controller_lease

LEASE = "controller"
MIGRATION_LOCK = 0x68616901  # pg_advisory_xact_lock key: two controllers starting at once migrate in turn


# Built once: the fence runs in every write transaction, and building a statement (and its cache
# key) costs more than running this one on SQLite.
_FENCE = select(controller_lease.c.epoch, controller_lease.c.holder).where(controller_lease.c.name == LEASE)
_FENCE_SHARED = _FENCE.with_for_update(read=True)  # FOR SHARE, held to commit: a takeover waits for us


class Fenced(Exception):
    """A write refused: this controller's epoch is no longer the current one."""


class StoreInUse(Exception):
    """An SQLite store already used by a live controller."""


@dataclass(frozen=True)
class LeaseState:
    holder: str
    epoch: int
    expires_in: float  # seconds from now (negative: expired)


def sqlite_path(url: str) -> str | None:
    if not url.startswith("sqlite"):
        return None
    path = url.split("///", 1)[1] if "///" in url else ""
    return None if path in ("", ":memory:") else path


class LeaseStore:
    """Synchronous; the controller calls it from its own lease thread."""

    def __init__(self, url: str, duration: float) -> None:
        self.url = url
        self.duration = duration
        self.postgres = not url.startswith("sqlite")
        if self.postgres:
            ms = int(duration * 1000)
            self.engine: Engine = create_engine(url, pool_pre_ping=True, connect_args={
                "options": f"-c idle_in_transaction_session_timeout={ms}"})
        else:
            self.engine = make_engine(url)
        self._lock_fd: int | None = None

    def lock_single(self, holder: str) -> None:
        """SQLite: make sure no other controller uses this file, for as long as this process lives."""
        path = sqlite_path(self.url)
        if self.postgres or path is None:
            return
        lock = os.path.abspath(path) + ".controller.lock"
        os.makedirs(os.path.dirname(lock), exist_ok=True)
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except PermissionError as exc:
            raise access_error(lock, exc) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.pread(fd, 500, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise StoreInUse(f"the SQLite store {path} is in use by another controller ({owner}); SQLite "
                             f"supports one controller only: use PostgreSQL to run a standby") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{holder}, pid {os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    def migrate(self) -> None:
        if not self.postgres:
            upgrade(self.engine)
            return
        from alembic import command

        with self.engine.begin() as conn:
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": MIGRATION_LOCK})
            command.upgrade(_alembic_config(conn), "head")

    def _now(self, c) -> float:
        if self.postgres:
            return float(c.execute(text("SELECT extract(epoch FROM clock_timestamp())")).scalar())
        return time.time()

    def acquire(self, holder: str) -> tuple[int | None, LeaseState | None]:
        """Take the lease if it is free, expired or ours: (new epoch, None). Otherwise (None, who
        holds it). SQLite takes it at once: the lock file already proved no other controller lives."""
        with self.engine.begin() as c:
            q = select(controller_lease).where(controller_lease.c.name == LEASE)
            if self.postgres:
                c.execute(text("SET LOCAL lock_timeout = '1s'"))  # a leader's write holds the row shared
                q = q.with_for_update()
            row = c.execute(q).first()
            now = self._now(c)
            if row is None:
                c.execute(insert(controller_lease).values(name=LEASE, holder=holder, epoch=1,
                                                          expires_at=now + self.duration, acquired_at=now))
                return 1, None
            if self.postgres and row.holder != holder and row.expires_at > now:
                return None, LeaseState(row.holder, row.epoch, row.expires_at - now)
            c.execute(update(controller_lease).where(controller_lease.c.name == LEASE).values(
                holder=holder, epoch=row.epoch + 1, expires_at=now + self.duration, acquired_at=now))
            return row.epoch + 1, None

    def renew(self, epoch: int) -> bool:
        """Extend our lease. False: another controller has taken over (the epoch moved on)."""
        with self.engine.begin() as c:
            now = self._now(c)
            res = c.execute(update(controller_lease).where(
                controller_lease.c.name == LEASE, controller_lease.c.epoch == epoch).values(
                expires_at=now + self.duration))
            return res.rowcount == 1

    def release(self, epoch: int) -> None:
        """A clean shutdown: expire our lease now so the standby need not wait it out."""
        with self.engine.begin() as c:
            c.execute(update(controller_lease).where(
                controller_lease.c.name == LEASE, controller_lease.c.epoch == epoch).values(expires_at=0.0))

    def current(self) -> LeaseState | None:
        with self.engine.connect() as c:
            row = c.execute(select(controller_lease).where(controller_lease.c.name == LEASE)).first()
            return None if row is None else LeaseState(row.holder, row.epoch, row.expires_at - self._now(c))

    def check_epoch(self, c, epoch: int) -> None:
        """The fence, run first in every write transaction of the active controller."""
        row = c.execute(_FENCE_SHARED if self.postgres else _FENCE).first()
        if row is None or row.epoch != epoch:
            active = row.holder if row is not None else "none"
            raise Fenced(f"not the active controller (active: {active}); this controller's epoch {epoch} "
                         f"was superseded by epoch {row.epoch if row is not None else '?'}")

    def close(self) -> None:
        self.engine.dispose()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


class FencedEngine:
    """What the repository writes through: every `begin()` transaction starts with the fence.
    Reads (`connect()`) go straight to the engine."""

    def __init__(self, engine: Engine, check: Callable[[object], None]) -> None:
        self._engine = engine
        self._check = check

    @contextmanager
    def begin(self) -> Iterator:
        with self._engine.begin() as c:
            self._check(c)
            yield c

    def connect(self):
        return self._engine.connect()

    @property
    def sa_engine(self) -> Engine:
        """The engine itself: event listeners go on it (store/generation.py), not on this wrapper."""
        return self._engine

    def __getattr__(self, name: str):
        return getattr(self._engine, name)
