"""Advance reservations (scontrol create reservation): nodes held for some users or accounts in a
time window. Pure: the parse of scontrol's KEY=VALUE fields, and what a snapshot's nodes and
jobs become under the reservations (`apply`), for every policy and the simulator alike.

In a window, a reserved node takes only jobs of its reservation (sbatch --reservation=NAME), and
such a job takes only its reservation's nodes. Before a window, a job may start on its nodes only
if its time limit ends before the window opens (a job without one may not), as Slurm's backfill
keeps them free; a job of the reservation waits (`Reservation`) until the window opens, and one
whose reservation is gone waits with `ReservationDeleted`.

Flags= (Slurm's words): MAINT (a maintenance window: sinfo shows its idle nodes as `maint`) and
OVERLAP may share nodes and time with other reservations, either way round, as slurmctld lets
them; IGNORE_JOBS creates one even where running jobs would still hold its nodes when it opens
(else `Requested nodes are busy`). Overlapping windows on a node take the jobs of any of them.
DAILY and WEEKLY repeat the window every day or week: everything here reads the occurrence open
now or the next one (`Reservation.window`), so such a reservation never ends.
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
from .usertext import printable

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_WORD = re.compile(r"[A-Za-z0-9_.@-]{1,64}")
MAX_ENTRIES = 1000  # users, accounts or nodes one reservation names
# Flags= this cluster honours, in the order scontrol show reservation prints them (Slurm 22.05's)
FLAGS = ("MAINT", "OVERLAP", "IGNORE_JOBS", "DAILY", "WEEKLY")
PERIODS = {"DAILY": 86400, "WEEKLY": 7 * 86400}  # repeating windows: StartTime/EndTime, then every period
# Slurm's other reservation flags: refused by name, told apart from a word Slurm does not know
UNSUPPORTED_FLAGS = frozenset({
    "HOURLY", "WEEKDAY", "WEEKEND", "FLEX", "ANY_NODES", "STATIC_ALLOC", "PART_NODES",
    "FIRST_CORES", "TIME_FLOAT", "REPLACE", "REPLACE_DOWN", "PURGE_COMP", "NO_HOLD_JOBS_AFTER", "MAGNETIC",
    "NO_MAINT", "NO_FLEX", "NO_HOURLY", "NO_DAILY", "NO_WEEKLY", "NO_WEEKDAY", "NO_WEEKEND", "NO_ANY_NODES",
    "NO_STATIC_ALLOC", "NO_PART_NODES", "NO_REPLACE", "NO_REPLACE_DOWN", "NO_PURGE_COMP", "NO_MAGNETIC",
    "NO_TIME_FLOAT", "SKIP", "USER_DELETE", "NO_USER_DELETE", "LICENSE_ONLY", "NO_LICENSE_ONLY",
    "ALL_NODES", "SPEC_NODES",
})


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
    flags: tuple[str, ...] = ()  # of FLAGS, in their order
    all_nodes: bool = False  # Nodes=ALL (Flags= shows ALL_NODES)

    def allows(self, user: str, account: str) -> bool:
        return user in self.users or account in self.accounts

    @property
    def period(self) -> int | None:
        """DAILY or WEEKLY: the window comes back every period (seconds); None: once."""
        return next((PERIODS[f] for f in self.flags if f in PERIODS), None)

    def window(self, now: float) -> tuple[float, float]:
        """The window open at `now`, else the next one (a repeating reservation's occurrence;
        slurmctld moves StartTime/EndTime on the same way once one ends)."""
        p = self.period
        if p is None or now < self.end:
            return self.start, self.end
        k = int((now - self.end) // p) + 1  # the first occurrence ending after now
        return self.start + k * p, self.end + k * p

    def ended(self, now: float) -> bool:
        return self.period is None and self.end <= now

    def active(self, now: float) -> bool:
        start, end = self.window(now)
        return start <= now < end

    def _first_after(self, t: float) -> tuple[float, float]:
        """Its first window that ends after `t` (a repeating one's from its first on)."""
        return self.window(t) if t >= self.start else (self.start, self.end)

    def overlaps(self, other: Reservation) -> bool:
        if not set(self.nodes) & set(other.nodes):
            return False
        if self.period is None and other.period is None:
            return self.start < other.end and other.start < self.end
        if self.period is None or other.period is None:  # a once against a repeating one
            once, rep = (self, other) if self.period is None else (other, self)
            start, _ = rep._first_after(once.start)
            return start < once.end
        # both repeat, one period a multiple of the other: one longest period from the later start shows all
        t, span = max(self.start, other.start), max(self.period, other.period)
        start, end = self.window(t)
        while start < t + 2 * span:
            if Reservation(self.name, self.nodes, start, end).overlaps(other):
                return True
            start, end = start + self.period, end + self.period
        return False

    @property
    def may_overlap(self) -> bool:
        """MAINT and OVERLAP share nodes and time with any other (slurmctld checks neither way)."""
        return "MAINT" in self.flags or "OVERLAP" in self.flags

    def conflicts(self, other: Reservation) -> bool:
        return self.overlaps(other) and not (self.may_overlap or other.may_overlap)

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
                               f"Nodes, Users, Accounts, Flags)")
    flags = parse_flags(f.get("flags", ""))
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
    check_period(flags, start, end)
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
    return Reservation(name, nodes, start, end, users, accounts, flags, all_nodes=text.upper() == "ALL")


def check_period(flags: Sequence[str], start: float, end: float) -> None:
    """A repeating window repeats one way and fits its period (else it would overlap itself)."""
    if len([x for x in flags if x in PERIODS]) > 1:
        raise ReservationError("Flags=DAILY,WEEKLY: a reservation repeats daily or weekly, not both")
    for x in flags:
        if x in PERIODS and end - start > PERIODS[x]:
            raise ReservationError(f"Error creating the reservation: Invalid time specification (a {x} "
                                   f"reservation lasts at most {PERIODS[x] // 3600} hours)")


def updated_flags(r: Reservation, op: str, text: str) -> Reservation:
    """scontrol update reservation's Flags= and Flags+= (add these) or Flags-= (take them off), as
    Slurm 22.05's: `op` is "", "+" or "-"."""
    try:
        given = parse_flags(text)
    except ReservationError as exc:
        raise ReservationError(str(exc).replace("No reservation created.", "No reservation update.")) from None
    if not given:
        raise ReservationError(f"Error parsing flags {printable(text[:80])}.  No reservation update.")
    kept = set(r.flags) - set(given) if op == "-" else set(r.flags) | set(given)
    flags = tuple(f for f in FLAGS if f in kept)
    check_period(flags, r.start, r.end)
    return replace(r, flags=flags)


def parse_flags(text: str) -> tuple[str, ...]:
    """Flags=MAINT,ignore_jobs (any case) -> the flags in FLAGS' order, or ReservationError in
    scontrol's words for a word Slurm does not know, and by name for one of Slurm's we do not honour."""
    words = [w.strip().upper() for w in text.split(",") if w.strip()]
    for w in words:
        if w in UNSUPPORTED_FLAGS:
            raise ReservationError(f"Flags={w}: Slurm's reservation flag is not supported by this cluster "
                                   f"(docs/SLURM.md; supported: {', '.join(FLAGS)}).  No reservation created.")
        if w not in FLAGS:
            raise ReservationError(f"Error parsing flags {printable(text[:80])}.  No reservation created.")
    return tuple(f for f in FLAGS if f in words)


def busy_nodes(r: Reservation, running: Iterable[tuple[Sequence[str], float | None]]) -> list[str]:
    """Nodes of `r` that running jobs would still hold when it opens: `running` gives each job's
    nodes and the end of its time limit (None: no limit). Slurm refuses such a reservation
    (`Requested nodes are busy`) unless Flags=IGNORE_JOBS."""
    mine, start = set(r.nodes), r.start  # a repeating one's first window comes first
    return sorted({n for nodes, end in running if end is None or end > start for n in nodes if n in mine})


def apply(snapshot: Snapshot, reservations: Iterable[Reservation]) -> tuple[Snapshot, dict[int, str]]:
    """The snapshot as the policy sees it under `reservations` (nodes marked, the pending jobs of
    a reservation not open now taken out) and the pending reason of each job taken out."""
    now = snapshot.now
    live = [r for r in reservations if not r.ended(now)]
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
        if r.ended(now):
            continue
        start, _ = r.window(now)  # a repeating one: the occurrence open now, or the next
        for n in r.nodes:
            if r.active(now):  # overlapping windows (MAINT, OVERLAP): every name, comma-joined
                active[n] = f"{active[n]},{r.name}" if n in active else r.name
            elif n not in upcoming or start < upcoming[n]:
                upcoming[n] = start
    return tuple(
        replace(n, reservation=active.get(n.name),
                free_for=(upcoming[n.name] - now) if n.name not in active and n.name in upcoming else None)
        if n.name in active or n.name in upcoming else n
        for n in nodes)


def reservation_misfit(job: JobView, node: NodeView) -> str | None:
    """Why a reservation keeps one rank of `job` off `node` (fits() asks where either says one)."""
    held_by = node.reservation.split(",") if node.reservation is not None else ()
    if node.reservation is not None and job.reservation not in held_by:
        return f"{node.name} is reserved ({node.reservation})"
    if job.reservation is not None and job.reservation not in held_by:
        return f"{node.name} is not in reservation {job.reservation} now"
    if node.free_for is not None and (job.time_limit is None or job.time_limit > node.free_for):
        return (f"{node.name} is reserved in {node.free_for:.0f} s, before the job's time limit ends"
                if job.time_limit is not None else f"{node.name} is reserved later and the job has no time limit")
    return None
