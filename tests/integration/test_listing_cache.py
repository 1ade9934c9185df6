"""The listing cache (controller/listing_cache.py) against a real store: what squeue and sacct read
is kept only while no write has committed through the controller's engine (store/generation.py)."""
import asyncio

import pytest
from sqlalchemy import select, text

from hai_cluster.controller.listing_cache import ListingCache
from hai_cluster.core.model import JobSpec
from hai_cluster.store.engine import make_engine, upgrade
from hai_cluster.store.generation import WriteGeneration
from hai_cluster.store.lease import FencedEngine
from hai_cluster.store.repository import Repository
from hai_cluster.store.schema import jobs


@pytest.fixture(params=["sqlite", "postgresql"])
def repo(request, tmp_path):
    url = f"sqlite:///{tmp_path}/hai.db" if request.param == "sqlite" else request.getfixturevalue("postgres_url")
    eng = make_engine(url)
    upgrade(eng)
    yield Repository(eng)
    eng.dispose()


def submit(repo, name="j"):
    return repo.submit(JobSpec(script="#!/bin/sh\ntrue\n", workdir="/tmp", name=name), user="u", uid=1000,
                       gid=1000, partition="gpu", now=1.0)


def test_reads_and_read_only_commits_keep_the_generation_writes_move_it(repo):
    gen = WriteGeneration(repo.engine)
    first = submit(repo)
    g = gen.value
    assert g > 0  # the submission committed through the engine
    repo.jobs_page(limit=10)
    with repo.engine.begin() as c:  # a transaction that only reads, committed (as set_reasons' each tick)
        c.execute(select(jobs.c.id)).all()
        c.execute(text("SELECT 1"))
    repo.set_reasons({first: "JobHeldUser"})  # the reason it has, or a new one
    g = gen.value
    repo.set_reasons({first: "JobHeldUser"})  # unchanged: no write
    assert gen.value == g
    repo.set_reasons({first: "Priority"})  # changed: a write
    assert gen.value > g
    g = gen.value
    with pytest.raises(RuntimeError):
        with repo.engine.begin() as c:
            c.execute(jobs.update().where(jobs.c.id == first).values(name="x"))
            raise RuntimeError("rolled back")
    assert gen.value > g  # counted all the same: nothing read inside it may be kept
    assert repo.jobs_page(ids=[first]).rows[0]["name"] == "j"
    gen.close()
    g = gen.value
    submit(repo)
    assert gen.value == g  # closed: no longer listening


def test_writes_through_the_leader_s_fenced_engine_are_counted(repo):
    """The controller under a lease writes through a FencedEngine (store/lease.py): its writes count."""
    fenced = Repository(FencedEngine(repo.engine, lambda c: None))
    gen = WriteGeneration(fenced.engine)
    g = gen.value
    fenced.jobs_page(limit=10)
    assert gen.value == g
    submit(fenced)
    assert gen.value > g


def listing(repo, reads):
    async def read():
        reads.append(1)
        rows = repo.jobs_page(limit=100).rows
        return [r["name"] for r in rows], len(rows)
    return read


def test_a_listing_is_served_until_the_next_write(repo):
    cache = ListingCache(WriteGeneration(repo.engine))
    submit(repo, "a")
    reads = []
    get = lambda: asyncio.run(cache.get(("jobs",), listing(repo, reads)))  # noqa: E731
    assert get() == ["a"] and get() == ["a"] and len(reads) == 1
    repo.set_reasons({1: "Priority"})
    repo.set_reasons({1: "Priority"})  # the scheduler's pass, tick after tick, changing nothing
    get()
    reads.clear()
    assert get() == ["a"] and not reads
    submit(repo, "b")
    assert get() == ["a", "b"] and len(reads) == 1
    assert asyncio.run(cache.get(("other",), listing(repo, reads))) == ["a", "b"] and len(reads) == 2  # its own key


def test_a_write_during_the_read_is_not_kept(repo):
    cache = ListingCache(WriteGeneration(repo.engine))
    submit(repo, "a")
    reads = []

    async def read_then_a_write_lands():
        value = await listing(repo, reads)()
        submit(repo, "late")  # committed after the rows were read, before they were kept
        return value

    assert asyncio.run(cache.get(("jobs",), read_then_a_write_lands)) == ["a"]
    assert asyncio.run(cache.get(("jobs",), listing(repo, reads))) == ["a", "late"]


def test_the_cache_keeps_at_most_max_rows(repo):
    cache = ListingCache(WriteGeneration(repo.engine), max_rows=3)
    reads = []

    def read(n):
        async def f():
            reads.append(n)
            return n, n
        return f
    for key, n in (("a", 2), ("b", 1), ("c", 2), ("big", 4)):
        asyncio.run(cache.get(key, read(n)))
    reads.clear()
    for key, n in (("c", 2), ("b", 1), ("a", 2), ("big", 4)):
        asyncio.run(cache.get(key, read(n)))
    assert reads == [2, 4]  # "a" went first (least recently used), "big" was never kept
