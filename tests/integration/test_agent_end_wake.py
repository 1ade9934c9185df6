"""An end is reported when the shepherd exits (the agent watches its pidfd), not only at the next
spool poll: with a poll interval of an hour, every end still arrives."""
from __future__ import annotations

import pytest

from .agent_helpers import AgentProcess, Sandbox, client, need_root, run

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def slow_poll_agent():
    need_root()
    box = Sandbox()
    proc = AgentProcess(box, poll_interval=3600).start()
    yield proc
    proc.stop()
    box.cleanup()


def test_ends_arrive_without_waiting_for_the_poll(slow_poll_agent):
    box = slow_poll_agent.box
    specs = [box.spec(f"#!/bin/sh\nexit {i}\n", job_id=900 + i) for i in range(3)]

    async def body():
        async with client(slow_poll_agent) as c:
            ended = []
            for spec in specs:  # one after another: each end needs its own wake-up
                assert (await c.call("start_run", {"spec": spec}))["started"] is True
                ended.append(await c.exited(spec["job_id"], timeout=60))
            listed = (await c.call("list_runs", {}))["runs"]
        return ended, listed

    ended, listed = run(body())
    assert [(e["job_id"], e["state"], e["exit_code"]) for e in ended] == [(900, "ended", 0), (901, "ended", 1),
                                                                          (902, "ended", 2)]
    assert all(e in listed for e in ended)  # the spool still says the same
