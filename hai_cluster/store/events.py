"""The event table: append, read a job's or a node's history, prune by age."""
from __future__ import annotations

from typing import Iterable, Mapping

from sqlalchemy import Engine, delete, insert, or_, select

from .schema import events


_ADD = insert(events)  # built once: every scheduling pass writes events


def add_events(engine: Engine, rows: Iterable[Mapping]) -> None:
    """Append events (dicts with time, kind, job_id, node, detail) in one transaction."""
    rows = list(rows)
    if rows:
        with engine.begin() as c:
            c.execute(_ADD, rows)


def read_events(engine: Engine, *, job_id: int | None = None, node: str | None = None,
                limit: int | None = None) -> list[dict]:
    """Oldest first; a node's history includes the gang starts that named it among others."""
    q = select(events.c.time, events.c.kind, events.c.job_id, events.c.node, events.c.detail)
    if job_id is not None:
        q = q.where(events.c.job_id == job_id)
    if node is not None:
        name = node.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")  # a name, not a pattern
        q = q.where(or_(events.c.node == node, events.c.node.like(f"{name},%", escape="\\"),
                        events.c.node.like(f"%,{name}", escape="\\"), events.c.node.like(f"%,{name},%", escape="\\")))
    if limit:  # the newest `limit`, still printed oldest first
        q = q.order_by(events.c.id.desc()).limit(limit)
        with engine.connect() as c:
            return [dict(r._mapping) for r in reversed(c.execute(q).all())]
    with engine.connect() as c:
        return [dict(r._mapping) for r in c.execute(q.order_by(events.c.id))]


def prune_events(engine: Engine, before: float) -> int:
    with engine.begin() as c:
        return c.execute(delete(events).where(events.c.time < before)).rowcount
