"""The shepherd zygote (agent/zygote.py, agent/starter.py): shepherds forked from a pre-imported
helper instead of started as fresh interpreters. Real processes throughout: the zygote, its
forked shepherds and their jobs run as in the agent; the agent-level tests use a real hai-agent.

What must hold: a forked shepherd is detached (its own session, not the agent's child) and named like an
exec'd one; it starts from the same process state; a dead or hung zygote costs one launch the
exec way and is replaced, and never a run; garbage on its socket is refused; neither the
zygote's nor the agent's death reaches a shepherd or its job.
"""
from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import socket
from pathlib import Path

import pytest

from hai_cluster.agent import launcher, spool
from hai_cluster.protocol.runspec import RunSpec
from hai_cluster.agent.starter import ShepherdStarter, room_for

from .agent_helpers import AgentProcess, Sandbox, client, group_alive, run, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

WAIT_FOR_GO = "#!/bin/sh\nwhile [ ! -e go-$HAI_JOB_ID ]; do sleep 0.1; done\nexit $EXIT\n"


def _runs(box: Sandbox) -> Path:
    runs = spool.runs_dir(box.spool)
    runs.mkdir(parents=True, exist_ok=True)
    for d in (runs.parent, runs):
        os.chmod(d, 0o711)
    return runs


def _starter(box: Sandbox, mode: str = "fork", **kw) -> ShepherdStarter:
    starter = ShepherdStarter(mode, room_for(_runs(box)), **kw)
    starter.open()
    return starter


def _spec(box: Sandbox, exit_code: int = 0) -> dict:
    spec = box.spec(WAIT_FOR_GO)
    spec["environment"]["EXIT"] = str(exit_code)
    return spec


def _go(box: Sandbox, spec: dict) -> None:
    (box.work / f"go-{spec['job_id']}").touch()


async def _launch(box: Sandbox, starter: ShepherdStarter, wire: dict):
    spec = RunSpec.from_wire(wire)
    run_dir = _runs(box) / spool.run_dir_name(spec.job_id, spec.attempt)
    launcher.prepare(run_dir, spec)
    status, shepherd = await launcher.launch(run_dir, spec, 30.0, starter)
    return run_dir, status, shepherd


def _final(run_dir: Path) -> dict:
    wait_for(lambda: (run_dir / spool.STATUS).exists(), 20, f"{run_dir}'s status")
    return spool.read_json(run_dir / spool.STATUS)


def _stat(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()  # state, ppid, pgrp, session, ...


def _alive(pid: int) -> bool:
    return spool.proc_starttime(pid) is not None


def _shepherds_of(run_dir: Path) -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and spool.is_shepherd(int(p), run_dir)]


def test_a_forked_shepherd_is_detached_and_named_like_an_execd_one(box):
    starter = _starter(box)

    async def body():
        try:
            launched = await _launch(box, starter, spec)
            zygote = starter.zygote_pid
            return launched, zygote, _stat(zygote)[3]
        finally:
            starter.close()
    spec = _spec(box, 3)
    (run_dir, status, shepherd), zygote, zygote_session = run(body())
    assert status.state == "running" and status.pid is not None and shepherd is not None
    assert starter.counts == {"fork": 1, "exec": 0}
    assert spool.is_shepherd(shepherd, run_dir)  # what the agent checks after a restart
    assert _shepherds_of(run_dir) == [shepherd]
    state, ppid, pgrp, session = _stat(shepherd)[:4]
    assert int(ppid) != os.getpid()  # not the agent's child (the zygote's, or a reaper's once it exited)
    assert session not in (zygote_session, _stat(os.getpid())[3])  # its own session
    wait_for(lambda: not _alive(zygote), 10, "the zygote to exit once its socket closed")
    assert _alive(shepherd) and group_alive(status.pid)  # the zygote's end is not the shepherd's
    _go(box, spec)
    final = _final(run_dir)
    assert final["exit_code"] == 3 and final["reason"] is None and final["pid"] == status.pid


def _proc_state(pid: int, run_dir: Path) -> dict:
    """What a shepherd started with and keeps: signal dispositions and mask, umask, cwd, limits,
    nice, stdio and its other open fds (their kinds: the numbers depend on the report pipe's)."""
    status = dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                  if ":\t" in line)
    fds = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        target = os.readlink(f"/proc/{pid}/fd/{fd}")
        if target.startswith(str(run_dir)):
            target = os.path.relpath(target, run_dir)
        fds[int(fd)] = target.split(":[")[0]  # pipe:[1234] -> pipe
    return {"signals": {k: status[k] for k in ("SigBlk", "SigIgn", "SigCgt")}, "umask": status["Umask"],
            "cwd": os.readlink(f"/proc/{pid}/cwd"), "limits": Path(f"/proc/{pid}/limits").read_text(),
            "stdio": [fds.pop(n) for n in (0, 1, 2)], "fds": sorted(fds.values()), "nice": _stat(pid)[16]}


def _report_pipe_closed(pid: int) -> bool:
    """The shepherd writes its launch report and closes the pipe after it, so a launch may return
    in between. Its own pipes are open at both ends (an inode twice); the report's write end alone."""
    pipes = [t for t in (os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd"))
             if t.startswith("pipe:")]
    return all(pipes.count(t) == 2 for t in pipes)


def test_forked_and_execd_shepherds_start_from_the_same_state(box):
    async def body(mode: str):
        starter = _starter(box, mode)
        try:
            spec = _spec(box)
            run_dir, status, shepherd = await _launch(box, starter, spec)
            assert starter.counts[mode] == 1 and shepherd is not None
            return spec, run_dir, shepherd
        finally:
            starter.close()
    (fspec, fdir, fshep), (espec, edir, eshep) = run(body("fork")), run(body("exec"))
    for pid in (fshep, eshep):
        wait_for(lambda: _report_pipe_closed(pid), 10, "the shepherd to close its report pipe")
    forked, execd = _proc_state(fshep, fdir), _proc_state(eshep, edir)
    assert forked == execd
    assert forked["cwd"] == "/" and forked["umask"] == "0022"
    for spec, run_dir in ((fspec, fdir), (espec, edir)):
        _go(box, spec)
        assert _final(run_dir)["exit_code"] == 0
    # their logs are the shepherd's own lines, not the zygote's
    assert "zygote" not in (fdir / spool.SHEPHERD_LOG).read_text()
    assert "started: pid" in (fdir / spool.SHEPHERD_LOG).read_text()


def test_a_killed_zygote_costs_one_exec_and_is_replaced(box):
    starter = _starter(box)
    specs = [_spec(box, n) for n in (1, 2, 3)]

    async def body():
        try:
            first = await _launch(box, starter, specs[0])
            old = starter.zygote_pid
            os.kill(old, signal.SIGKILL)
            await asyncio.to_thread(wait_for, lambda: starter.proc.poll() is not None, 10, "the zygote's death")
            second = await _launch(box, starter, specs[1])
            counts, new = dict(starter.counts), starter.zygote_pid
            third = await _launch(box, starter, specs[2])
            return first, second, third, old, new, counts
        finally:
            starter.close()
    first, second, third, old, new, counts = run(body())
    assert counts == {"fork": 1, "exec": 1}  # the launch after the death went the exec way
    assert new is not None and new != old  # and a new zygote came at once
    assert starter.counts == {"fork": 2, "exec": 1}  # which forked the next one
    for run_dir, status, shepherd in (first, second, third):
        assert status.state == "running" and spool.is_shepherd(shepherd, run_dir)
    assert group_alive(first[1].pid)  # the zygote's death did not reach the shepherd it forked
    for spec, (run_dir, _, _) in zip(specs, (first, second, third)):
        _go(box, spec)
        assert _final(run_dir)["exit_code"] == int(spec["environment"]["EXIT"])


def test_a_zygote_that_cannot_start_or_refuses_costs_no_run(box):
    runs = _runs(box)
    # an argument the kernel refuses (E2BIG): the zygote cannot even be executed
    broken = ShepherdStarter("fork", room=200_000)
    broken.open()
    # no room for any run dir's name: it serves, and refuses every run
    cramped = ShepherdStarter("fork", room=0)
    cramped.open()
    specs = [_spec(box) for _ in range(4)]

    async def body():
        try:
            out = [await _launch(box, broken, specs[0]), await _launch(box, broken, specs[1])]
            zygote = cramped.zygote_pid
            out += [await _launch(box, cramped, specs[2]), await _launch(box, cramped, specs[3])]
            return out, zygote, cramped.zygote_pid, cramped.proc.poll()
        finally:
            broken.close()
            cramped.close()
    launched, before, after, exited = run(body())
    assert broken.proc is None and broken.counts == {"fork": 0, "exec": 2}  # not retried per launch
    assert cramped.counts == {"fork": 0, "exec": 2}
    assert before == after and exited is None  # a refusal does not cost the zygote its place
    for spec, (run_dir, status, shepherd) in zip(specs, launched):
        assert status.state == "running" and spool.is_shepherd(shepherd, run_dir)
        assert run_dir.parent == runs
        _go(box, spec)
        assert _final(run_dir)["exit_code"] == 0


def test_a_hung_zygote_is_given_up_and_the_run_starts_once(box):
    starter = _starter(box, ack_timeout=1.0, respawn_after=0)
    a, b, c = _spec(box), _spec(box), _spec(box)

    async def body():
        try:
            await _launch(box, starter, a)
            hung = starter.zygote_pid
            os.kill(hung, signal.SIGSTOP)
            second = await _launch(box, starter, b)
            counts = dict(starter.counts)
            third = await _launch(box, starter, c)
            return hung, second, third, counts
        finally:
            starter.close()
    hung, (b_dir, b_status, b_shepherd), (c_dir, c_status, _), counts = run(body())
    assert counts == {"fork": 1, "exec": 1}
    assert starter.counts == {"fork": 2, "exec": 1}
    wait_for(lambda: not _alive(hung), 10, "the hung zygote to be killed")
    assert b_status.state == "running" and _shepherds_of(b_dir) == [b_shepherd]
    for spec, run_dir in ((a, b_dir.parent / f"{a['job_id']}.0"), (b, b_dir), (c, c_dir)):
        _go(box, spec)
        assert _final(run_dir)["exit_code"] == 0


def test_a_zygote_given_up_mid_fork_never_starts_a_run_twice(box):
    """An answer deadline shorter than a fork: each launch races the child's acknowledgement
    against the agent giving up. Whichever wins, the run has one shepherd and starts once."""
    starter = _starter(box, ack_timeout=0.0005, respawn_after=0)
    specs = [_spec(box) for _ in range(6)]

    async def body():
        try:
            launched = []
            for spec in specs:
                run_dir, status, shepherd = await _launch(box, starter, spec)
                launched.append((run_dir, status, shepherd, _shepherds_of(run_dir)))
            return launched
        finally:
            starter.close()
    launched = run(body())
    assert sum(starter.counts.values()) == len(specs)
    for spec, (run_dir, status, shepherd, shepherds) in zip(specs, launched):
        assert status.state == "running" and shepherds == [shepherd]
        _go(box, spec)
        assert _final(run_dir)["exit_code"] == 0
        log = (run_dir / spool.SHEPHERD_LOG).read_text()
        assert log.count("started: pid") == 1, log


def _ask(sock: socket.socket, payload: bytes, fds: list[int]) -> dict:
    socket.send_fds(sock, [payload], fds)
    select.select([sock], [], [], 10)
    return json.loads(sock.recv(65536))


def _fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_garbage_on_the_zygote_socket_is_refused_and_it_goes_on(box):
    starter = _starter(box)
    runs = _runs(box)
    spec, later = _spec(box), _spec(box)

    async def body():
        try:
            await _launch(box, starter, spec)  # ready, and one fork done
            zygote, sock = starter.zygote_pid, starter.sock
            baseline = _fd_count(zygote)
            r, w = os.pipe()
            ok = json.dumps({"run_dir": str(runs / "99.0")}).encode()
            garbage = [
                (b"not json", [r, w], "JSON object"),
                (b"[1, 2]", [r, w], "run_dir"),
                (json.dumps({"run_dir": "relative/99.0"}).encode(), [r, w], "absolute"),
                (json.dumps({"run_dir": "/x", "more": 1}).encode(), [r, w], "run_dir"),
                (json.dumps({"run_dir": 7}).encode(), [r, w], "absolute"),
                (ok, [], "2 fds"),
                (ok, [r], "2 fds"),
                (ok, [r, w, r], "2 fds"),
                (ok, [r, w, r, w, r, w], "too large"),
                (b"x" * 100_000, [r, w], "too large"),
                (b"", [], "2 fds"),
                (json.dumps({"run_dir": "/" + "d" * 5000}).encode(), [r, w], "does not fit"),
                (json.dumps({"run_dir": "/a\u0000b"}).encode(), [r, w], "does not fit"),
            ]
            sock.setblocking(True)
            replies = [(_ask(sock, payload, fds), want) for payload, fds, want in garbage]
            sock.setblocking(False)
            os.close(r)
            os.close(w)
            alive, fds_after = starter.proc.poll() is None, _fd_count(zygote)
            after = await _launch(box, starter, later)
            return replies, alive, baseline, fds_after, after
        finally:
            starter.close()
    replies, alive, baseline, fds_after, (run_dir, status, shepherd) = run(body())
    for reply, want in replies:
        assert want in reply.get("error", ""), (reply, want)
    assert alive and fds_after == baseline  # still serving, and no fd it was sent kept
    assert starter.counts == {"fork": 2, "exec": 0}  # the next real launch was forked by it
    assert status.state == "running" and spool.is_shepherd(shepherd, run_dir)
    assert not (runs / "99.0").exists()
    for s in (spec, later):
        _go(box, s)
    assert _final(run_dir)["exit_code"] == 0


def test_exec_mode_starts_no_zygote(box):
    starter = _starter(box, "exec")
    spec = _spec(box)

    async def body():
        try:
            return await _launch(box, starter, spec)
        finally:
            starter.close()
    run_dir, status, shepherd = run(body())
    assert starter.proc is None and starter.counts == {"fork": 0, "exec": 1}
    assert spool.is_shepherd(shepherd, run_dir)
    _go(box, spec)
    assert _final(run_dir)["exit_code"] == 0


# -- a real hai-agent --

def _zygote_of(agent: AgentProcess) -> int | None:
    for pid in spool.children_of(agent.proc.pid):
        try:
            if b"hai_cluster.agent.zygote" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
        except OSError:
            pass
    return None


async def _start(agent: AgentProcess, *specs: dict) -> list[dict]:
    async with client(agent) as c:
        return [(await c.call("start_run", {"spec": s}))["status"] for s in specs]


def test_the_agent_survives_its_zygote_and_jobs_survive_both(box):
    agent = AgentProcess(box, agent_toml='shepherd_start = "fork"\n').start()
    a, b, c = _spec(box, 4), _spec(box, 5), _spec(box, 6)
    try:
        (st_a,) = run(_start(agent, a))
        zygote = _zygote_of(agent)
        assert zygote is not None
        shepherd_a = spool.find_shepherd(box.spool / "runs" / f"{a['job_id']}.0")
        assert int(_stat(shepherd_a)[1]) == zygote  # its child, in a session of its own: it outlives it
        os.kill(zygote, signal.SIGKILL)
        (st_b,) = run(_start(agent, b))  # the exec way, while a new zygote starts
        assert st_b["state"] == "running" and st_b["pid"]
        assert "shepherd zygote unusable" in agent.log.read_text()
        assert _alive(shepherd_a) and group_alive(st_a["pid"])
        new = wait_for(lambda: _zygote_of(agent) not in (None, zygote) and _zygote_of(agent), 20,
                       "a new zygote")
        (st_c,) = run(_start(agent, c))
        assert st_c["state"] == "running"
        assert agent.kill(signal.SIGKILL) == -signal.SIGKILL
        wait_for(lambda: not _alive(new), 10, "the zygote to exit with its agent")
        for st in (st_a, st_b, st_c):
            assert group_alive(st["pid"])
        agent = AgentProcess(box, agent_toml='shepherd_start = "fork"\n').start()

        async def body():
            async with client(agent) as cl:
                hello = await cl.call("hello", {"controller": "after-restart"})
                for s in (a, b, c):
                    _go(box, s)
                return hello, [await cl.exited(s["job_id"]) for s in (a, b, c)]
        hello, ended = run(body())
    finally:
        agent.stop()
    assert sorted(r["state"] for r in hello["runs"]) == ["running"] * 3
    assert [e["exit_code"] for e in ended] == [4, 5, 6]
    assert all(e["reason"] is None for e in ended)
