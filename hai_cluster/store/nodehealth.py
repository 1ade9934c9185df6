"""Node health in the store: drain a node whose agent reports it unhealthy, and return it to
service when the checks pass again, only if it was the health check that drained it (reason
`health: ...`): a node an admin drained or downed stays as the admin left it."""
from __future__ import annotations

from sqlalchemy import update

from .schema import nodes

PREFIX = "health: "
REASON_LEN = 200  # nodes.reason


def apply_health(engine, name: str, ok: bool, reason: str) -> str | None:
    """'drained', 'resumed', or None when nothing changed."""
    health_drained = (nodes.c.name == name, nodes.c.state == "drain", nodes.c.reason.like("health:%"))
    with engine.begin() as c:
        if ok:
            res = c.execute(update(nodes).where(*health_drained).values(state="up", reason=None))
            return "resumed" if res.rowcount else None
        why = (PREFIX + (reason or "unhealthy"))[:REASON_LEN]
        res = c.execute(update(nodes).where(nodes.c.name == name, nodes.c.state == "up")
                        .values(state="drain", reason=why))
        if res.rowcount:
            return "drained"
        c.execute(update(nodes).where(*health_drained, nodes.c.reason != why).values(reason=why))
        return None
