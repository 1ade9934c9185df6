"""Advance reservations (scontrol create reservation): nodes held for some users or accounts in a
time window. Pure: the parse of scontrol's KEY=VALUE fields, and what a snapshot's nodes and
jobs become under the reservations (`apply`), for every policy and the simulator alike.

In a window, a reserved node takes only jobs of its reservation (sbatch --reservation=NAME), and
such a job takes only its reservation's nodes. Before a window, a job may start on its nodes only
if its time limit ends before the window opens (a job without one may not), as Slurm's backfill
keeps them free; a job of the reservation waits (`Reservation`) until the window opens, and one
whose reservation is gone waits with `ReservationDeleted`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Iterable, Mapping, Sequence

from .hostlist import compress, expand
from .model import JobView, NodeView, Snapshot
from .reasons import RESERVATION, RESERVATION_DELETED
from .states import JobState
from .timefmt import parse_datetime, parse_time_limit

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_WORD = re.compile(r"[A-Za-z0-9_.@-]{1,64}")
MAX_ENTRIES = 1000  # users, accounts or nodes one reservation names


class ReservationError(ValueError):
    """A refused reservation request; the text says why, in scontrol's words where it has them."""


@dataclass(frozen=True)
class Reservation:
    name: str
    nodes: tuple[str, ...]
    start: float
    end: float
    users: tuple[str, ...] = ()  # who may use it (with accounts: either); both empty: nobody but admins
    accounts: tuple[str, ...] = ()

    def allows(self, user: str, account: str) -> bool:
        return user in self.users or account in self.accounts

    def active(self, now: float) -> bool:
        return self.start <= now < self.end

    def overlaps(self, other: Reservation) -> bool:
        return bool(set(self.nodes) & set(other.nodes)) and self.start < other.end and other.start < self.end

    def state(self, now: float) -> str:
        return "ACTIVE" if self.active(now) else "INACTIVE"


def _names(text: str, what: str) -> tuple[str, ...]:
    items = tuple(dict.fromkeys(x for x in text.split(",") if x))
    if not items or len(items) > MAX_ENTRIES:
        raise ReservationError(f"{what}= needs 1 to {MAX_ENTRIES} names")
    for x in items:
        if not _WORD.fullmatch(x):
            raise ReservationError(f"{what}={text[:80]}: {x[:64]!r} is not a name")
    return items


def parse_reservation(fields: Mapping[str, str], now: float, cluster_nodes: Sequence[str]) -> Reservation:
    """scontrol's `create reservation` fields (keys in any case) -> the reservation, or ReservationError.
    ReservationName=, StartTime= (now, now+1hour, an ISO time, ...), Duration= or EndTime=,
    Nodes= (a hostlist, or ALL), Users= and/or Accounts= (comma lists)."""
    f = {k.lower(): v for k, v in fields.items()}
    known = {"reservationname", "starttime", "duration", "endtime", "nodes", "users", "accounts", "flags"}
    if unknown := sorted(set(f) - known):
        raise ReservationError(f"Invalid input: {unknown[0]} (ReservationName, StartTime, Duration or EndTime, "
                               f"Nodes, Users, Accounts)")
    if f.get("flags"):
        raise ReservationError(f"Flags={f['flags'][:80]}: reservation flags are not supported")
    name = f.get("reservationname", "")  # "": the store names it USER_N, as slurmctld does
    if name and not NAME.fullmatch(name):
        raise ReservationError("ReservationName= must be letters, digits, _ . - (at most 64)")
    try:
        start = now if f.get("starttime", "now").lower() == "now" else parse_datetime(f["starttime"], now)
    except ValueError as exc:
        raise ReservationError(f"StartTime={f['starttime'][:80]}: {exc}") from None
    if "duration" in f and "endtime" in f:
        raise ReservationError("give Duration= or EndTime=, not both")
    if "duration" not in f and "endtime" not in f:
        raise ReservationError("Duration= or EndTime= is required")
    try:
        if "duration" in f:
            seconds = parse_time_limit(f["duration"])
            if seconds is None:
                raise ValueError("an unlimited reservation is not supported")
            end = start + seconds
        else:
            end = parse_datetime(f["endtime"], now)
    except ValueError as exc:
        key = "Duration" if "duration" in f else "EndTime"
        raise ReservationError(f"{key}={f[key.lower()][:80]}: {exc}") from None
    if end <= start or end <= now:
        raise ReservationError("Error creating the reservation: Invalid time specification (it ends before "
                               "it starts, or has ended)")
    text = f.get("nodes", "")
    if not text:
        raise ReservationError("Nodes= is required (a hostlist such as gpu[01-04], or ALL)")
    if text.upper() == "ALL":
        nodes = tuple(sorted(cluster_nodes))
    else:
        try:
            nodes = tuple(sorted(set(expand(text))))
        except ValueError as exc:
            raise ReservationError(f"Nodes={text[:80]}: {exc}") from None
        if len(nodes) > MAX_ENTRIES:
            raise ReservationError(f"Nodes= names more than {MAX_ENTRIES} nodes")
        if missing := [n for n in nodes if n not in set(cluster_nodes)]:
            raise ReservationError(f"Error creating the reservation: Invalid node name specified: "
                                   f"{compress(missing[:8])}")
    users = _names(f["users"], "Users") if f.get("users") else ()
    accounts = _names(f["accounts"], "Accounts") if f.get("accounts") else ()
    if not users and not accounts:
        raise ReservationError("Users= or Accounts= is required (who may use the reservation)")
    return Reservation(name, nodes, start, end, users, accounts)


def apply(snapshot: Snapshot, reservations: Iterable[Reservation]) -> tuple[Snapshot, dict[int, str]]:
    """The snapshot as the policy sees it under `reservations` (nodes marked, the pending jobs of
    a reservation not open now taken out) and the pending reason of each job taken out."""
    now = snapshot.now
    live = [r for r in reservations if r.end > now]
    by_name = {r.name: r for r in live}
    held: dict[int, str] = {}
    for j in snapshot.jobs:
        if j.reservation is not None and j.state == JobState.PENDING and j.ineligible(now) is None:
            r = by_name.get(j.reservation)
            # not allowed: a new reservation under the name of the deleted one the job was for
            if r is None or not r.allows(j.user, j.account):
                held[j.id] = RESERVATION_DELETED
            elif not r.active(now):
                held[j.id] = RESERVATION
    if not live and not held:
        return snapshot, {}
    jobs = tuple(j for j in snapshot.jobs if j.id not in held)
    return replace(snapshot, nodes=mark_nodes(snapshot.nodes, live, now), jobs=jobs), held


def mark_nodes(nodes: Iterable[NodeView], reservations: Iterable[Reservation], now: float) -> tuple[NodeView, ...]:
    """The nodes with their reservation now (NodeView.reservation) or the seconds until one starts
    (free_for): for the policy, and for the applier's check of each start against the same rules."""
    active: dict[str, str] = {}
    upcoming: dict[str, float] = {}
    for r in reservations:
        if r.end <= now:
            continue
        for n in r.nodes:
            if r.active(now):
                active[n] = r.name
            elif n not in upcoming or r.start < upcoming[n]:
                upcoming[n] = r.start
    return tuple(
        replace(n, reservation=active.get(n.name),
                free_for=(upcoming[n.name] - now) if n.name not in active and n.name in upcoming else None)
        if n.name in active or n.name in upcoming else n
        for n in nodes)


def reservation_misfit(job: JobView, node: NodeView) -> str | None:
    """Why a reservation keeps one rank of `job` off `node` (fits() asks where either says one)."""
    if node.reservation is not None and job.reservation != node.reservation:
        return f"{node.name} is reserved ({node.reservation})"
    if job.reservation is not None and node.reservation != job.reservation:
        return f"{node.name} is not in reservation {job.reservation} now"
    if node.free_for is not None and (job.time_limit is None or job.time_limit > node.free_for):
        return (f"{node.name} is reserved in {node.free_for:.0f} s, before the job's time limit ends"
                if job.time_limit is not None else f"{node.name} is reserved later and the job has no time limit")
    return None
