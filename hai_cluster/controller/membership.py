"""Nodes added and removed at run time: `hcontrol node add NAME --address HOST` and `hcontrol node
remove NAME [--force]` (admins).

An added node is a row in the store (with how to reach it) next to the [[nodes]] of the config:
the controller opens its link at once and on every start; its GPUs, CPUs and memory come from
the agent's hello, as for any node. Removing refuses while jobs run there; with --force the node
is drained (nothing new starts), its preemptible runs are told to checkpoint and requeue (they
resume elsewhere), runs submitted with --no-requeue finish, and the node goes once none is left.
A removal under way survives a controller restart (the node's drain reason says so).
"""
from __future__ import annotations

import asyncio
import logging
import re
import time
from dataclasses import replace
from typing import TYPE_CHECKING

from ..config import NodeConfig
from ..core.states import JobState
from ..paths import DEFAULT_AGENT_SOCKET
from ..store.membership import add_node, added_nodes, delete_node
from ..transport.rpc import RequestError
from .requests import expect, str_list

if TYPE_CHECKING:
    from .service import Controller

log = logging.getLogger(__name__)

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
REMOVING = "Removing"  # drain reason prefix of a node being removed


def node_config(row: dict) -> NodeConfig:
    return NodeConfig(name=row["name"], address=row["address"], transport="ssh", port=row["port"] or 22,
                      agent_socket=row["agent_socket"] or DEFAULT_AGENT_SOCKET, partitions=tuple(row["partitions"]))


async def resume(ctl: Controller) -> None:
    """At start: open the links of added nodes, and finish removals that were under way."""
    configured = {n.name for n in ctl.cfg.nodes}
    for row in await ctl.db(added_nodes, ctl.repo.engine):
        if row["name"] in configured:
            continue  # now in [[nodes]] as well: the config's entry wins
        ctl.open_link(node_config(row), replace(ctl.cfg.ssh, user=row["ssh_user"] or ctl.cfg.ssh.user))
        if row["state"] == "drain" and (row["reason"] or "").startswith(REMOVING):
            ctl.spawn(_remove_when_empty(ctl, row["name"], "a removal begun before a restart"))


async def add(ctl: Controller, *, name: str, address: str, port: int, user: str | None, agent_socket: str | None,
              partitions: list[str] | None, by: str) -> dict:
    if not NAME.fullmatch(name):
        raise RequestError(f"Invalid node name {name!r}: letters, digits, '.', '_' and '-', at most 64")
    if not address or any(ch.isspace() for ch in address):
        raise RequestError(f"Invalid address {address!r} for node {name}")
    if not 1 <= port <= 65535:
        raise RequestError(f"Invalid port {port} for node {name} (1-65535)")
    if partitions is not None:
        unknown = [p for p in partitions if p not in ctl.cfg.partitions]
        if unknown or not partitions:
            raise RequestError(f"Invalid partition(s) for node {name}: {', '.join(unknown) or '(none)'}; "
                               f"the controller has {', '.join(ctl.cfg.partitions)}")
    if agent_socket is not None and not agent_socket.startswith("/"):
        raise RequestError(f"The agent socket of node {name} must be an absolute path, got {agent_socket!r}")
    node = NodeConfig(name=name, address=address, transport="ssh", port=port,
                      agent_socket=agent_socket or DEFAULT_AGENT_SOCKET,
                      partitions=tuple(partitions or ctl.cfg.partitions))
    ssh_user = user or ctl.cfg.ssh.user
    if name in ctl.links or not await ctl.db(add_node, ctl.repo.engine, name=name, address=address, port=port,
                                             ssh_user=ssh_user, agent_socket=node.agent_socket,
                                             partitions=node.partitions, now=time.time()):
        raise RequestError(f"Node {name} already exists")
    ctl.open_link(node, replace(ctl.cfg.ssh, user=ssh_user))
    ctl.events.record("node_added", None, name, address=f"{ssh_user}@{address}:{port}", by=by,
                      partitions=",".join(node.partitions))
    return {"name": name}


async def remove(ctl: Controller, name: str, *, force: bool, by: str) -> dict:
    row = next((n for n in await ctl.db(ctl.repo.nodes) if n["name"] == name), None)
    if row is None:
        raise RequestError(f"Node {name} not found")
    if any(n.name == name for n in ctl.cfg.nodes):
        raise RequestError(f"Node {name} comes from [[nodes]] in the controller's config: remove it there "
                           f"and restart the controller")
    job_ids = sorted({r.job_id for r in await ctl.db(ctl.repo.live_ranks, name)})
    if not job_ids:
        await _forget(ctl, name, by)
        return {"name": name, "removed": True, "jobs": []}
    if not force:
        raise RequestError(f"Node {name} runs job(s) {', '.join(map(str, job_ids))}: drain it and wait "
                           f"(hcontrol update NodeName={name} State=DRAIN Reason=...), or use --force")
    why = f"{REMOVING} (hcontrol node remove --force by {by})"
    await ctl.db(ctl.repo.set_node_state, name, "drain", why)
    ctl.events.record("node_state", None, name, state="drain", by=by, reason=why)
    told = []
    for job_id in job_ids:
        job = await ctl.db(ctl.repo.job_record, job_id)
        if job and job.preemptible and job.state == JobState.RUNNING.value:
            if await ctl.preempt(job_id, "preempt", f"node {name} is being removed by {by}", by=by):
                told.append(job_id)
    ctl.spawn(_remove_when_empty(ctl, name, by))
    ctl.wake()
    return {"name": name, "removed": False, "jobs": job_ids, "preempted": told}


async def _remove_when_empty(ctl: Controller, name: str, by: str) -> None:
    while True:
        await asyncio.sleep(ctl.cfg.tick_seconds)
        try:
            row = next((n for n in await ctl.db(ctl.repo.nodes) if n["name"] == name), None)
            if row is None:
                return
            if row["state"] != "drain" or not (row["reason"] or "").startswith(REMOVING):
                log.info("node %s: removal called off (the node was resumed)", name)
                return
            if not await ctl.db(ctl.repo.live_ranks, name):
                await _forget(ctl, name, by)
                return
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the store is down, say: try again next round
            log.info("node %s: removal waits (%s)", name, exc)


async def _forget(ctl: Controller, name: str, by: str) -> None:
    await ctl.close_link(name)
    await ctl.db(delete_node, ctl.repo.engine, name)
    ctl.events.record("node_removed", None, name, by=by)
    ctl.wake()


def expose(api, ctl: Controller) -> None:
    """The API methods (api.py calls this; the request checks live here with the logic)."""
    def admin_only(caller, what: str) -> None:
        if not caller.admin:
            raise RequestError(f"Access/permission denied: only administrators may {what} nodes")

    @api.expose("node_add")
    async def node_add(body, caller):
        admin_only(caller, "add")
        return await add(ctl, name=expect(body, "name", str, required=True),
                         address=expect(body, "address", str, required=True),
                         port=expect(body, "port", int, default=22), user=expect(body, "user", str),
                         agent_socket=expect(body, "agent_socket", str), partitions=str_list(body, "partitions"),
                         by=caller.user)

    @api.expose("node_remove")
    async def node_remove(body, caller):
        admin_only(caller, "remove")
        return await remove(ctl, expect(body, "name", str, required=True),
                            force=expect(body, "force", bool, default=False), by=caller.user)
