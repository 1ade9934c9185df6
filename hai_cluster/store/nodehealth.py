"""Node health in the store: drain a node whose agent reports it unhealthy, and return it to
service when the checks pass again, only if it was the health check that drained it (reason
`health: ...`): a node an admin drained or downed stays as the admin left it.

A sticky report (a critical GPU XID: only a reset clears it) drains the node with a reason that
ends in STICKY_NOTE, even one an admin drained for something else, and passing checks do not
resume it: an admin does (`hcontrol update node=X state=resume`), after the reset."""
from __future__ import annotations

from sqlalchemy import update

from .schema import nodes

PREFIX = "health: "
STICKY_NOTE = "; resume by hand after the reset"
REASON_LEN = 200  # nodes.reason


def sticky_reason(reason: str) -> str:
    return (PREFIX + (reason or "unhealthy"))[:REASON_LEN - len(STICKY_NOTE)] + STICKY_NOTE


def apply_health(engine, name: str, ok: bool, reason: str, sticky: bool = False) -> str | None:
    """'drained', 'resumed', or None when nothing changed."""
    not_sticky = ~nodes.c.reason.like("%" + STICKY_NOTE)
    health_drained = (nodes.c.name == name, nodes.c.state == "drain", nodes.c.reason.like("health:%"), not_sticky)
    with engine.begin() as c:
        if ok:
            res = c.execute(update(nodes).where(*health_drained).values(state="up", reason=None))
            return "resumed" if res.rowcount else None
        if sticky:
            was_up = c.execute(update(nodes).where(nodes.c.name == name, nodes.c.state == "up")
                               .values(state="drain", reason=sticky_reason(reason))).rowcount
            if was_up:
                return "drained"
            # drained already (by the checks or an admin): the fault that needs a reset is the reason now
            c.execute(update(nodes).where(nodes.c.name == name, nodes.c.state == "drain",
                                          nodes.c.reason.is_(None) | not_sticky)
                      .values(reason=sticky_reason(reason)))
            return None
        why = (PREFIX + (reason or "unhealthy"))[:REASON_LEN]
        res = c.execute(update(nodes).where(nodes.c.name == name, nodes.c.state == "up")
                        .values(state="drain", reason=why))
        if res.rowcount:
            return "drained"
        c.execute(update(nodes).where(*health_drained, nodes.c.reason != why).values(reason=why))
        return None
