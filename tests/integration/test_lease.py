"""The controller lease on a real PostgreSQL: one holder at a time, takeover only after expiry,
the epoch fences every write of an old leader, and a takeover waits for a write under way.
SQLite: a second controller on the same file is refused."""
from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import DBAPIError

from hai_cluster.core.model import JobSpec
from hai_cluster.store.lease import Fenced, FencedEngine, LeaseStore, StoreInUse
from hai_cluster.store.repository import Repository
from hai_cluster.store.schema import jobs

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _submit(repo: Repository) -> int:
    return repo.submit(JobSpec(script="#!/bin/sh\ntrue\n", workdir="/tmp", name="x"), user="u", uid=1000, gid=1000, partition="gpu", now=time.time())


def _count(store: LeaseStore) -> int:
    with store.engine.connect() as c:
        return c.execute(select(func.count()).select_from(jobs)).scalar()


def _fenced(store: LeaseStore, epoch: int) -> Repository:
    return Repository(FencedEngine(store.engine, lambda c: store.check_epoch(c, epoch)))


def test_takeover_after_expiry_fences_the_old_leader(postgres_url):
    a, b = LeaseStore(postgres_url, 1.0), LeaseStore(postgres_url, 1.0)
    try:
        a.migrate()
        b.migrate()  # a second migration (the standby starting) is a no-op
        assert a.acquire("host-a:/s") == (1, None)
        epoch, other = b.acquire("host-b:/s")
        assert epoch is None and other.holder == "host-a:/s" and other.epoch == 1
        old = _fenced(a, 1)
        _submit(old)
        assert a.renew(1)
        time.sleep(1.3)  # a stops renewing (killed, stopped, cut off)
        assert b.acquire("host-b:/s")[0] == 2
        before = _count(a)
        with pytest.raises(Fenced, match=r"not the active controller \(active: host-b:/s\)"):
            _submit(old)
        assert _count(a) == before  # the refused write left nothing
        assert not a.renew(1)
        assert b.current().holder == "host-b:/s"
        _submit(_fenced(b, 2))
        # the same host and socket coming back (a restart) takes the lease at once, with a new epoch
        assert b.acquire("host-b:/s")[0] == 3
        b.release(3)
        assert a.acquire("host-a:/s")[0] == 4  # released: no wait
    finally:
        a.close()
        b.close()


def test_takeover_waits_for_a_write_under_way(postgres_url):
    # 2 s: longer than the takeover's 1 s lock timeout, shorter than what would end a's session
    a, b = LeaseStore(postgres_url, 2.0), LeaseStore(postgres_url, 2.0)
    try:
        a.migrate()
        assert a.acquire("a")[0] == 1
        time.sleep(2.2)  # expired, but a is in the middle of a fenced write
        inside, release = threading.Event(), threading.Event()

        def slow_write():
            with FencedEngine(a.engine, lambda c: a.check_epoch(c, 1)).begin() as c:
                c.execute(jobs.delete().where(jobs.c.id == -1))
                inside.set()
                release.wait(10)
        t = threading.Thread(target=slow_write)
        t.start()
        assert inside.wait(10)
        with pytest.raises(DBAPIError):  # lock timeout: the takeover is ordered after the write
            b.acquire("b")
        release.set()
        t.join(10)
        assert b.acquire("b")[0] == 2
    finally:
        a.close()
        b.close()


def test_second_controller_on_one_sqlite_file_is_refused(short_tmp):
    url = f"sqlite:///{short_tmp}/hai.db"
    a, b = LeaseStore(url, 5.0), LeaseStore(url, 5.0)
    try:
        a.lock_single("host:/a.sock")
        with pytest.raises(StoreInUse, match="in use by another controller .*host:/a.sock.*one controller only"):
            b.lock_single("host:/b.sock")
        a.migrate()
        assert a.acquire("host:/a.sock")[0] == 1
        assert a.acquire("host:/a.sock")[0] == 2  # SQLite: the lock file proves no one else lives
    finally:
        a.close()
        b.close()
    c = LeaseStore(url, 5.0)
    try:
        c.lock_single("host:/c.sock")  # the first one is gone: free again
    finally:
        c.close()
