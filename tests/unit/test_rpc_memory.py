import asyncio

import pytest

from hai_cluster.protocol.codec import HEADER
from hai_cluster.transport.memory import memory_pair
from hai_cluster.transport.rpc import ConnectionLost, RequestError, RpcConnection, RpcError, RpcTable


def make_table():
    table = RpcTable()

    @table.expose("echo")
    async def echo(body, ctx):
        return {"body": body, "ctx": ctx}

    @table.expose("refuse")
    async def refuse(body, ctx):
        raise RequestError("no such job")

    @table.expose("crash")
    async def crash(body, ctx):
        raise ZeroDivisionError("boom")

    @table.expose("slow")
    async def slow(body, ctx):
        await asyncio.sleep(10)

    return table


async def pair(on_event=None):
    (ra, wa), (rb, wb) = memory_pair()
    server = RpcConnection(ra, wa, table=make_table(), context="alice", name="server")
    client = RpcConnection(rb, wb, on_event=on_event, name="client")
    tasks = [asyncio.ensure_future(server.run()), asyncio.ensure_future(client.run())]
    return server, client, tasks, wb


def test_calls_errors_and_events():
    async def main():
        seen = []

        async def on_event(name, body):
            seen.append((name, body))

        server, client, tasks, _ = await pair(on_event)
        assert await client.call("echo", [1, 2]) == {"body": [1, 2], "ctx": "alice"}
        with pytest.raises(RpcError, match="no such job"):
            await client.call("refuse")
        with pytest.raises(RpcError, match="internal error in crash: boom"):
            await client.call("crash")
        with pytest.raises(RpcError, match="not allowed"):
            await client.call("shutdown_everything")
        await server.push("run_exited", {"job_id": 7})
        for _ in range(50):
            if seen:
                break
            await asyncio.sleep(0.01)
        assert seen == [("run_exited", {"job_id": 7})]
        # Concurrent calls are matched to their own answers.
        results = await asyncio.gather(*(client.call("echo", i) for i in range(20)))
        assert [r["body"] for r in results] == list(range(20))
        await client.close()
        await server.close()
        for t in tasks:
            t.cancel()
    asyncio.run(main())


def test_pending_call_fails_when_peer_goes_away():
    async def main():
        server, client, tasks, _ = await pair()
        call = asyncio.ensure_future(client.call("slow"))
        await asyncio.sleep(0.05)
        await server.close()
        with pytest.raises(ConnectionLost):
            await call
        for t in tasks:
            t.cancel()
    asyncio.run(main())


def test_garbage_closes_only_that_connection():
    async def main():
        server, client, tasks, raw_writer = await pair()
        raw_writer.write(HEADER.pack(3) + b"\xc1\xc1\xc1")
        await asyncio.wait_for(server.wait_closed(), 2)
        assert "protocol error" in server.close_reason
        # A fresh connection on the same table still works.
        server2, client2, tasks2, _ = await pair()
        assert (await client2.call("echo", 1))["body"] == 1
        for t in tasks + tasks2:
            t.cancel()
    asyncio.run(main())


def test_half_frame_then_silence_is_closed_and_whole_frames_are_not():
    async def scenario():
        (ra, wa), (rb, wb) = memory_pair()
        server = RpcConnection(ra, wa, table=make_table(), name="server", frame_timeout=0.3)
        task = asyncio.ensure_future(server.run())
        client = RpcConnection(rb, wb, name="client")
        client_task = asyncio.ensure_future(client.run())
        for _ in range(3):  # healthy calls, slower than the frame timeout apart
            assert (await client.call("echo", 1))["body"] == 1
            await asyncio.sleep(0.4)
        assert not server.closed
        wb.write(HEADER.pack(100) + b"\x81")  # half a frame, then nothing
        await asyncio.wait_for(task, 10)
        assert server.close_reason == "incomplete frame for 0.3 s"
        client_task.cancel()
    asyncio.run(scenario())


def test_idle_connection_is_closed_but_a_busy_one_is_not():
    async def scenario():
        (ra, wa), (rb, wb) = memory_pair()
        server = RpcConnection(ra, wa, table=make_table(), name="server", idle_timeout=0.3)
        task = asyncio.ensure_future(server.run())
        client = RpcConnection(rb, wb, name="client")
        client_task = asyncio.ensure_future(client.run())
        for _ in range(4):  # polls keep it alive (hstat)
            await client.call("echo", 1)
            await asyncio.sleep(0.15)
        # a request that takes longer than the idle time is not idleness
        with pytest.raises(asyncio.TimeoutError):
            await client.call("slow", None, timeout=0.6)
        assert not server.closed
        await asyncio.wait_for(task, 10)
        assert server.close_reason == "idle for 0.3 s"
        client_task.cancel()
    asyncio.run(scenario())


def test_a_handler_failing_in_a_loop_logs_a_bounded_number_of_tracebacks(caplog):
    """Fifth audit: a request that made a handler fail, sent in a loop, was a 40-line traceback
    each (18.5 MB of log in 20 s)."""
    from hai_cluster.transport import rpc

    async def main():
        server, client, tasks, _ = await pair()
        with caplog.at_level("ERROR", logger=rpc.log.name):
            for _ in range(3 * rpc.TRACEBACKS_PER_MINUTE):
                with pytest.raises(RpcError, match="internal error in crash"):
                    await client.call("crash")
        for t in tasks:
            t.cancel()
        return [r for r in caplog.records if r.exc_info]

    rpc._failures = rpc.LogBudget(rpc.log, rpc.TRACEBACKS_PER_MINUTE, "handler failure(s)")  # a fresh minute
    assert len(asyncio.run(main())) == rpc.TRACEBACKS_PER_MINUTE
