"""squeue's text, rendered here for the compiled squeue (hai_cluster/native/squeue.c): a Python
process costs ~20 ms to start and import before it reads a job, which is most of a listing of
1,000 jobs (docs/BENCHMARKS.md). The client sends its argv and the environment variables squeue
reads; the text is made by the Python squeue's own code (cli/squeue.py: query() and lines()) over
the rows the `jobs` request gives this caller, so it is the Python squeue's, byte for byte.

Whatever this does not render the same way is answered {"fallback": why}, and the client then
runs the Python squeue with the same argv and environment: options the fast parse leaves to click
(--help, errors, rare forms), -l/--start/-s/-M (local time, other requests), %S/%V/%e (the
client's time zone), %p/%Q (sprio's order), a bad -j or format, a refused listing, and listings
of more than MAX_PAGES pages or MAX_TEXT_BYTES of text (the Python squeue pages them).

The text is kept with the listing cache until the store's next write; one that depends on the
clock (%M or %L of a job that has started and not ended, our level and GPU telemetry) is made
again from the kept rows once it is CLOCK_REUSE old: it shows what squeue would have printed at
most that long before."""
from __future__ import annotations

import pwd
import re
import time
from dataclasses import dataclass

from ..cli import squeue
from ..cli.common import shown_listing
from ..cli.fastargs import parse_simple
from ..core.jobids import _RANGE  # -j's N-M:S, as parse_indices reads it
from ..transport.rpc import RequestError
from . import api_jobs
from .access import Caller
from .apicontext import ApiContext
from .requests import MAX_LIST, expect, str_list

MAX_ARGV = 1024  # entries
MAX_ARGV_CHARS = 128 * 1024  # in all (a -j list of thousands of ids fits)
MAX_ENV_VALUE = 4096
USER_ENV = ("LOGNAME", "USER", "LNAME", "USERNAME")  # getpass.getuser()'s order
ENV_NAMES = frozenset(squeue.ENV) | frozenset(USER_ENV)
MAX_PAGES = 2  # of the jobs listing (PAGE_ROWS each): more is the Python squeue's, which pages
MAX_TEXT_BYTES = 8 * 1024 * 1024  # half a frame (framing.MAX_FRAME_BYTES)

LOCAL_TIME = frozenset("SVe")  # time.localtime: the client's TZ, not ours
PRIORITY = frozenset("pQ")  # a second request (sprio's order, api_priority.py)
ELAPSED = frozenset("ML")  # the clock, for a job that started and has not ended
LIVE = frozenset({"=L", "=g", "=G", "=I"})  # the level and GPU telemetry
# A text that depends on the clock is made again once it is this old (seconds): squeue's times are
# whole seconds, and a tool polling the default columns with jobs running would otherwise have the
# controller render every call (tens of ms at 10,000 jobs, on its event loop)
CLOCK_REUSE = 1.0


class Fallback(Exception):
    """This listing is the Python squeue's to print (the reason is for the client's debugging)."""


def client_args(body, env_names: frozenset[str], program: str) -> tuple[list[str], dict[str, str]]:
    """The arguments and environment variables a compiled client sent (bounded; only variables
    that the Python `program` reads)."""
    argv = str_list(body, "argv")
    if argv is None:
        raise RequestError("missing field 'argv'")
    if len(argv) > MAX_ARGV or sum(map(len, argv)) > MAX_ARGV_CHARS:
        raise RequestError(f"field 'argv' is too long (at most {MAX_ARGV} entries, {MAX_ARGV_CHARS} characters)")
    env = expect(body, "env", dict, default={})
    for name, value in env.items():
        if name not in env_names:
            raise RequestError(f"field 'env' names a variable {program} does not read: {name!r:.60}")
        if not isinstance(value, str) or len(value) > MAX_ENV_VALUE:
            raise RequestError(f"field 'env': {name} must be a string of at most {MAX_ENV_VALUE} characters")
    return argv, env


def client_user(env: dict[str, str], caller: Caller) -> str | None:
    """getpass.getuser() of the client: its variables, else its uid's name (None: it has none)."""
    for name in USER_ENV:
        if env.get(name):
            return env[name]
    try:
        return pwd.getpwuid(caller.uid).pw_name
    except KeyError:
        return None


def _tasks_named(job_ids) -> int:
    """At most how many array tasks -j's ranges name, counted before they are expanded: the
    Python squeue builds every index of `1_[0-9999999]` in its own process; here it would be
    the controller's memory and time, and the jobs request takes MAX_LIST at most anyway."""
    count = 0
    for text in job_ids:
        for inside in re.findall(r"\[([^\]]*)\]", text):
            for item in inside.split(","):
                m = _RANGE.fullmatch(item)
                if m is None or max(map(len, filter(None, m.groups()))) > 20:
                    continue  # not a range, or past any id: the parse refuses it
                lo, hi, step = int(m[1]), int(m[2] or m[1]), int(m[3] or 1)
                count += max(0, hi - lo) // max(step, 1) + 1
    return count


def _query(argv: list[str], env: dict[str, str], caller: Caller) -> squeue.Query:
    kw = parse_simple(squeue.OPTIONS, argv)
    if kw is None:
        raise Fallback("an option form for click")
    if _tasks_named(kw["job_ids"]) > MAX_LIST:
        raise Fallback("too many array tasks in -j")
    for name in ("long_", "start", "clusters"):
        if kw[name]:
            raise Fallback(f"--{name.rstrip('_')}")
    if kw["step_list"] is not None:
        raise Fallback("--steps")

    def me() -> str:
        if (name := client_user(env, caller)) is None:
            raise Fallback("no user name for --me")
        return name
    try:
        q = squeue.query(env, me, users=kw["users"], me=kw["me"], job_ids=kw["job_ids"], states=kw["states"],
                         partitions=kw["partitions"], names=kw["names"], accounts=kw["accounts"],
                         on_nodes=kw["on_nodes"], long_=False, noheader=kw["noheader"], fmt=kw["fmt"],
                         fmt_long=kw["fmt_long"], expand=kw["expand"], start=False)
    except squeue.SqueueError as exc:
        raise Fallback(str(exc)) from None
    fields = {c.field for c in q.columns}
    if fields & (LOCAL_TIME | PRIORITY):
        raise Fallback("a local time or priority field")
    return q


async def _rows(ctx: ApiContext, q: squeue.Query, caller: Caller) -> tuple[list[dict], float]:
    """The listing's rows as the Python squeue gets them (call_pages), made printable; never
    changed here (they may be the listing cache's)."""
    rows: list[dict] = []
    after, now = None, None
    for _page in range(MAX_PAGES):
        try:
            reply = await api_jobs.jobs(ctx, q.body if after is None else {**q.body, "after": after}, caller)
        except RequestError as exc:  # the Python squeue prints the same refusal
            raise Fallback(str(exc)) from None
        now = reply["now"] if now is None else now
        rows.extend(reply["jobs"])
        if not reply.get("more"):
            return shown_listing({"jobs": rows}, ("jobs",))["jobs"], now
        after = reply["next"]
    raise Fallback(f"more than {MAX_PAGES} pages")


def _text(q: squeue.Query, rows: list[dict], now: float) -> str:
    text = squeue.text_of(squeue.lines(q, rows, now))
    if len(text) > MAX_TEXT_BYTES // 4 and len(text.encode()) > MAX_TEXT_BYTES:
        raise Fallback("text too long for one reply")
    return text


def _clock_dependent(q: squeue.Query, rows: list[dict]) -> bool:
    fields = {c.field for c in q.columns}
    if fields & LIVE:
        return True
    return bool(fields & ELAPSED) and any(j.get("start_time") and not j.get("end_time") for j in rows)


@dataclass
class _Kept:
    """A rendered text in the listing cache: `clock` when it depends on the clock, then rendered
    again (from the kept rows) once it is CLOCK_REUSE old."""
    text: str
    clock: bool
    at: float  # time.monotonic() of the render


async def squeue_text(ctx: ApiContext, body, caller: Caller):
    """{"text": what squeue prints} for {"argv": squeue's arguments, "env": the variables of
    ENV_NAMES the client has}, or {"fallback": why} when the Python squeue must print it."""
    argv, env = client_args(body, ENV_NAMES, "squeue")
    try:
        q = _query(argv, env, caller)

        async def read():
            rows, now = await _rows(ctx, q, caller)
            text = _text(q, rows, now)
            # Its weight in the cache's bound (MAX_ROWS "rows"): a KiB of text for a row, about what
            # a kept row's dict takes. Counted as rows, the texts of two squeue forms at 10,000 jobs
            # pushed the bench's listings past the bound, and they evicted each other every call.
            return _Kept(text, _clock_dependent(q, rows), time.monotonic()), max(1, len(text) // 1024)
        key = ("squeue_text", api_jobs._frozen(q.body), q.columns, tuple(sorted(q.accounts)), tuple(sorted(q.nodes)),
               q.expand, q.noheader)
        kept = await ctx.listings.get(key, read)
        if kept.clock and time.monotonic() - kept.at >= CLOCK_REUSE:
            rows, now = await _rows(ctx, q, caller)  # the rows are kept: only the text is made again
            kept.text, kept.at = _text(q, rows, now), time.monotonic()
        return {"text": kept.text}
    except Fallback as exc:
        return {"fallback": str(exc)}
