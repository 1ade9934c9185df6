"""Idempotency keys of submissions: hsubmit sends a fresh key with each submission and sends it
again when the reply was lost (the controller killed after its commit, a connection reset), so the
retry returns the job the first attempt created instead of a second one. Kept a day per (uid, key),
then pruned with the event history."""
from __future__ import annotations

from sqlalchemy import Connection, Engine, bindparam, delete, insert, select

from .schema import submit_keys

KEEP_SECONDS = 86400  # a retry comes within seconds; a day covers a login host's longest outage

# Built once: every submission runs both (a statement built per call cost more than its query).
_JOB_OF = select(submit_keys.c.job_id).where(submit_keys.c.uid == bindparam("p_uid"),
                                             submit_keys.c.key == bindparam("p_key"))
_ADD = insert(submit_keys)


def job_of(c: Connection, uid: int, key: str) -> int | None:
    """The job this uid submitted with this key, if one is kept."""
    return c.execute(_JOB_OF, {"p_uid": uid, "p_key": key}).scalar()


def add(c: Connection, uid: int, key: str, job_id: int, now: float) -> None:
    c.execute(_ADD, {"uid": uid, "key": key, "job_id": job_id, "created": now})


def prune(engine: Engine, before: float) -> int:
    with engine.begin() as c:
        return c.execute(delete(submit_keys).where(submit_keys.c.created < before)).rowcount
