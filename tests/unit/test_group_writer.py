"""GroupWriter: a lone write goes at once; writes that arrive while one is on the store share the
next transaction; each caller gets its own result or the store's error."""
import asyncio

import pytest

from hai_cluster.controller.batching import GroupWriter


class Store:
    """A store thread stand-in: each write_many call is one 'transaction'; gate holds it open."""

    def __init__(self):
        self.transactions: list[list] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail = False

    async def db(self, fn, items):
        await self.gate.wait()
        if self.fail:
            raise RuntimeError("store down")
        return fn(items)

    def write_many(self, items):
        self.transactions.append(list(items))
        return [f"done {i}" for i in items]


def test_a_lone_write_is_its_own_transaction():
    async def main():
        s = Store()
        w = GroupWriter(s.db, s.write_many)
        assert await w(1) == "done 1"
        assert await w(2) == "done 2"
        return s.transactions
    assert asyncio.run(main()) == [[1], [2]]


def test_writes_queued_behind_a_busy_store_share_one_transaction_in_order():
    async def main():
        s = Store()
        s.gate.clear()  # the first write sits on the store
        w = GroupWriter(s.db, s.write_many)
        first = asyncio.ensure_future(w(0))
        await asyncio.sleep(0)
        rest = [asyncio.ensure_future(w(i)) for i in range(1, 6)]
        await asyncio.sleep(0)
        s.gate.set()
        return s, await first, await asyncio.gather(*rest)
    s, first, rest = asyncio.run(main())
    assert s.transactions == [[0], [1, 2, 3, 4, 5]]
    assert first == "done 0" and rest == [f"done {i}" for i in range(1, 6)]


def test_a_failed_transaction_fails_its_callers_and_the_next_one_still_runs():
    async def main():
        s = Store()
        s.gate.clear()
        w = GroupWriter(s.db, s.write_many)
        s.fail = True
        a, b = asyncio.ensure_future(w("a")), asyncio.ensure_future(w("b"))
        await asyncio.sleep(0)
        s.gate.set()
        results = await asyncio.gather(a, b, return_exceptions=True)
        s.fail = False
        return results, await w("c"), s.transactions
    results, c, transactions = asyncio.run(main())
    assert all(isinstance(r, RuntimeError) for r in results)
    assert c == "done c" and transactions == [["c"]]


def test_none_from_write_many_means_none_for_each():
    async def main():
        w = GroupWriter(Store().db, lambda items: None)
        return await asyncio.gather(w(1), w(2))
    assert asyncio.run(main()) == [None, None]


@pytest.mark.parametrize("steps", [1, 2])  # cancelled before it ran, and while on the store
def test_cancelling_the_writer_cancels_its_waiters(steps):
    async def main():
        s = Store()
        s.gate.clear()
        w = GroupWriter(s.db, s.write_many)
        a = asyncio.ensure_future(w("a"))
        for _ in range(steps):
            await asyncio.sleep(0)
        w._task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(a, 5)
        s.gate.set()
        return await w("b")  # a new writer for the next call
    assert asyncio.run(main()) == "done b"
