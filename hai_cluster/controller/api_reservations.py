"""Advance reservations over the API: scontrol create/show/delete reservation (admins create and
delete; everyone may list), and the check of a submission's --reservation."""
from __future__ import annotations

import time
from dataclasses import asdict

from ..core.hostlist import compress
from ..core.reservation import MAX_ENTRIES, Reservation, ReservationError, parse_reservation
from ..store import reservations as store
from ..transport.rpc import RequestError
from .access import Caller, deny
from .apicontext import ApiContext
from .requests import expect


async def create_reservation(ctx: ApiContext, body, caller: Caller):
    fields = expect(body, "fields", dict, required=True)
    if len(fields) > 16 or not all(isinstance(k, str) and isinstance(v, str) and len(k) < 64
                                   and len(v) < 64 * MAX_ENTRIES for k, v in fields.items()):
        raise RequestError("field 'fields' must map at most 16 names to strings")
    if not caller.admin:
        raise deny(caller, "only administrators may create reservations")
    now = time.time()
    nodes = [n.name for n in ctx.ctl.inventory] or [n["name"] for n in await ctx.ctl.db(ctx.repo.nodes)]
    try:
        r = await ctx.ctl.db(store.create, ctx.repo.engine, parse_reservation(fields, now, nodes), caller.user, now)
    except ReservationError as exc:
        raise RequestError(str(exc)) from None
    ctx.ctl.events.record("reservation_created", None, None, name=r.name, nodes=compress(list(r.nodes)),
                          by=caller.user, start=round(r.start), end=round(r.end))
    ctx.ctl.wake()
    return {"name": r.name}


async def update_reservation(ctx: ApiContext, body, caller: Caller):
    """scontrol update ReservationName=NAME Flags[+-]=...: only the flags change here."""
    name = expect(body, "name", str, required=True)
    op = expect(body, "op", str, required=True)
    flags = expect(body, "flags", str, required=True)
    if op not in ("", "+", "-") or len(name) > 64 or len(flags) > 1000:
        raise RequestError("field 'op' must be '', '+' or '-'; 'name' and 'flags' short strings")
    if not caller.admin:
        raise deny(caller, "only administrators may update reservations")
    try:
        r = await ctx.ctl.db(store.update_flags, ctx.repo.engine, name, op, flags, time.time())
    except ReservationError as exc:
        raise RequestError(str(exc)) from None
    ctx.ctl.events.record("reservation_updated", None, None, name=r.name, flags=",".join(r.flags), by=caller.user)
    ctx.ctl.wake()
    return {"name": r.name, "flags": list(r.flags)}


async def delete_reservation(ctx: ApiContext, body, caller: Caller):
    name = expect(body, "name", str, required=True)
    if not caller.admin:
        raise deny(caller, "only administrators may delete reservations")
    if not await ctx.ctl.db(store.remove, ctx.repo.engine, name):
        raise RequestError(f"delete_reservation {name[:64]}: Requested reservation is invalid")
    ctx.ctl.events.record("reservation_deleted", None, None, name=name, by=caller.user)
    ctx.ctl.wake()
    return {"name": name}


async def reservations(ctx: ApiContext, body, caller: Caller):
    now = time.time()
    rows = []
    for r in await ctx.ctl.db(store.listing, ctx.repo.engine, now):
        start, end = r.window(now)  # a repeating one's occurrence open now or next, as scontrol shows it
        rows.append(dict(asdict(r), start=start, end=end, state=r.state(now)))
    return {"now": now, "reservations": rows}


async def checked_reservation(ctx: ApiContext, name: str, caller: Caller, account: str) -> Reservation:
    """A submission's --reservation: one not ended that the user or their account may use (an
    administrator too: the scheduler holds a job its reservation does not list)."""
    found = next((r for r in await ctx.ctl.db(store.listing, ctx.repo.engine, time.time()) if r.name == name), None)
    if found is None:
        raise RequestError(f"Batch job submission failed: Requested reservation is invalid (no reservation "
                           f"{name}: scontrol show reservation lists them)")
    if not found.allows(caller.user, account):
        raise deny(caller, f"Batch job submission failed: Access denied to requested reservation {name}")
    return found
