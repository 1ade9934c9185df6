"""sattach's parts with no daemon: the controller's tee of a client step's output to its attachers
(bounded replay, bounded queue per attacher, a chunk offered again teed once, tasks' ends never
dropped) and sattach's options, operand and layout, as Slurm 22.05's sattach printed them on the
Slurm peer."""
from __future__ import annotations

import asyncio

import pytest

from hai_cluster.cli import sattach
from hai_cluster.controller import step_tee as step_watch
from hai_cluster.controller.steps import CLIENT_ORIGIN, LiveStep


class SlowConn:
    """An attacher's connection that takes nothing until told to."""

    def __init__(self) -> None:
        self.taken: list[tuple[str, dict]] = []
        self.open = asyncio.Event()

    async def offer(self, kind, message, wait, max_buffered):
        if not self.open.is_set():
            await asyncio.sleep(0.01)
            return False
        self.taken.append((kind, message))
        return True


class Credits(SlowConn):
    """A connection whose peer reads as fast as `credits` say."""
    credits = 0

    async def offer(self, kind, message, wait, max_buffered):
        if not self.credits:
            await asyncio.sleep(0.001)
            return False
        self.credits -= 1
        self.taken.append((kind, message))
        return True


def out(task: int, seq: int, data: bytes) -> dict:
    return {"step_id": 1, "task": task, "seq": seq, "stream": "out", "data": data}


def test_replay_keeps_the_recent_output_only_and_a_chunk_offered_again_is_teed_once():
    async def main():
        live = LiveStep(CLIENT_ORIGIN, 0, ("a",))
        chunk = b"y" * 1000
        for seq in range(200):
            await step_watch.tee(live, "output", out(0, seq, chunk))
            await step_watch.tee(live, "output", out(0, seq, chunk))  # its client was busy: offered again
        w = live.watch
        assert w.recent_bytes <= step_watch.REPLAY_BYTES and len(w.recent) == step_watch.REPLAY_BYTES // 1000
        assert [m["seq"] for _at, m in w.recent] == list(range(200 - len(w.recent), 200))  # the newest, once each
        await step_watch.tee(live, "output", out(1, 0, b"z" * (step_watch.REPLAY_BYTES * 2)))
        assert w.recent_bytes <= step_watch.REPLAY_BYTES  # one huge chunk: only its tail is kept
    asyncio.run(main())


class CountingEvent(asyncio.Event):
    waits = 0

    async def wait(self):
        CountingEvent.waits += 1
        return await super().wait()


def test_an_attacher_that_reads_nothing_holds_a_bounded_queue_loses_output_not_the_end(monkeypatch):
    monkeypatch.setattr(step_watch, "TEE_WAIT", 0.05)

    async def main():
        live = LiveStep(CLIENT_ORIGIN, 0, ("a",))
        conn = SlowConn()
        watcher = step_watch.Watcher(conn=conn, key=(5, 1), uid=1000, room=CountingEvent())
        step_watch._watch(live).watchers.append(watcher)
        watcher.writer = asyncio.ensure_future(watcher.run())
        chunk = b"x" * (64 << 10)
        for seq in range(100):  # 6.4 MiB to an attacher that reads nothing
            await step_watch.tee(live, "output", out(seq % 2, seq // 2, chunk))
        assert watcher.queued <= step_watch.WATCH_QUEUED and watcher.lost > 0 and watcher.lagging
        assert CountingEvent.waits == 1  # the step waited for it once, then it lagged: no more waits
        await step_watch.tee(live, "exit", {"step_id": 1, "task": 0, "exit_code": 2, "signal": None})
        await step_watch.tee(live, "exit", {"step_id": 1, "task": 1, "exit_code": 0, "signal": None})
        step_watch.ended(live, (5, 1), "FAILED", 2, None)
        assert live.watch.watchers == []
        conn.open.set()
        await asyncio.wait_for(watcher.writer, 10)
        kinds = [k for k, _ in conn.taken]
        assert kinds[-2:] == ["watch_lost", "watch_end"]  # the loss is said, then the end comes
        assert conn.taken[-1][1]["exits"] == [[0, 2, None], [1, 0, None]]
        assert kinds.count("output") == step_watch.WATCH_QUEUED // len(chunk)
    asyncio.run(main())


def test_an_attacher_that_keeps_up_slowly_gets_everything():
    """It reads a chunk at a time, later than the step writes them: the step waits for it."""
    async def main():
        live = LiveStep(CLIENT_ORIGIN, 0, ("a",))
        conn = Credits()
        watcher = step_watch.Watcher(conn=conn, key=(5, 1), uid=1000)
        step_watch._watch(live).watchers.append(watcher)
        watcher.writer = asyncio.ensure_future(watcher.run())

        async def reader():  # room for one more chunk every 5 ms
            while True:
                conn.credits += 1
                await asyncio.sleep(0.005)
        reading = asyncio.ensure_future(reader())
        chunk = b"x" * (64 << 10)
        for seq in range(40):  # 2.5 MiB, five times its queue
            await step_watch.tee(live, "output", out(0, seq, chunk))
        step_watch.ended(live, (5, 1), "COMPLETED", 0, None)
        reading.cancel()
        conn.credits = 1000
        await asyncio.wait_for(watcher.writer, 30)
        assert [m["seq"] for k, m in conn.taken if k == "output"] == list(range(40))
        assert "watch_lost" not in [k for k, _ in conn.taken]
    asyncio.run(main())


def test_a_closed_attacher_is_let_go():
    async def main():
        live = LiveStep(CLIENT_ORIGIN, 0, ("a",))

        class Link:
            watches: list = []
        link = Link()
        watcher = step_watch.Watcher(conn=SlowConn(), key=(5, 1), uid=1000)
        step_watch._watch(live).watchers.append(watcher)
        link.watches = [watcher]
        watcher.writer = asyncio.ensure_future(watcher.run())
        step_watch.drop(link)
        await asyncio.wait_for(watcher.writer, 5)
        await step_watch.tee(live, "output", out(0, 0, b"late\n"))
        assert live.watch.watchers == [] and link.watches == []
    asyncio.run(main())


@pytest.mark.parametrize("argv, err, out", [
    (["12"], "sattach: error: Failed to parse stepid from command line options\n",
     "Usage: sattach [options] <jobid.stepid>\n"),
    (["abc"], "sattach: error: Failed to parse stepid from command line options\n",
     "Usage: sattach [options] <jobid.stepid>\n"),
    ([], "sattach: error: too many parameters\n",
     "Usage: sattach [options] <jobid.stepid>\n"),
    (["1.0", "2.0"], "sattach: error: too many parameters\n", "Usage: sattach [options] <jobid.stepid>\n"),
    (["--output-filter=x", "1.0"], 'sattach: error: Invalid numeric value "x" for output-filter.\n', ""),
    (["-x", "1.0"], "sattach: invalid option -- 'x'\nTry \"sattach --help\" for more information\n", ""),
])
def test_wrong_input_is_said_as_slurms_sattach_says_it(argv, err, out, capsys):
    with pytest.raises(sattach.Exit) as exc:
        sattach.parse(argv)
    assert exc.value.code == 1
    got = capsys.readouterr()
    assert (got.err, got.out) == (err, out)


def test_options_and_operand():
    o = sattach.parse(["-lQ", "--input-filter", "1", "--error-filter=0", "--layout", "15.3"])
    assert (o.job_id, o.step_id, o.label, o.quiet, o.input_filter, o.error_filter, o.output_filter, o.layout) == \
        (15, 3, True, True, 1, 0, None, True)


def test_layout_as_slurms_print_layout_info():
    text = sattach.layout_text({"nodes": ["n1", "n2"], "tasks": ["n1", "n1", "n2"]})
    assert text == ("Job step layout:\n\t3 tasks, 2 nodes (n[1-2])\n\n"
                    "\tNode 0 (n1), 2 task(s): 0 1 \n\tNode 1 (n2), 1 task(s): 2 \n")


# -- a batch job's step: srun's copy of its own node's tasks (cli/srun_tee.py), merged here --

def test_srun_replay_is_merged_by_time_once_each_and_bounded():
    from hai_cluster.protocol.steps import TeeEvent

    async def main():
        live = LiveStep("a", 0, ("a", "b"), {1: "b"}, local=frozenset({0}))
        for seq, at in enumerate((10.0, 12.0, 14.0)):  # the other node's task, through the controller
            await step_watch.tee(live, "output", out(1, seq, b"remote%d\n" % seq), at=at)
        # srun's first live copy came before its answer with the replay: kept once
        await step_watch.tee(live, "output", out(0, 2, b"local2\n"), at=15.0)
        step_watch.merge(live, [TeeEvent("output", 11.0, out(0, 0, b"local0\n")),
                                TeeEvent("output", 13.0, out(0, 1, b"local1\n")),
                                TeeEvent("output", 15.0, out(0, 2, b"local2\n")),
                                TeeEvent("exit", 16.0, {"step_id": 1, "task": 0, "exit_code": 4, "signal": None})])
        assert [m["data"] for m in step_watch.replay(live)] == [b"remote0\n", b"local0\n", b"remote1\n", b"local1\n",
                                                                b"remote2\n", b"local2\n"]
        assert live.watch.exits == {0: (4, None)}
        await step_watch.tee(live, "output", out(0, 2, b"local2\n"), at=15.0)  # offered again: not teed twice
        assert len(step_watch.replay(live)) == 6
        big = [TeeEvent("output", 20.0 + i, out(0, 3 + i, b"z" * 30000)) for i in range(4)]
        step_watch.merge(live, big)
        assert live.watch.recent_bytes <= step_watch.REPLAY_BYTES
        assert step_watch.replay(live)[-1]["seq"] == 6  # the newest kept, the oldest let go
        assert not step_watch.watched(live) and not step_watch.held(live)
        live.teeing = True
        assert step_watch.held(live)  # its routing stays while srun's copy is on
    asyncio.run(main())


class TeeConn:
    """srun's connection to its agent: takes step_tee_data calls, answering `wanted`."""

    def __init__(self) -> None:
        self.calls: list[dict] = []
        self.wanted = True
        self.gate = asyncio.Event()
        self.gate.set()

    async def call(self, method, body, timeout=None):
        assert method == "step_tee_data"
        await self.gate.wait()
        self.calls.append(body)
        return {"wanted": self.wanted}


def test_srun_copies_its_tasks_only_while_asked_bounded_and_says_what_it_dropped(monkeypatch):
    from hai_cluster.cli import srun_tee
    from hai_cluster.protocol.steps import MAX_TEE_BYTES, tee_events
    monkeypatch.setattr(srun_tee, "TEE_WAIT", 0.05)

    async def main():
        tee = srun_tee.LocalTee(7)
        tee.step_id = 1
        tee.conn = conn = TeeConn()
        for i in range(100):
            await tee.output(0, "out", b"x" * 1000)
        tee.exit(1, 3, None)
        await asyncio.sleep(0.01)
        assert conn.calls == [] and not tee.queue  # nobody attached: nothing sent or queued
        replay = tee.subscribe(True)["events"]
        events = tee_events(replay, 1)  # what the agent checks
        assert sum(len(e.message.get("data", b"")) for e in events) <= srun_tee.REPLAY_BYTES
        assert [e.message["seq"] for e in events if e.kind == "output"][-1] == 99
        assert events[-1].kind == "exit" and events[-1].message["exit_code"] == 3
        conn.gate.clear()  # the controller takes nothing: srun's queue fills, waits TEE_WAIT once, then drops
        for i in range(300):
            await tee.output(0, "err", b"y" * 4096)
        assert tee.queued <= srun_tee.QUEUED and tee.lost == 300 - srun_tee.QUEUED // 4096 and tee.lagging
        lost = tee.lost
        conn.gate.set()
        await asyncio.wait_for(tee.idle.wait(), 10)
        assert all(sum(len(e.get("data", b"")) for e in c["events"]) <= MAX_TEE_BYTES for c in conn.calls)
        assert sum(c["lost"] for c in conn.calls) == lost
        sent = [e["seq"] for c in conn.calls for e in c["events"]]
        assert sent == sorted(sent) and sent[0] == 100  # in order, from where the replay left off
        conn.wanted = False  # no attacher left (the controller says so): the copy stops
        await tee.output(0, "out", b"z")
        await asyncio.wait_for(tee.idle.wait(), 10)
        await asyncio.sleep(0.01)
        n = len(conn.calls)
        await tee.output(0, "out", b"after")
        await asyncio.sleep(0.01)
        assert len(conn.calls) == n and not tee.on and not tee.queue
        await tee.flush()
    asyncio.run(main())


def test_srun_copy_that_keeps_up_slowly_loses_nothing():
    """A full queue holds srun's reading of its tasks a moment (TEE_WAIT) instead of losing output."""
    from hai_cluster.cli import srun_tee

    async def main():
        tee = srun_tee.LocalTee(7)
        tee.step_id = 1
        tee.conn = conn = TeeConn()
        tee.subscribe(True)
        conn.gate.clear()

        async def slowly():
            while tee.on:
                await asyncio.sleep(0.01)
                conn.gate.set()
                await asyncio.sleep(0)
                conn.gate.clear()
        reader = asyncio.ensure_future(slowly())
        for i in range(400):
            await tee.output(1, "out", b"y" * 4096)
        conn.gate.set()
        await asyncio.wait_for(tee.idle.wait(), 10)
        reader.cancel()
        assert tee.lost == 0 and sum(c["lost"] for c in conn.calls) == 0
        assert [e["seq"] for c in conn.calls for e in c["events"]] == list(range(400))
    asyncio.run(main())


@pytest.mark.parametrize("events, err", [
    ([{"kind": "input", "at": 1.0, "task": 0}], "kind 'output' or 'exit'"),
    ([{"kind": "output", "at": "now", "task": 0, "seq": 0, "stream": "out", "data": b""}], "at must be"),
    ([{"kind": "output", "at": 1.0, "task": 0, "seq": 0, "stream": "out", "data": b"", "x": 1}], "unknown field"),
    ([{"kind": "exit", "at": 1.0, "task": 0, "exit_code": 300, "signal": None}], "exit_code"),
    ([{"kind": "output", "at": 1.0, "task": 0, "seq": i, "stream": "out", "data": b"x" * 200_000}
      for i in range(2)], "more than"),
    ({"kind": "output"}, "must be a list"),
])
def test_srun_copies_are_checked_field_by_field(events, err):
    from hai_cluster.protocol.runspec import SpecError
    from hai_cluster.protocol.steps import tee_events
    with pytest.raises(SpecError, match=err):
        tee_events(events, 1)
