"""Agents refuse commands from a superseded controller: the newest lease epoch is kept in the
spool, survives an agent restart, and an older epoch (or none, once one was seen) is refused."""
from __future__ import annotations

import signal

import pytest

from hai_cluster.transport.rpc import RpcError

from .agent_helpers import AgentProcess, client, group_alive, run

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

LONG = "#!/bin/sh\nsleep 60\n"


async def _call(agent: AgentProcess, method: str, body: dict):
    async with client(agent) as c:
        try:
            return await c.call(method, body)
        except RpcError as exc:
            return exc


def test_old_epoch_is_refused_and_remembered_across_restarts(box):
    agent = AgentProcess(box).start()
    spec = box.spec(LONG)
    key = {"job_id": spec["job_id"], "attempt": spec["attempt"]}
    try:
        started = run(_call(agent, "start_run", {"spec": spec, "epoch": 2}))
        pid = started["status"]["pid"]
        assert (box.spool / "controller_epoch").read_text().strip() == "2"
        # the old leader (epoch 1) cannot end, signal, forget or start anything
        for method, body in (("terminate_run", {**key, "reason": "cancel", "epoch": 1}),
                             ("signal_run", {**key, "signal": 9, "epoch": 1}),
                             ("forget_run", {**key, "epoch": 1}),
                             ("start_run", {"spec": box.spec(LONG), "epoch": 1}),
                             ("terminate_run", {**key, "reason": "cancel"})):  # no epoch at all
            reply = run(_call(agent, method, body))
            assert isinstance(reply, RpcError), (method, reply)
            assert "epoch" in str(reply), str(reply)
        assert group_alive(pid)
        # the agent restarts: the epoch is still known
        agent.kill(signal.SIGKILL)
        agent = AgentProcess(box).start()
        reply = run(_call(agent, "terminate_run", {**key, "reason": "cancel", "epoch": 1}))
        assert isinstance(reply, RpcError) and "older than 2" in str(reply)
        assert group_alive(pid)
        # reads still answer; the current (or a newer) epoch acts
        runs = run(_call(agent, "list_runs", {}))["runs"]
        assert [r["state"] for r in runs] == ["running"]
        assert run(_call(agent, "terminate_run", {**key, "reason": "cancel", "epoch": 3}))["found"] is True
        assert (box.spool / "controller_epoch").read_text().strip() == "3"
        bad = run(_call(agent, "ping", {"epoch": "x"}))
        assert isinstance(bad, RpcError) and "positive integer" in str(bad)
    finally:
        agent.stop()
