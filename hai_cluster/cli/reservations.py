"""scontrol create/show/delete reservation, as hcontrol (and scontrol) commands."""
from __future__ import annotations

import click

from ..core.hostlist import compress
from ..core.timefmt import slurm_duration
from ..core.usertext import printable
from .common import call, fail, iso_time

def _flags(r: dict) -> str:
    """Flags= as Slurm 22.05 prints it: the flags, then SPEC_NODES (nodes are always named) and
    ALL_NODES for Nodes=ALL."""
    return ",".join((*r.get("flags", ()), "SPEC_NODES", *(("ALL_NODES",) if r.get("all_nodes") else ())))


def reservation_lines(r: dict, cpus: dict[str, int]) -> list[str]:
    """One reservation as scontrol show reservation prints it (Slurm 22.05's lines)."""
    cores = sum(cpus.get(n, 0) for n in r["nodes"])
    users = ",".join(r["users"]) or "(null)"
    accounts = ",".join(r["accounts"]) or "(null)"
    return [
        f"ReservationName={printable(r['name'])} StartTime={iso_time(r['start'])} EndTime={iso_time(r['end'])} "
        f"Duration={slurm_duration(round(r['end'] - r['start']))}",
        f"   Nodes={compress(list(r['nodes']))} NodeCnt={len(r['nodes'])} CoreCnt={cores} Features=(null) "
        f"PartitionName=(null) Flags={printable(_flags(r))}",
        f"   TRES=cpu={cores}",
        f"   Users={printable(users)} Groups=(null) Accounts={printable(accounts)} Licenses=(null) "
        f"State={r['state']} BurstBuffer=(null) Watts=n/a",
        "   MaxStartDelay=(null)",
        "",
    ]


def _fields(prog: str, assignments: tuple[str, ...]) -> dict[str, str]:
    fields = {}
    for item in assignments:
        key, sep, value = item.partition("=")
        if not sep:
            fail(prog, f"Invalid input: {item} (expected KEY=VALUE)")
        fields[key] = value
    return fields


def register(main: click.Group, show: click.Group, prog: str) -> None:
    """Add create/delete reservation and show reservation to hcontrol's command groups."""
    @main.group()
    def create():
        """Admins: create a reservation (create reservation KEY=VALUE ...)."""

    @create.command("reservation", context_settings={"ignore_unknown_options": True})
    @click.argument("assignments", nargs=-1, required=True)
    def create_reservation(assignments):
        """ReservationName=NAME StartTime=now|TIME Duration=T|EndTime=TIME Nodes=LIST|ALL Users=U,... Accounts=A,...
        Flags=MAINT,OVERLAP,IGNORE_JOBS"""
        r = call(prog, "create_reservation", {"fields": _fields(prog, assignments)})
        print(f"Reservation created: {r['name']}")

    @main.group()
    def delete():
        """Admins: delete a reservation (delete reservation NAME)."""

    @delete.command("reservation")
    @click.argument("name")
    def delete_reservation(name):
        call(prog, "delete_reservation", {"name": name})

    @show.command("reservation")
    @click.argument("name", required=False)
    def show_reservation(name):
        """The reservations not ended (or the one named)."""
        rows = call(prog, "reservations", {})["reservations"]
        if name is not None:
            rows = [r for r in rows if r["name"] == name]
            if not rows:
                fail(prog, f"Reservation {printable(name)} not found")
        elif not rows:
            print("No reservations in the system")
            return
        cpus = {n["name"]: n["cpus"] for n in call(prog, "nodes", {})["nodes"]}
        for r in rows:
            print("\n".join(reservation_lines(r, cpus)))
