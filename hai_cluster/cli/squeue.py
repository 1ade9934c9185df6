"""squeue, as Slurm prints it: hqueue's listing with squeue's options, default columns, formats
(`-o "%.18i|%T"`, `-O jobid:10,state`, SQUEUE_FORMAT, SQUEUE_FORMAT2), order and plain text.
Our extras (level, GPU telemetry) are -O names squeue does not have; hqueue keeps its own columns."""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass

from ..core.hostlist import compress
from ..core.jobids import ArrayError, collapse_pending, job_label
from ..core.timefmt import format_duration
from .common import call_pages, check_cluster, fail, iso_time, split_list
from .fastargs import Option, command_of, run_main
from .jobfields import FIELDS as OURS, SLURM_STATE, elapsed, nodelist, nodelist_reason
from .listfilters import filter_body, filters
from .slurmfmt import Column, FormatError, parse_letters, parse_names, render

PROG = "squeue"
DEFAULT_FORMAT = "%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R"
LONG_FORMAT = "%.18i %.9P %.8j %.8u %.8T %.10M %.9l %.6D %R"
START_FORMAT = "%.18i %.9P %.8j %.8u %.2t %.19S %.6D %20Y %R"
STEP_FORMAT = "%.15i %.8j %.9P %.8u %.9M %N"


def _time_left(j: dict, now: float) -> str:
    limit = j.get("time_limit")
    if limit is None:
        return "UNLIMITED"
    return format_duration(max(0, limit - elapsed(j, now)))


def _array_task(j: dict) -> str:
    label = j.get("label") or ""
    if "_[" in label:
        return label.split("_[", 1)[1].rstrip("]")
    return "N/A" if j.get("array_task_id") is None else str(j["array_task_id"])


def _ours(letter: str):
    return OURS[letter][1]


SLURM_CODE = {"PR": "R"}  # SLURM_STATE's codes


def slurm_states(wanted: list[str] | None) -> list[str] | None:
    """squeue -t: RUNNING (R) takes in the runs being preempted too."""
    if wanted and any(w.upper() in ("R", "RUNNING") for w in wanted):
        return [*wanted, "PREEMPTING"]
    return wanted


# squeue's letter -> (header, getter(job, now), the job keys it reads). Letters Slurm has and we have
# no data for print what Slurm prints for a job without it.
LETTERS = {
    "i": ("JOBID", _ours("i"), ("id", "array_job_id", "array_task_id")),
    "A": ("JOBID", lambda j, now: str(j["id"]), ("id",)),
    "F": ("ARRAY_JOB_ID", lambda j, now: str(j.get("array_job_id") or j["id"]), ("id", "array_job_id")),
    "K": ("ARRAY_TASK_ID", lambda j, now: _array_task(j), ("array_task_id",)),
    "P": ("PARTITION", _ours("P"), ("partition",)),
    "j": ("NAME", _ours("j"), ("name",)),
    "u": ("USER", _ours("u"), ("user",)),
    "U": ("UID", lambda j, now: str(j["uid"]), ("uid",)),
    "G": ("GROUP", lambda j, now: str(j["gid"]), ("gid",)),
    "a": ("ACCOUNT", _ours("a"), ("account",)),
    "t": ("ST", lambda j, now: SLURM_CODE.get(j["code"], j["code"]), ("code",)),
    "T": ("STATE", lambda j, now: SLURM_STATE.get(j["state"], j["state"]), ("state",)),
    "M": ("TIME", _ours("M"), ("start_time", "end_time")),
    "l": ("TIME_LIMIT", _ours("l"), ("time_limit",)),
    "L": ("TIME_LEFT", _time_left, ("time_limit", "start_time", "end_time")),
    "D": ("NODES", _ours("D"), ("nodes",)),
    "C": ("CPUS", _ours("C"), ("cpus_per_task", "tasks_per_node", "nodes", "overcommit")),
    "c": ("MIN_CPUS", lambda j, now: str(j["cpus_per_task"] * (1 if j.get("overcommit") else j.get("tasks_per_node", 1))),
          ("cpus_per_task", "tasks_per_node", "overcommit")),
    "m": ("MIN_MEMORY", lambda j, now: f"{j['mem_mb']}M" if j.get("mem_mb") else "0", ("mem_mb",)),
    "b": ("TRES_PER_NODE", lambda j, now: "N/A" if (g := _ours("b")(j, now)) == "(null)" else f"gres:{g}",
          ("gpus_per_node", "gpu_fraction", "gpu_mem_mb", "gpu_compute", "gpu_qos", "gpu_share_mb")),
    "R": ("NODELIST(REASON)", lambda j, now: nodelist_reason(j), ("state", "nodelist", "reason")),
    "N": ("NODELIST", lambda j, now: nodelist(j), ("nodelist",)),
    "B": ("EXEC_HOST", lambda j, now: (j.get("nodelist") or "").split(",")[0] or "n/a", ("nodelist",)),
    "r": ("REASON", _ours("r"), ("reason",)),
    "S": ("START_TIME", lambda j, now: iso_time(j.get("start_time"), "N/A"), ("start_time",)),
    "V": ("SUBMIT_TIME", lambda j, now: iso_time(j.get("submit_time"), "N/A"), ("submit_time",)),
    "e": ("END_TIME", lambda j, now: iso_time(j.get("end_time"), "N/A"), ("end_time",)),
    "E": ("DEPENDENCY", lambda j, now: j.get("dependency") or "(null)", ("dependency",)),
    # sprio's PRIORITY (its place in the policy's order; "sprio_priority", asked for only when shown):
    # %Q the number, %p it over 2^32-1 as squeue's "%16.14f"
    "p": ("PRIORITY", lambda j, now: f"{j['sprio_priority'] / 0xFFFFFFFF:16.14f}", ()),
    "Q": ("PRIORITY", lambda j, now: str(j["sprio_priority"]), ()),
    "y": ("NICE", lambda j, now: str(j.get("nice") or 0), ("nice",)),
    "Y": ("SCHEDNODES", lambda j, now: "(null)", ()),
    "q": ("QOS", lambda j, now: j.get("qos") or "normal", ("qos",)),
    "k": ("COMMENT", lambda j, now: "(null)", ()),
    "w": ("WCKEY", lambda j, now: "(null)", ()),
    "v": ("RESERVATION", lambda j, now: j.get("reservation") or "(null)", ("reservation",)),
    "f": ("FEATURES", lambda j, now: j.get("constraint") or "(null)", ("constraint",)),
    "W": ("LICENSES", lambda j, now: "(null)", ()),
    "n": ("REQ_NODES", lambda j, now: compress((j.get("required_nodes") or "").split(",")) if j.get("required_nodes")
          else "", ("required_nodes",)),
    "x": ("EXC_NODES", lambda j, now: compress((j.get("excluded_nodes") or "").split(",")) if j.get("excluded_nodes")
          else "", ("excluded_nodes",)),
    "h": ("OVER_SUBSCRIBE", lambda j, now: "NO" if j.get("exclusive") else "OK", ("exclusive",)),
    "O": ("CONTIGUOUS", lambda j, now: "0", ()),
    "d": ("MIN_TMP_DISK", lambda j, now: "0", ()),
    "H": ("SOCKETS_PER_NODE", lambda j, now: "*", ()),
    "I": ("CORES_PER_SOCKET", lambda j, now: "*", ()),
    "J": ("THREADS_PER_CORE", lambda j, now: "*", ()),
    "z": ("S:C:T", lambda j, now: "*:*:*", ()),
    "X": ("CORE_SPEC", lambda j, now: "N/A", ()),
}
# squeue -O names -> a letter above, or one of ours (hqueue's letters, under names squeue lacks)
NAMES = {
    "jobid": "i", "jobarrayid": "i", "arrayjobid": "F", "arraytaskid": "K", "partition": "P", "name": "j",
    "username": "u", "userid": "U", "groupid": "G", "account": "a", "statecompact": "t", "state": "T",
    "timeused": "M", "timelimit": "l", "timeleft": "L", "numnodes": "D", "numcpus": "C", "mincpus": "c",
    "minmemory": "m", "tres-per-node": "b", "reasonlist": "R", "nodelist": "N", "batchhost": "B",
    "reason": "r", "starttime": "S", "submittime": "V", "endtime": "e", "dependency": "E",
    "priority": "p", "prioritylong": "Q", "nice": "y", "schednodes": "Y", "qos": "q", "comment": "k",
    "wckey": "w", "reservation": "v", "feature": "f", "licenses": "W", "reqnodes": "n", "excnodes": "x",
    "oversubscribe": "h", "contiguous": "O", "mintmpdisk": "d",
    "restartcnt": "=q", "preemptible": "=Y", "level": "=L", "gpuutil": "=g", "gpumem": "=G", "idle": "=I",
}
_OURS_HEADERS = {"q": "RESTARTCNT"}


def field_of(key: str) -> tuple[str, object, tuple[str, ...]]:
    """(header, getter, keys) of a letter, or of one of ours ('=L')."""
    if key.startswith("="):
        from .jobfields import NEEDS
        letter = key[1:]
        return _OURS_HEADERS.get(letter, OURS[letter][0]), OURS[letter][1], NEEDS[letter]
    return LETTERS[key]


# Slurm's job states in its enum's order: squeue's default sort is partition, state, priority.
_STATE_ORDER = {"PENDING": 0, "RUNNING": 1, "PREEMPTING": 1, "COMPLETING": 1, "COMPLETED": 3, "CANCELLED": 4,
                "FAILED": 5, "TIMEOUT": 6, "NODE_FAIL": 7, "PREEMPTED": 8, "OUT_OF_MEMORY": 11}


def columns_from(fmt: str | None, fmt_long: str | None, long_: bool, start: bool, env=os.environ) -> list[Column]:
    """The columns the options ask for: -o, -O, -l, --start, else SQUEUE_FORMAT(2), else squeue's."""
    if fmt is not None and long_:
        raise FormatError("Options -o(--format) and -l(--long) are mutually exclusive. Please remove one and retry.")
    if fmt_long is not None:
        return [Column(NAMES[c.field], c.width, c.right, c.prefix, c.suffix) for c in parse_names(fmt_long, NAMES)]
    if fmt is None and not long_ and not start:
        if env.get("SQUEUE_FORMAT"):
            fmt = env["SQUEUE_FORMAT"]
        elif env.get("SQUEUE_FORMAT2"):
            return columns_from(None, env["SQUEUE_FORMAT2"], False, False, env)
    return parse_letters(fmt or (START_FORMAT if start else LONG_FORMAT if long_ else DEFAULT_FORMAT), LETTERS)


# squeue's options, for click (--help, errors, the rare forms) and for the fast parse of the
# common ones (fastargs.py): the same table, so they cannot disagree.
OPTIONS = (
    Option(("-a", "--all"), "all_", "flag", "every partition (the default here)"),
    Option(("-A", "--account"), "accounts", "multiple", "only these accounts"),
    Option(("-u", "--user"), "users", "multiple", "only these users' jobs"),
    Option(("--me",), "me", "flag", "only my jobs"),
    Option(("-j", "--jobs"), "job_ids", "multiple", "only these jobs"),
    Option(("-t", "--states"), "states", "multiple", "these states (names, codes or all)"),
    Option(("-p", "--partition"), "partitions", "multiple", "only these partitions"),
    Option(("-n", "--name"), "names", "multiple", "only jobs with these names"),
    Option(("-w", "--nodelist"), "on_nodes", "multiple", "only jobs on these nodes"),
    Option(("-l", "--long"), "long_", "flag", "more columns, and the time"),
    Option(("-h", "--noheader"), "noheader", "flag", "no header line"),
    Option(("-o", "--format"), "fmt", "value", "fields: %[.][size]letter, e.g. '%.18i|%T'"),
    Option(("-O", "--Format"), "fmt_long", "value", "fields by name: name[:[.][size]],..., e.g. jobid:10,state"),
    Option(("-r", "--array"), "expand", "flag", "one line per array task"),
    Option(("-s", "--steps"), "step_list", "optional", "job steps"),
    Option(("--start",), "start", "flag", "pending jobs and their expected start"),
    Option(("-M", "--clusters"), "clusters", "value", "only the local cluster"),
    Option(("-v", "--verbose"), "verbose", "count", None),
)


def main(argv: list[str] | None = None) -> int:
    """The command (bin/): the common option forms parsed here, the rest (and --help) by click."""
    return run_main(squeue, OPTIONS, argv, lambda: __getattr__("command"))


def __getattr__(name: str):
    if name == "command":  # the click command, built on first use (click costs ~20 ms to import)
        global command
        command = command_of(squeue, OPTIONS)
        return command
    raise AttributeError(name)


class SqueueError(Exception):
    """An option squeue refuses (the message fail() prints): raised by query() so that the
    controller's text render (controller/api_listing_text.py) can use it without exiting."""


@dataclass(frozen=True)
class Query:
    """What a listing asks for, from squeue's options and environment: the `jobs` request (no
    page) and how its rows become lines. Built by query(), rendered by lines(), both here and
    in the controller (the compiled squeue's text), so the two print the same bytes."""
    body: dict
    columns: tuple[Column, ...]
    accounts: frozenset[str]
    nodes: frozenset[str]
    expand: bool
    noheader: bool
    long_: bool

    @property
    def fields(self) -> list[tuple[str, object, tuple[str, ...]]]:
        return [field_of(c.field) for c in self.columns]

    @property
    def priorities(self) -> bool:
        return any(c.field in ("p", "Q") for c in self.columns)


ENV = ("SQUEUE_FORMAT", "SQUEUE_FORMAT2", "SQUEUE_USERS", "SQUEUE_STATES", "SQUEUE_PARTITION", "SQUEUE_NAMES")


def query(env, me_user, *, users, me, job_ids, states, partitions, names, accounts, on_nodes, long_, noheader, fmt,
          fmt_long, expand, start) -> Query:
    """The listing the options ask for; `env` the SQUEUE_* variables (ENV), `me_user()` the
    name --me means. SqueueError for what squeue refuses."""
    users = users or split_list([env["SQUEUE_USERS"]] if env.get("SQUEUE_USERS") else None)
    states = states or split_list([env["SQUEUE_STATES"]] if env.get("SQUEUE_STATES") else None)
    partitions = partitions or split_list([env["SQUEUE_PARTITION"]] if env.get("SQUEUE_PARTITION") else None)
    names = names or split_list([env["SQUEUE_NAMES"]] if env.get("SQUEUE_NAMES") else None)
    try:
        body, listing_all = filter_body(users, me_user() if me else None, job_ids, slurm_states(split_list(states)))
    except ArrayError as exc:
        raise SqueueError(str(exc)) from None
    if partitions:
        body["partitions"] = split_list(partitions)
    if start:
        body["states"] = ["PENDING"]
    elif job_ids and not listing_all:
        body["all"] = True
    if names:
        body["names"] = split_list(names)
    try:
        columns = columns_from(fmt, fmt_long, long_, start, env)
    except FormatError as exc:
        raise SqueueError(str(exc)) from None
    keys = {k for _h, _g, ks in map(field_of, (c.field for c in columns)) for k in ks}
    body["fields"] = sorted(keys | {"id", "state", "reason", "array_job_id", "array_task_id", "partition",
                                    "account", "nodelist", "code"})
    return Query(body, tuple(columns), frozenset(split_list(accounts) or ()), frozenset(split_list(on_nodes) or ()),
                 bool(expand), bool(noheader), bool(long_))


def lines(q: Query, jobs: list[dict], now: float) -> list[str]:
    """The listing's lines from its rows (made printable: shown_listing), as squeue prints them;
    `jobs` is not changed (the controller's are its listing cache's)."""
    fields = q.fields
    if q.accounts:
        jobs = [j for j in jobs if (j.get("account") or "default") in q.accounts]
    if q.nodes:
        jobs = [j for j in jobs if q.nodes & set((j.get("nodelist") or "").split(","))]
    listed = [(j, None) for j in jobs] if q.expand else collapse_pending(jobs)
    listed.sort(key=lambda jl: (jl[0]["partition"], _STATE_ORDER.get(jl[0]["state"], 9), jl[0]["id"]))
    rows = [[getter(job if label is None else {**job, "label": label}, now) for _h, getter, _k in fields]
            for job, label in listed]
    out = render(list(q.columns), [h for h, _g, _k in fields], rows, header=not q.noheader)
    if q.long_:
        out.insert(0, time.strftime("%a %b %d %H:%M:%S %Y", time.localtime(now)))
    return out


def text_of(out: list[str]) -> str:
    """What squeue writes of its lines: each ended by a newline, nothing for none."""
    return "\n".join(out) + "\n" if out else ""


def squeue(all_, accounts, users, me, job_ids, states, partitions, names, on_nodes, long_, noheader, fmt, fmt_long,
           expand, step_list, start, clusters, verbose):
    """View the job queue, as Slurm's squeue prints it."""
    check_cluster(PROG, clusters)
    if step_list is not None:
        states = states or split_list([os.environ["SQUEUE_STATES"]] if os.environ.get("SQUEUE_STATES") else None)
        users = users or split_list([os.environ["SQUEUE_USERS"]] if os.environ.get("SQUEUE_USERS") else None)
        partitions = partitions or split_list([os.environ["SQUEUE_PARTITION"]] if os.environ.get("SQUEUE_PARTITION")
                                              else None)
        body, _all = filters(PROG, users, me, job_ids, slurm_states(split_list(states)))
        if partitions:
            body["partitions"] = split_list(partitions)
        return show_steps(body, step_list, fmt, noheader)
    try:
        q = query(os.environ, _my_name, users=users, me=me, job_ids=job_ids, states=states, partitions=partitions,
                  names=names, accounts=accounts, on_nodes=on_nodes, long_=long_, noheader=noheader, fmt=fmt,
                  fmt_long=fmt_long, expand=expand, start=start)
    except SqueueError as exc:
        fail(PROG, str(exc))
    reply = call_pages(PROG, "jobs", q.body)
    jobs = with_priorities(reply["jobs"]) if q.priorities else reply["jobs"]
    sys.stdout.write(text_of(lines(q, jobs, reply["now"])))


def _my_name() -> str:
    import getpass
    return getpass.getuser()


def with_priorities(jobs: list[dict]) -> list[dict]:
    """The jobs with sprio's PRIORITY (api_priority.py): pending jobs have their place in the
    policy's order, counted from the end; the others 0 (a held job's, as Slurm's; a job no longer
    pending has no place in the order)."""
    order = {r["job_id"]: r["priority"] for r in call_pages(PROG, "priorities", {})["jobs"]}
    return [{**j, "sprio_priority": order.get(j["id"], 0)} for j in jobs]


def show_steps(body: dict, step_list: str, fmt: str | None, noheader: bool) -> None:
    """squeue -s: the running jobs' steps, as squeue -s prints them."""
    import click

    from ..core.jobids import ArrayError, parse_job_refs, refs_to_wire
    from .hqueue import STEP_FIELDS, parse_steps, step_rows
    try:
        columns = parse_letters(fmt or STEP_FORMAT, STEP_FIELDS)
        wanted = parse_steps(step_list)
        if wanted and "ids" not in body and "tasks" not in body:
            body.update(refs_to_wire(parse_job_refs([",".join(sorted({j for j, _s in wanted}))])))
    except FormatError as exc:
        fail(PROG, str(exc).replace("job format", "job step format"))
    except click.BadParameter as exc:
        fail(PROG, str(exc.message))
    except ArrayError as exc:
        fail(PROG, str(exc))
    reply = call_pages(PROG, "steps", body, keys=("jobs", "steps"))
    rows = step_rows(reply)
    if wanted:
        rows = [r for r in rows if (job_label(r), str(r["step"])) in wanted]
    now = reply["now"]
    lines = render(columns, [STEP_FIELDS[c.field][0] for c in columns],
                   [[STEP_FIELDS[c.field][1](r, now) for c in columns] for r in rows], header=not noheader)
    if lines:
        sys.stdout.write("\n".join(lines) + "\n")

