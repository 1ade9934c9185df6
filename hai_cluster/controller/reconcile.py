"""Making the store and each agent agree: on every (re)connection (hello) and every
RESYNC_INTERVAL. The store is the truth for what may hold GPUs: a run it does not know live is
ended; a run it knows that the agent no longer has is recorded lost (after a second look)."""
from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from ..protocol.runspec import RunStatus, SpecError
from ..transport.rpc import RpcError
from .health import on_health
from .nodes import AGENT_ERRORS

if TYPE_CHECKING:
    from .service import Controller

log = logging.getLogger(__name__)

STRAY_WAIT_MAX = 600  # seconds; longer than any sane grace period


async def on_hello(ctl: Controller, node: str, hello: dict) -> None:
    """Reconcile with what the agent runs, then let the node take work again."""
    await ctl.db(ctl.repo.update_inventory, node, hello, time.time())
    if hello.get("health") is not None:
        await on_health(ctl, node, hello["health"])
    strays = await reconcile(ctl, node, hello.get("runs", []))
    if strays:
        await wait_for_strays(ctl, node, strays)
    await ctl.db(ctl.repo.set_responding, node, True, time.time())
    ctl.events.record("node_up", None, node, gpus=len(hello.get("gpus", [])), backend=hello.get("gpu_backend"))
    ctl.wake()


async def resync_all(ctl: Controller) -> None:
    for name, link in ctl.links.items():
        if link.connected:
            try:
                runs = (await link.call("list_runs", {}))["runs"]
            except (RpcError, *AGENT_ERRORS) as exc:
                log.info("resync with %s failed: %s", name, exc)
                continue
            await reconcile(ctl, name, runs)


def statuses(node: str, runs) -> dict[tuple[int, int], RunStatus]:
    """An agent's run list, checked: by (job id, attempt). A malformed entry is logged and left
    out (its run is then looked at again at the next resync, or recorded lost)."""
    out = {}
    for raw in runs if isinstance(runs, list) else ():
        try:
            status = RunStatus.from_wire(raw)
        except SpecError as exc:
            log.warning("node %s reported a malformed run status (%s); ignored", node, exc)
            continue
        out[status.job_id, status.attempt] = status
    return out


async def reconcile(ctl: Controller, node: str, runs: list) -> set:
    """Make the store and an agent's run list agree. Returns the stray runs told to end."""
    reported = statuses(node, runs)
    known = {(r.job_id, r.attempt): r for r in await ctl.db(ctl.repo.live_ranks, node)}
    strays = []
    for key, status in reported.items():
        if status.ended:
            await ctl.run_ended(node, status)
        elif key not in known:
            # The store is the truth: a run it does not have as live (ended while the node was
            # unreachable, or never recorded) must not hold GPUs.
            log.warning("node %s runs job %d attempt %d, which the store does not know live; ending it",
                        node, *key)
            strays.append(key)
            try:
                await ctl.links[node].call("terminate_run", {"job_id": key[0], "attempt": key[1],
                                                             "reason": "cancel"})
            except (RpcError, *AGENT_ERRORS) as exc:
                log.warning("could not end unknown run on %s: %s", node, exc)
        elif known[key].state == "starting":
            await ctl.db(ctl.repo.mark_rank_running, key[0], key[1], node)
    missing = [(key, r) for key, r in known.items() if key not in reported and r.state == "running"]
    if missing:
        # A second look, taken after the store was read: a run started while the first list was
        # on its way shows up here, so only a run that really vanished is declared lost.
        listed = (await ctl.links[node].call("list_runs", {}))["runs"]
        fresh = set(statuses(node, listed))
        missing = [(key, r) for key, r in missing if key not in fresh]
    for key, r in missing:
        log.warning("job %d attempt %d: node %s no longer has the run; recording it lost", *key, node)
        await ctl.run_ended(node, RunStatus.ended_by(key[0], key[1], r.rank, "lost", f"run vanished from node {node}"))
    return set(strays)


async def wait_for_strays(ctl: Controller, node: str, strays: set) -> None:
    """Leftover processes go before the node takes new work (their grace period included)."""
    deadline = time.monotonic() + STRAY_WAIT_MAX
    while strays and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        runs = statuses(node, (await ctl.links[node].call("list_runs", {}))["runs"])
        for key in list(strays):
            status = runs.get(key)
            if status is None:  # ended, reported and acknowledged meanwhile
                strays.discard(key)
            elif status.ended:
                strays.discard(key)
                await ctl.run_ended(node, status)  # recorded already: this acknowledges it
    if strays:
        log.warning("node %s: %d leftover run(s) still alive after %d s; taking work anyway",
                    node, len(strays), STRAY_WAIT_MAX)
