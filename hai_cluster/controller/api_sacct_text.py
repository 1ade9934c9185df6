"""sacct's text, rendered here for the compiled sacct (hai_cluster/native/sacct.c), as squeue_text
(api_listing_text.py) renders squeue's: the client sends its argv, the variables sacct reads and
its clock and time zone; the text is made by the Python sacct's own code (cli/sacct.py: query(),
shown_rows(), text_of()) over the pages the `acct` request gives, so it is the Python sacct's.

Two things squeue did not need. sacct's default window starts at midnight *local* time and
Submit/Start/End print local times, in the client's zone: the client sends its TZ variable, its
`now`, its midnight (mktime) and its UTC offset at a few instants; any difference from this
process's zone is a fallback. And whose jobs: with no -a/-u/-j the Python sacct lists
getpass.getuser()'s jobs unless it runs as root; here the uid is the caller's (SO_PEERCRED), the
name the client's variables (else its uid's name), as getpass.getuser() reads them.

Whatever this does not render the same way is answered {"fallback": why}, and the client runs the
Python sacct with the same argv and environment: forms the fast parse leaves to click, -e, -M,
bad values (sacct's error), another time zone, a refused listing, more than MAX_PAGES pages or
MAX_TEXT_BYTES of text."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

from ..cli import sacct
from ..cli.common import shown_listing
from ..cli.fastargs import parse_simple
from ..core.timefmt import parse_datetime
from ..transport.rpc import RequestError
from . import api_jobs
from .access import Caller
from .api_listing_text import CLOCK_REUSE, MAX_TEXT_BYTES, USER_ENV, client_args, client_user
from .apicontext import ApiContext
from .requests import expect

ENV_NAMES = frozenset({"SACCT_FORMAT", "TZ"}) | frozenset(USER_ENV)
MAX_PAGES = 2  # of the acct listing: more is the Python sacct's, which pages
MAX_OFFSETS = 8  # (instant, UTC offset) pairs of the client's zone
MAX_TIME = 1e11  # seconds since the epoch (year 5138): past it Python's datetime and localtime fail
KEYS = ("jobs", "runs", "steps")
# Fields whose text of a run that has not ended moves with the clock (its elapsed time)
ELAPSED = frozenset({"Elapsed", "ElapsedRaw", "CPUTime", "CPUTimeRAW", "GPUHours"})


class Fallback(Exception):
    """This listing is the Python sacct's to print (the reason is for the client's debugging)."""


@dataclass(frozen=True)
class Clock:
    """The client's clock and zone, as it sent them."""
    tz: str | None  # its TZ variable (None: unset)
    now: float
    midnight: float  # mktime of its today's 00:00:00
    offsets: tuple[tuple[int, int], ...]  # (epoch second, its tm_gmtoff then)


def _request(body) -> tuple[list[str], dict[str, str], Clock]:
    argv, env = client_args(body, ENV_NAMES, "sacct")
    now, midnight = expect(body, "now", float), expect(body, "midnight", (int, float))
    if now is None or midnight is None:
        raise RequestError("missing field 'now' or 'midnight' (the client's clock)")
    offsets = expect(body, "offsets", list, default=[])
    if not 0 < len(offsets) <= MAX_OFFSETS or not all(
            isinstance(p, list) and len(p) == 2 and all(type(v) is int and abs(v) < MAX_TIME for v in p)
            for p in offsets):
        raise RequestError(f"field 'offsets' must be 1 to {MAX_OFFSETS} [epoch second, UTC offset] pairs")
    if not (0 <= now < MAX_TIME and abs(midnight) < MAX_TIME):  # NaN too; datetime ends at year 9999
        raise RequestError("field 'now' or 'midnight' is not a time")
    return argv, env, Clock(env.get("TZ"), now, float(midnight), tuple(map(tuple, offsets)))


def _same_zone(clock: Clock) -> None:
    """The client's local time is this process's, or Fallback: its TZ variable names the same
    zone, its UTC offsets are ours at the instants it sent, and its midnight is the one the Python
    sacct would compute (the client's mktime against Python's datetime, in our zone)."""
    if clock.tz != os.environ.get("TZ"):
        raise Fallback("another TZ")
    if any(time.localtime(t).tm_gmtoff != offset for t, offset in clock.offsets):
        raise Fallback("another time zone")
    if parse_datetime("midnight", clock.now) != clock.midnight:
        raise Fallback("another midnight")


def _query(argv: list[str], env: dict[str, str], clock: Clock, caller: Caller) -> sacct.Query:
    kw = parse_simple(sacct.OPTIONS, argv)
    if kw is None:
        raise Fallback("an option form for click")
    if kw["helpformat"] or kw["clusters"]:
        raise Fallback("-e or -M")

    def me() -> str:
        if (name := client_user(env, caller)) is None:
            raise Fallback("no user name")
        return name
    for name in ("helpformat", "clusters", "duplicates"):
        del kw[name]
    try:
        return sacct.query(env, me, caller.uid == 0, clock.now, **kw)
    except sacct.SacctError as exc:
        raise Fallback(str(exc)) from None


async def _reply(ctx: ApiContext, q: sacct.Query, caller: Caller) -> dict:
    """The acct listing as the Python sacct gets it (call_pages): pages joined, made printable;
    never changed here (its rows may be the listing cache's)."""
    merged, after = None, None
    for _page in range(MAX_PAGES):
        try:
            reply = await api_jobs.acct(ctx, q.body if after is None else {**q.body, "after": after}, caller)
        except RequestError as exc:  # the Python sacct prints the same refusal
            raise Fallback(str(exc)) from None
        if merged is None:
            merged = {**reply, **{k: list(reply[k]) for k in KEYS}}
        else:
            for k in KEYS:
                merged[k].extend(reply[k])
        if not reply.get("more"):
            return shown_listing(merged, KEYS)
        after = reply["next"]
    raise Fallback(f"more than {MAX_PAGES} pages")


def _text(q: sacct.Query, reply: dict) -> tuple[str, bool]:
    """The text, and whether it moves with the clock: a shown row of a run not ended, with an
    elapsed-time field, or (a window that starts later than now) one not yet in the window."""
    rows = sacct.shown_rows(q, reply)
    text = sacct.text_of(q, rows)
    if len(text) > MAX_TEXT_BYTES // 4 and len(text.encode()) > MAX_TEXT_BYTES:
        raise Fallback("text too long for one reply")
    live = {key for key, _f in q.fields} & ELAPSED and any(r.get("start_time") and not r.get("end_time") for r in rows)
    later = q.start is not None and q.start > reply["now"]
    return text, bool(live or later)


@dataclass
class _Kept:
    """A rendered text in the listing cache, made again once CLOCK_REUSE old when `clock`."""
    text: str
    clock: bool
    at: float  # time.monotonic() of the render


async def sacct_text(ctx: ApiContext, body, caller: Caller):
    """{"text": what sacct prints} for {"argv": sacct's arguments, "env": the variables of
    ENV_NAMES the client has, "now", "midnight", "offsets": its clock and zone}, or
    {"fallback": why} when the Python sacct must print it."""
    argv, env, clock = _request(body)
    try:
        _same_zone(clock)
        q = _query(argv, env, clock, caller)

        async def read():
            text, moves = _text(q, await _reply(ctx, q, caller))
            # a KiB of text weighs a row in the cache's bound, as squeue_text's texts do
            return _Kept(text, moves, time.monotonic()), max(1, len(text) // 1024)
        # the text is a function of these alone: whose jobs is in the body (its "users")
        key = ("sacct_text", api_jobs._frozen(q.body), tuple(q.fields), q.start, q.end, q.with_steps,
               tuple(sorted(q.steps_named)), tuple(sorted(q.states or ())) if q.states is not None else None,
               tuple(sorted(q.names)), tuple(sorted(q.partitions)), q.header, q.parsable)
        kept = await ctx.listings.get(key, read)
        if kept.clock and time.monotonic() - kept.at >= CLOCK_REUSE:
            kept.text, kept.clock = _text(q, await _reply(ctx, q, caller))  # the listing is kept: only the text
            kept.at = time.monotonic()
        return {"text": kept.text}
    except Fallback as exc:
        return {"fallback": str(exc)}
