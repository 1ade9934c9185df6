"""Store side of advance reservations: one row each, read into every snapshot while not ended.
Synchronous, on the controller's store thread like the repository."""
from __future__ import annotations

from dataclasses import replace

from sqlalchemy import Engine, delete, insert, select, update

from ..core.hostlist import compress
from ..core.reservation import FLAGS, Reservation, ReservationError, busy_nodes, updated_flags
from ..core.states import ACTIVE_STATES
from .schema import jobs, reservations

_RUNNING = select(jobs.c.nodelist, jobs.c.start_time, jobs.c.time_limit).where(
    jobs.c.state.in_([s.value for s in ACTIVE_STATES]))

# Every row: a repeating (DAILY, WEEKLY) one never ends, so the filter is Reservation.ended's. Rows
# are few (an administrator's) and ended ones are deleted at the next creation.
_ALL = select(reservations).order_by(reservations.c.start_time)


def _record(r) -> Reservation:
    flags = tuple(r.flags or ())  # rows from before 0031: none
    return Reservation(r.name, tuple(r.nodes), r.start_time, r.end_time, tuple(r.users), tuple(r.accounts),
                       tuple(f for f in FLAGS if f in flags), all_nodes="ALL_NODES" in flags)


def live(c, now: float) -> tuple[Reservation, ...]:
    """The reservations not ended at `now` (a connection of the caller's: the snapshot's)."""
    return tuple(r for r in map(_record, c.execute(_ALL)) if not r.ended(now))


def listing(engine: Engine, now: float) -> tuple[Reservation, ...]:
    with engine.connect() as c:
        return live(c, now)


def create(engine: Engine, r: Reservation, by: str, now: float) -> Reservation:
    """Insert `r` (without a name: Slurm's USER_N), or ReservationError if its name is taken or it
    overlaps another on a node (in one transaction, so two creations cannot both pass the check)."""
    with engine.begin() as c:
        # An ended reservation's name may be used again: it is gone for the scheduler too.
        ended = [r.name for r in map(_record, c.execute(_ALL)) if r.ended(now)]
        if ended:
            c.execute(delete(reservations).where(reservations.c.name.in_(ended)))
        taken = {row.name for row in c.execute(select(reservations.c.name))}
        if not r.name:
            r = replace(r, name=next(f"{by}_{n}" for n in range(1, len(taken) + 2) if f"{by}_{n}" not in taken))
        for other in live(c, now):
            if other.name == r.name:
                raise ReservationError(f"Error creating the reservation: Reservation {r.name} already exists")
            if other.conflicts(r):  # MAINT and OVERLAP may share nodes and time
                raise ReservationError(f"Error creating the reservation: Requested reservation overlaps with "
                                       f"another reservation ({other.name})")
        if "IGNORE_JOBS" not in r.flags:
            running = ((tuple(x for x in (j.nodelist or "").split(",") if x),
                        None if j.time_limit is None or j.start_time is None else j.start_time + j.time_limit)
                       for j in c.execute(_RUNNING))
            if busy := busy_nodes(r, running):
                raise ReservationError(f"Error creating the reservation: Requested nodes are busy ({compress(busy[:8])} "
                                       f"held by running jobs past its start; Flags=IGNORE_JOBS creates it anyway)")
        flags = [*r.flags, *(["ALL_NODES"] if r.all_nodes else [])]
        c.execute(insert(reservations).values(name=r.name, nodes=list(r.nodes), start_time=r.start, end_time=r.end,
                                              users=list(r.users), accounts=list(r.accounts), flags=flags or None,
                                              created_by=by, created_at=now))
    return r


def update_flags(engine: Engine, name: str, op: str, text: str, now: float) -> Reservation:
    """scontrol update reservation Flags=: the reservation with its flags changed, checked against
    the others again (one taking off MAINT or OVERLAP may now clash), in one transaction."""
    with engine.begin() as c:
        found = {r.name: r for r in live(c, now)}
        if name not in found:
            raise ReservationError("Error updating the reservation: Requested reservation is invalid")
        r = updated_flags(found[name], op, text)
        for other in found.values():
            if other.name != name and other.conflicts(r):
                raise ReservationError(f"Error updating the reservation: Requested reservation overlaps with "
                                       f"another reservation ({other.name})")
        flags = [*r.flags, *(["ALL_NODES"] if r.all_nodes else [])]
        c.execute(update(reservations).where(reservations.c.name == name).values(flags=flags or None))
    return r


def remove(engine: Engine, name: str) -> bool:
    with engine.begin() as c:
        return c.execute(delete(reservations).where(reservations.c.name == name)).rowcount == 1
