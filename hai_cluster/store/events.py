"""The event table: append, read a job's or a node's history, prune by age."""
from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

from sqlalchemy import Connection, Engine, delete, insert, select

from .schema import event_nodes, events


# Built once: every scheduling pass writes events. They are inserted in the order given (ids are
# the history's order) and return their ids, for the rows in event_nodes of those naming nodes.
_ADD = insert(events).returning(events.c.id, sort_by_parameter_order=True)
_ADD_NODES = insert(event_nodes)


def add_events(engine: Engine, rows: Iterable[Mapping]) -> None:
    """Append events (dicts with time, kind, job_id, node, detail) in one transaction; `node`
    is one node or a gang start's, comma-separated."""
    rows = list(rows)
    if rows:
        with engine.begin() as c:
            add_events_in(c, rows)


def add_events_in(c: Connection, rows: Iterable[Mapping]) -> None:
    """add_events on the caller's transaction: the change and its event commit together."""
    rows = list(rows)
    if not rows:
        return
    ids = c.execute(_ADD, rows).scalars().all()
    named = [{"event_id": i, "node": n} for i, r in zip(ids, rows) if r.get("node")
             for n in sorted({n[:64] for n in r["node"].split(",") if n})]
    if named:
        c.execute(_ADD_NODES, named)


# A change's events, built from its result inside its transaction (controller/events.py's Draft)
Journal = Callable[[Any], Iterable[Mapping]] | None


def journal(c: Connection, events: Journal, result: Any) -> Any:
    """Write the events a change's caller built from its result (controller/events.py's Draft)
    in the change's own transaction; returns the result."""
    if events is not None:
        add_events_in(c, events(result))
    return result


def events_query(*, job_id: int | None = None, node: str | None = None, limit: int | None = None):
    """The select of read_events: with a limit, newest first."""
    q = select(events.c.time, events.c.kind, events.c.job_id, events.c.node, events.c.detail)
    if job_id is not None:
        q = q.where(events.c.job_id == job_id)
    order = events.c.id
    if node is not None:  # through the index of (node, event id): never a scan of every event
        q = q.join(event_nodes, event_nodes.c.event_id == events.c.id).where(event_nodes.c.node == node)
        order = event_nodes.c.event_id
    return q.order_by(order.desc()).limit(limit) if limit else q.order_by(order)


def read_events(engine: Engine, *, job_id: int | None = None, node: str | None = None,
                limit: int | None = None) -> list[dict]:
    """Oldest first (with a limit, the newest `limit`); a node's history includes the gang starts
    that named it among others."""
    with engine.connect() as c:
        rows = [dict(r._mapping) for r in c.execute(events_query(job_id=job_id, node=node, limit=limit))]
    return rows[::-1] if limit else rows


def prune_events(engine: Engine, before: float) -> int:
    with engine.begin() as c:
        return c.execute(delete(events).where(events.c.time < before)).rowcount
