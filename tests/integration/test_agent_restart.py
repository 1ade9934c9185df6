"""Jobs outlive their agent: SIGKILL or stop the agent, start it again, and every run is found
where it was; a run whose shepherd vanished is reported as lost and its processes killed."""
from __future__ import annotations

import os
import signal

import pytest

from hai_cluster.agent import spool

from .agent_helpers import AgentProcess, Sandbox, client, group_alive, run, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

WAIT_FOR_GO = "#!/bin/sh\nwhile [ ! -e go-$HAI_JOB_ID ]; do sleep 0.1; done\nexit $EXIT\n"


def _spec(box: Sandbox, exit_code: int) -> dict:
    spec = box.spec(WAIT_FOR_GO)
    spec["environment"]["EXIT"] = str(exit_code)
    return spec


def _go(box: Sandbox, spec: dict) -> None:
    (box.work / f"go-{spec['job_id']}").touch()


def _run_dir(box: Sandbox, spec: dict):
    return spool.runs_dir(box.spool) / f"{spec['job_id']}.{spec['attempt']}"


async def _start(agent: AgentProcess, *specs: dict) -> list[int]:
    async with client(agent) as c:
        return [(await c.call("start_run", {"spec": s}))["status"]["pid"] for s in specs]


def test_jobs_survive_agent_sigkill_and_report_after_restart(box):
    agent = AgentProcess(box).start()
    a, b = _spec(box, 7), _spec(box, 5)
    pid_a, pid_b = run(_start(agent, a, b))
    shepherd_a = spool.find_shepherd(_run_dir(box, a))
    assert agent.kill(signal.SIGKILL) == -signal.SIGKILL
    assert os.path.exists(box.socket)  # left stale; the next agent must replace it
    assert group_alive(pid_a) and group_alive(pid_b)
    assert spool.is_shepherd(shepherd_a, _run_dir(box, a))
    _go(box, b)  # b ends while no agent runs: its shepherd still records it
    wait_for(lambda: (_run_dir(box, b) / spool.STATUS).exists(), 20, "b's status")

    agent = AgentProcess(box).start()
    try:
        async def body():
            async with client(agent) as c:
                hello = await c.call("hello", {"controller": "after-restart"})
                _go(box, a)
                ended_a = await c.exited(a["job_id"])
                return {r["job_id"]: r for r in hello["runs"]}, ended_a
        runs, ended_a = run(body())
    finally:
        agent.stop()
    assert runs[a["job_id"]]["state"] == "running" and runs[a["job_id"]]["pid"] == pid_a
    assert runs[b["job_id"]]["state"] == "ended" and runs[b["job_id"]]["exit_code"] == 5
    assert ended_a["exit_code"] == 7 and ended_a["reason"] is None and ended_a["pid"] == pid_a


def test_sigterm_stops_the_agent_and_leaves_jobs_running(box):
    agent = AgentProcess(box).start()
    spec = _spec(box, 0)
    (pid,) = run(_start(agent, spec))
    assert agent.kill(signal.SIGTERM) == 0
    assert not os.path.exists(box.socket)
    assert group_alive(pid)
    agent = AgentProcess(box).start()
    try:
        async def body():
            async with client(agent) as c:
                runs = (await c.call("list_runs"))["runs"]
                await c.call("terminate_run", {"job_id": spec["job_id"], "attempt": 0, "reason": "node_fail"})
                return runs, await c.exited(spec["job_id"])
        runs, ended = run(body())
    finally:
        agent.stop()
    assert [r["state"] for r in runs] == ["running"]
    assert ended["reason"] == "node_fail" and not group_alive(pid)


def _kill_shepherd(box: Sandbox, spec: dict) -> None:
    pid = spool.find_shepherd(_run_dir(box, spec))
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not spool.is_shepherd(pid, _run_dir(box, spec)), 20, "the shepherd to die")


def test_run_whose_shepherd_died_is_lost_and_killed(box):
    agent = AgentProcess(box).start()
    try:
        live, down = _spec(box, 0), _spec(box, 0)
        pid_live, pid_down = run(_start(agent, live, down))
        # a shepherd that dies while the agent is down: found at the agent's next start
        agent.kill(signal.SIGKILL)
        _kill_shepherd(box, down)
        assert group_alive(pid_down)
        agent = AgentProcess(box).start()

        async def body():
            async with client(agent) as c:
                runs = {r["job_id"]: r for r in (await c.call("list_runs"))["runs"]}
                _kill_shepherd(box, live)  # and one that dies while the agent watches
                return runs, await c.exited(live["job_id"])
        runs, ended_live = run(body())
    finally:
        agent.stop()
    ended_down = runs[down["job_id"]]
    for st, pid in ((ended_down, pid_down), (ended_live, pid_live)):
        assert st["state"] == "ended" and st["reason"] == "lost", st
        assert "leftover processes were killed" in st["message"]
        wait_for(lambda: not group_alive(pid), 20, "the lost job's processes to die")


def test_unconfirmed_launch_is_tracked_through_the_spool(box):
    # a launch timeout far below a shepherd's start-up time: start_run gives up waiting
    agent = AgentProcess(box, launch_timeout=0.001).start()
    spec = _spec(box, 6)
    try:
        async def body():
            async with client(agent) as c:
                reply = await c.call("start_run", {"spec": spec})
                _go(box, spec)
                return reply, await c.exited(spec["job_id"])
        reply, ended = run(body())
    finally:
        agent.stop()
    assert reply["started"] is True and reply["status"]["state"] == "running"
    assert reply["status"]["pid"] is None and "launch not confirmed" in reply["status"]["message"]
    assert ended["exit_code"] == 6 and ended["pid"] > 0
