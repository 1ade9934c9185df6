"""transport/rpc.py's bounds on what a peer has under way: requests in flight per connection and
per Share (the controller: per uid), and bytes of frames being decoded or handled per Share. At a
limit the connection is not read (backpressure): everything is answered, in time."""
from __future__ import annotations

import asyncio

import msgpack
import pytest

from hai_cluster.protocol.codec import HEADER, encode_frame
from hai_cluster.protocol.messages import request
from hai_cluster.transport.memory import memory_pair
from hai_cluster.transport.rpc import ByteBudget, RpcConnection, RpcTable, Share, Shares


class Gauge:
    def __init__(self) -> None:
        self.now = self.most = 0
        self.gate = asyncio.Event()


def table(gauge: Gauge) -> RpcTable:
    t = RpcTable()

    @t.expose("hold")
    async def hold(body, ctx):
        gauge.now += 1
        gauge.most = max(gauge.most, gauge.now)
        try:
            await gauge.gate.wait()
        finally:
            gauge.now -= 1
        return len(body) if isinstance(body, str) else body

    @t.expose("ping")
    async def ping(body, ctx):
        return "pong"

    return t


async def connect(gauge: Gauge, **server_kw):
    (ra, wa), (rb, wb) = memory_pair()
    server = RpcConnection(ra, wa, table=table(gauge), name="server", **server_kw)
    client = RpcConnection(rb, wb, name="client")
    tasks = [asyncio.ensure_future(server.run()), asyncio.ensure_future(client.run())]
    return server, client, tasks


async def settle(predicate, what: str) -> None:
    for _ in range(200):
        if predicate():
            return
        await asyncio.sleep(0.01)
    pytest.fail(what)


def test_requests_in_flight_per_connection_are_capped_and_all_answered():
    async def main():
        gauge = Gauge()
        server, client, tasks = await connect(gauge, max_in_flight=4)
        calls = [asyncio.ensure_future(client.call("hold", i, timeout=None)) for i in range(200)]
        await settle(lambda: gauge.now == 4, "4 requests to be under way")
        await asyncio.sleep(0.1)
        assert gauge.now == 4 and len(server._tasks) == 4  # the rest wait unread, not as tasks
        gauge.gate.set()
        assert await asyncio.gather(*calls) == list(range(200))
        assert gauge.most == 4
        for t in tasks:
            t.cancel()
    asyncio.run(main())


def test_a_share_caps_requests_across_connections_and_spares_others():
    async def main():
        gauge, share = Gauge(), Share(requests=3, nbytes=None)
        conns = [await connect(gauge, max_in_flight=16, share=share) for _ in range(3)]
        calls = [asyncio.ensure_future(c.call("hold", i, timeout=None)) for _, c, _ in conns for i in range(20)]
        await settle(lambda: gauge.now == 3, "3 requests to be under way")
        # Another peer (its own share) is answered at once while this one waits for its own.
        _, other, other_tasks = await connect(Gauge(), max_in_flight=16, share=Share(requests=3, nbytes=None))
        assert await asyncio.wait_for(other.call("ping"), 2) == "pong"
        assert gauge.now == 3
        gauge.gate.set()
        assert sorted(await asyncio.gather(*calls)) == sorted(list(range(20)) * 3)
        assert gauge.most == 3 and share.requests._value == 3
        for _, _, ts in conns + [(None, None, other_tasks)]:
            for t in ts:
                t.cancel()
    asyncio.run(main())


def test_a_share_budgets_bytes_of_frames_being_decoded_or_handled():
    async def main():
        gauge, share = Gauge(), Share(requests=None, nbytes=300_000)
        (s1, c1, t1), (s2, c2, t2) = [await connect(gauge, share=share) for _ in range(2)]
        big = "x" * 200_000
        first = asyncio.ensure_future(c1.call("hold", big, timeout=None))
        await settle(lambda: gauge.now == 1, "the first big request to be handled")
        assert 200_000 < share.budget.used <= 300_000
        second = asyncio.ensure_future(c2.call("hold", big, timeout=None))
        await asyncio.sleep(0.2)
        assert gauge.now == 1, "the second frame was decoded beyond the budget"
        gauge.gate.set()
        assert await first == 200_000 and await second == 200_000
        await settle(lambda: share.budget.used == 0, "the budget to be given back")
        for t in t1 + t2:
            t.cancel()
    asyncio.run(main())


def test_a_frame_left_half_sent_or_broken_gives_its_bytes_back():
    async def main():
        share = Share(requests=None, nbytes=1_000_000)
        (ra, wa), (rb, wb) = memory_pair()
        server = RpcConnection(ra, wa, table=table(Gauge()), name="server", share=share)
        run = asyncio.ensure_future(server.run())
        payload = msgpack.packb(request(1, "ping", "x" * 500_000))
        wb.write(HEADER.pack(len(payload)) + payload[:1000])
        await settle(lambda: share.budget.used == len(payload), "the frame to be charged")
        wb.write(b"\xc1" * 10)  # not the string it announced: garbage mid-frame
        wb.write(payload[1000:])
        await asyncio.wait_for(run, 2)
        assert "protocol error" in server.close_reason and share.budget.used == 0
    asyncio.run(main())


def test_closing_with_requests_in_flight_frees_their_slots():
    async def main():
        gauge, share = Gauge(), Share(requests=2, nbytes=10_000)
        server, client, tasks = await connect(gauge, max_in_flight=2, share=share)
        calls = [asyncio.ensure_future(client.call("hold", i, timeout=None)) for i in range(5)]
        await settle(lambda: gauge.now == 2, "2 requests to be under way")
        await server.close()
        await settle(lambda: share.requests._value == 2 and share.budget.used == 0, "slots and bytes back")
        for c in calls:
            c.cancel()
        for t in tasks:
            t.cancel()
    asyncio.run(main())


def test_byte_budget_serves_waiters_in_turn_and_survives_cancellation():
    async def main():
        budget = ByteBudget(100)
        assert await budget.take(60) == 60 and budget.fits(40) and not budget.fits(41)
        big = asyncio.ensure_future(budget.take(80))
        small = asyncio.ensure_future(budget.take(10))  # fits, but waits its turn behind the big one
        await asyncio.sleep(0)
        assert not big.done() and not small.done()
        big.cancel()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert small.done() and budget.used == 70
        budget.give(70)
        assert await budget.take(500) == 100 and budget.used == 100  # over the whole budget: all of it
        budget.give(100)
        assert budget.used == 0
    asyncio.run(main())


def test_shares_are_per_key_and_dropped_with_the_last_connection():
    shares = Shares(requests=4, nbytes=1000)
    a1, a2, b = shares.open(1000), shares.open(1000), shares.open(1001)
    assert a1 is a2 and a1 is not b
    shares.close(1000)
    assert shares.open(1000) is a1
    shares.close(1000), shares.close(1000), shares.close(1001)
    assert shares.open(1000) is not a1


def test_pipelined_frames_in_one_read_are_served_within_the_cap():
    """20,000 requests written at once: answered, never more than the cap under way."""
    async def main():
        gauge = Gauge()
        (ra, wa), (rb, wb) = memory_pair()
        server = RpcConnection(ra, wa, table=table(gauge), name="server", max_in_flight=16,
                               share=Share(requests=32, nbytes=1 << 24))
        run = asyncio.ensure_future(server.run())
        wb.write(b"".join(encode_frame(request(i, "hold", i)) for i in range(20_000)))
        await settle(lambda: gauge.now == 16, "16 requests to be under way")
        await asyncio.sleep(0.1)
        assert gauge.now == 16 and len(server._tasks) == 16
        gauge.gate.set()
        answered, buf = 0, b""
        while answered < 20_000:
            buf += await asyncio.wait_for(rb.read(1 << 16), 10)
            while len(buf) >= 4 and len(buf) >= 4 + HEADER.unpack_from(buf)[0]:
                buf = buf[4 + HEADER.unpack_from(buf)[0]:]
                answered += 1
        assert gauge.most <= 16
        run.cancel()
    asyncio.run(main())


def test_access_keys_for_request_limits(tmp_path):
    from hai_cluster.config import ConfigError, load_controller_config

    def load(access: str):
        path = tmp_path / "c.toml"
        path.write_text(f'[controller]\nsocket = "/tmp/x.sock"\ndatabase = "sqlite://"\n[access]\n{access}\n')
        return load_controller_config(path).access

    a = load("")
    assert (a.max_request_bytes, a.max_requests_in_flight, a.max_requests_in_flight_per_uid,
            a.max_request_bytes_per_uid) == (8 << 20, 16, 32, 16 << 20)
    a = load("max_request_bytes = 16777216\nmax_requests_in_flight = 0\nmax_request_bytes_per_uid = 0")
    assert (a.max_request_bytes, a.max_requests_in_flight, a.max_request_bytes_per_uid) == (16 << 20, 0, 0)
    with pytest.raises(ConfigError, match="max_request_bytes .4194304. is too small for a submission"):
        load("max_request_bytes = 4194304")  # the default max_script_bytes alone
    with pytest.raises(ConfigError, match="max_request_bytes_per_uid .* must be at least max_request_bytes"):
        load("max_request_bytes_per_uid = 1000000")
    with pytest.raises(ConfigError, match="max_request_bytes must be from 1024"):
        load("max_request_bytes = 10")
    with pytest.raises(ConfigError, match="max_requests_in_flight_per_uid must be >= 0"):
        load("max_requests_in_flight_per_uid = -1")


def test_a_peers_unread_replies_fit_its_share_and_the_rest_wait_to_be_written():
    """Eleventh audit: replies were written whatever the peer had left unread, so one that read
    nothing kept 32 x 10,000-row pages (2 GB) in the controller. A reply now waits for room in
    its share's budget of unread reply bytes, holding only its encoded bytes, and goes out once
    the peer reads."""
    import socket

    async def main():
        t = RpcTable()

        @t.expose("big")
        async def big(body, ctx):
            return "x" * 600_000

        ours, theirs = socket.socketpair()
        theirs.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        share = Share(None, 1_000_000)
        reader, writer = await asyncio.open_unix_connection(sock=ours)
        server = RpcConnection(reader, writer, table=t, name="server", share=share, frame_timeout=30)
        task = asyncio.ensure_future(server.run())
        theirs.sendall(encode_frame(request(1, "big", None)) + encode_frame(request(2, "big", None)))
        await settle(lambda: share.replies.used > 0 and share.replies._waiters, "one reply written, one waiting")
        assert share.replies.used < 1_000_000 and len(share.replies._waiters) == 1
        theirs.setblocking(False)
        got = b""
        for _ in range(500):  # the peer reads now: both replies come, one after the other
            try:
                got += theirs.recv(1 << 20)
            except BlockingIOError:
                await asyncio.sleep(0.01)
            if len(got) > 1_200_000 and not share.replies.used:
                break
        assert len(got) > 1_200_000 and share.replies.used == 0 and not share.replies._waiters
        await server.close()
        task.cancel()
        theirs.close()

    asyncio.run(main())
