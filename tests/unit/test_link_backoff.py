"""The controller's link to a node: it backs off while the node cannot be reached, and starts
over from the first delay once a session was up (a restarted agent is reconnected at once)."""
import asyncio

import pytest

from hai_cluster.config import NodeConfig, SshConfig
from hai_cluster.controller import nodes
from hai_cluster.controller.nodes import BACKOFF_FIRST, NodeLink
from hai_cluster.transport.rpc import ConnectionLost


def link_with(outcomes, monkeypatch) -> list[float]:
    """Run a link whose sessions go as `outcomes` say ("up": a hello went through, then the link
    dropped; "down": the connect failed); the delays it slept between them."""
    async def nothing(*_args):
        return None
    link = NodeLink(NodeConfig(name="n1", address="127.0.0.1"), SshConfig(), 5.0, on_hello=nothing, on_event=nothing, on_lost=nothing)
    steps = iter(outcomes)

    async def session():
        if next(steps) == "up":
            link.generation += 1
            raise ConnectionLost("agent restarted")
        raise OSError("connection refused")
    slept: list[float] = []

    async def sleep(delay):
        slept.append(delay)
        if len(slept) == len(outcomes):
            raise asyncio.CancelledError
    monkeypatch.setattr(link, "_session", session)
    monkeypatch.setattr(nodes.asyncio, "sleep", sleep)
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(link.run())
    return slept


def test_the_backoff_grows_while_down_and_starts_over_after_a_session(monkeypatch):
    slept = link_with(["down", "down", "down", "up", "up", "down"], monkeypatch)
    firsts = [d / BACKOFF_FIRST for d in slept]  # jitter: 0.8 to 1.2 of each step
    expected = [1, 2, 4, 1, 1, 2]
    assert all(0.8 * e <= f <= 1.2 * e for f, e in zip(firsts, expected)), slept


def test_the_api_refuses_until_the_store_is_open_and_a_lone_sqlite_controller_says_why():
    from types import SimpleNamespace

    from hai_cluster.controller.leader import STARTING, Gate, Leader
    from hai_cluster.transport.rpc import RequestError, RpcTable

    async def ping(body, ctx):
        return {"ok": True}
    table = RpcTable()
    table.add("ping", ping)
    ready = []
    leader = SimpleNamespace(active=True)
    gate = Gate(table, leader, ready=lambda: bool(ready))
    with pytest.raises(RequestError, match=r"its store is not open yet"):
        asyncio.run(gate.dispatch("ping", {}, None))
    assert STARTING.startswith("the controller is starting")
    ready.append(True)
    assert asyncio.run(gate.dispatch("ping", {}, None)) == {"ok": True}
    standby = SimpleNamespace(cfg=SimpleNamespace(database="sqlite:////var/lib/hai/hai.db"), lost=None,
                              unreadable=True, other=None)
    assert Leader.standby_message(standby) == ("the controller is not serving yet (its store cannot be read or "
                                               "written); try again in a moment")
