"""Store side of advance reservations: one row each, read into every snapshot while not ended.
Synchronous, on the controller's store thread like the repository."""
from __future__ import annotations

from dataclasses import replace

from sqlalchemy import Engine, bindparam, delete, insert, select

from ..core.reservation import Reservation, ReservationError
from .schema import reservations

_LIVE = select(reservations).where(reservations.c.end_time > bindparam("p_now")).order_by(reservations.c.start_time)


def _record(r) -> Reservation:
    return Reservation(r.name, tuple(r.nodes), r.start_time, r.end_time, tuple(r.users), tuple(r.accounts))


def live(c, now: float) -> tuple[Reservation, ...]:
    """The reservations not ended at `now` (a connection of the caller's: the snapshot's)."""
    return tuple(_record(r) for r in c.execute(_LIVE, {"p_now": now}))


def listing(engine: Engine, now: float) -> tuple[Reservation, ...]:
    with engine.connect() as c:
        return live(c, now)


def create(engine: Engine, r: Reservation, by: str, now: float) -> Reservation:
    """Insert `r` (without a name: Slurm's USER_N), or ReservationError if its name is taken or it
    overlaps another on a node (in one transaction, so two creations cannot both pass the check)."""
    with engine.begin() as c:
        # An ended reservation's name may be used again: it is gone for the scheduler too.
        c.execute(delete(reservations).where(reservations.c.end_time <= now))
        taken = {row.name for row in c.execute(select(reservations.c.name))}
        if not r.name:
            r = replace(r, name=next(f"{by}_{n}" for n in range(1, len(taken) + 2) if f"{by}_{n}" not in taken))
        for other in live(c, now):
            if other.name == r.name:
                raise ReservationError(f"Error creating the reservation: Reservation {r.name} already exists")
            if other.overlaps(r):
                raise ReservationError(f"Error creating the reservation: Requested reservation overlaps with "
                                       f"another reservation ({other.name})")
        c.execute(insert(reservations).values(name=r.name, nodes=list(r.nodes), start_time=r.start, end_time=r.end,
                                              users=list(r.users), accounts=list(r.accounts), created_by=by,
                                              created_at=now))
    return r


def remove(engine: Engine, name: str) -> bool:
    with engine.begin() as c:
        return c.execute(delete(reservations).where(reservations.c.name == name)).rowcount == 1
