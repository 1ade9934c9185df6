"""Nodes an admin adds and removes at run time (`hcontrol node add/remove`), next to [[nodes]]."""
from __future__ import annotations

from typing import Sequence

from sqlalchemy import Engine, delete, insert, select

from .schema import gpus, nodes


def add_node(engine: Engine, *, name: str, address: str, port: int, ssh_user: str, agent_socket: str,
             partitions: Sequence[str], now: float) -> bool:
    """Register a node; False when the name is taken. It starts as not responding (like a
    configured node at start-up) with node_down_after from now to answer."""
    with engine.begin() as c:
        if c.execute(select(nodes.c.name).where(nodes.c.name == name)).first() is not None:
            return False
        c.execute(insert(nodes).values(name=name, address=address, state="up", responding=False, cpus=0, mem_mb=0,
                                       partitions=list(partitions), unreachable_since=now, added=True, port=port,
                                       ssh_user=ssh_user, agent_socket=agent_socket))
        return True


def added_nodes(engine: Engine) -> list[dict]:
    with engine.connect() as c:
        return [dict(r._mapping) for r in c.execute(select(nodes).where(nodes.c.added.is_(True))
                                                    .order_by(nodes.c.name))]


def delete_node(engine: Engine, name: str) -> bool:
    """Forget a node and its GPUs (its runs stay in the accounting)."""
    with engine.begin() as c:
        c.execute(delete(gpus).where(gpus.c.node == name))
        return c.execute(delete(nodes).where(nodes.c.name == name)).rowcount == 1
