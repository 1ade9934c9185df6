"""squeue, as Slurm prints it: hqueue's listing with squeue's options, default columns, formats
(`-o "%.18i|%T"`, `-O jobid:10,state`, SQUEUE_FORMAT, SQUEUE_FORMAT2), order and plain text.
Our extras (level, GPU telemetry) are -O names squeue does not have; hqueue keeps its own columns."""
from __future__ import annotations

import os
import sys
import time

import click

from ..core.hostlist import compress
from ..core.jobids import collapse_pending, job_label
from ..core.timefmt import format_duration
from .common import call_pages, check_cluster, fail, iso_time, split_list
from .hqueue import STEP_FIELDS, filters, step_rows, parse_steps
from .jobfields import FIELDS as OURS, elapsed, nodelist, nodelist_reason
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


# Our states Slurm does not have, as Slurm would show that moment: a run being preempted still runs
# (its grace period), as a Slurm job does until its GraceTime ends
SLURM_STATE = {"PREEMPTING": "RUNNING"}
SLURM_CODE = {"PR": "R"}


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
    "C": ("CPUS", _ours("C"), ("cpus_per_task", "tasks_per_node", "nodes")),
    "c": ("MIN_CPUS", lambda j, now: str(j["cpus_per_task"] * j.get("tasks_per_node", 1)),
          ("cpus_per_task", "tasks_per_node")),
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
    "p": ("PRIORITY", _ours("p"), ("priority",)),
    "Q": ("PRIORITY", _ours("Q"), ("priority",)),
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


def columns_from(fmt: str | None, fmt_long: str | None, long_: bool, start: bool) -> list[Column]:
    """The columns the options ask for: -o, -O, -l, --start, else SQUEUE_FORMAT(2), else squeue's."""
    if fmt is not None and long_:
        fail(PROG, "Options -o(--format) and -l(--long) are mutually exclusive. Please remove one and retry.")
    if fmt_long is not None:
        return [Column(NAMES[c.field], c.width, c.right, c.prefix, c.suffix) for c in parse_names(fmt_long, NAMES)]
    if fmt is None and not long_ and not start:
        if os.environ.get("SQUEUE_FORMAT"):
            fmt = os.environ["SQUEUE_FORMAT"]
        elif os.environ.get("SQUEUE_FORMAT2"):
            return columns_from(None, os.environ["SQUEUE_FORMAT2"], False, False)
    return parse_letters(fmt or (START_FORMAT if start else LONG_FORMAT if long_ else DEFAULT_FORMAT), LETTERS)


@click.command(context_settings={"help_option_names": ["--help"]})
@click.option("-a", "--all", "all_", is_flag=True, help="every partition (the default here)")
@click.option("-A", "--account", "accounts", multiple=True, help="only these accounts")
@click.option("-u", "--user", "users", multiple=True, help="only these users' jobs")
@click.option("--me", is_flag=True, help="only my jobs")
@click.option("-j", "--jobs", "job_ids", multiple=True, help="only these jobs")
@click.option("-t", "--states", "states", multiple=True, help="these states (names, codes or all)")
@click.option("-p", "--partition", "partitions", multiple=True, help="only these partitions")
@click.option("-n", "--name", "names", multiple=True, help="only jobs with these names")
@click.option("-w", "--nodelist", "on_nodes", multiple=True, help="only jobs on these nodes")
@click.option("-l", "--long", "long_", is_flag=True, help="more columns, and the time")
@click.option("-h", "--noheader", is_flag=True, help="no header line")
@click.option("-o", "--format", "fmt", help="fields: %[.][size]letter, e.g. '%.18i|%T'")
@click.option("-O", "--Format", "fmt_long", help="fields by name: name[:[.][size]],..., e.g. jobid:10,state")
@click.option("-r", "--array", "expand", is_flag=True, help="one line per array task")
@click.option("-s", "--steps", "step_list", is_flag=False, flag_value="", default=None, help="job steps")
@click.option("--start", is_flag=True, help="pending jobs and their expected start")
@click.option("-M", "--clusters", help="only the local cluster")
@click.option("-v", "--verbose", count=True, hidden=True)
def main(all_, accounts, users, me, job_ids, states, partitions, names, on_nodes, long_, noheader, fmt, fmt_long,
         expand, step_list, start, clusters, verbose):
    """View the job queue, as Slurm's squeue prints it."""
    check_cluster(PROG, clusters)
    users = users or split_list([os.environ["SQUEUE_USERS"]] if os.environ.get("SQUEUE_USERS") else None)
    states = states or split_list([os.environ["SQUEUE_STATES"]] if os.environ.get("SQUEUE_STATES") else None)
    partitions = partitions or split_list([os.environ["SQUEUE_PARTITION"]] if os.environ.get("SQUEUE_PARTITION") else None)
    names = names or split_list([os.environ["SQUEUE_NAMES"]] if os.environ.get("SQUEUE_NAMES") else None)
    body, listing_all = filters(PROG, users, me, job_ids, slurm_states(split_list(states)))
    if partitions:
        body["partitions"] = split_list(partitions)
    if step_list is not None:
        return show_steps(body, step_list, fmt, noheader)
    if start:
        body["states"] = ["PENDING"]
    elif job_ids and not listing_all:
        body["all"] = True
    if names:
        body["names"] = split_list(names)
    try:
        columns = columns_from(fmt, fmt_long, long_, start)
    except FormatError as exc:
        fail(PROG, str(exc))
    fields = [field_of(c.field) for c in columns]
    keys = {k for _h, _g, ks in fields for k in ks} | {"id", "state", "reason", "array_job_id", "array_task_id",
                                                       "partition", "account", "nodelist", "code"}
    body["fields"] = sorted(keys)
    reply = call_pages(PROG, "jobs", body)
    now = reply["now"]
    jobs = reply["jobs"]
    wanted_accounts = set(split_list(accounts) or ())
    wanted_nodes = set(split_list(on_nodes) or ())
    if wanted_accounts:
        jobs = [j for j in jobs if (j.get("account") or "default") in wanted_accounts]
    if wanted_nodes:
        jobs = [j for j in jobs if wanted_nodes & set((j.get("nodelist") or "").split(","))]
    listed = [(j, None) for j in jobs] if expand else collapse_pending(jobs)
    listed.sort(key=lambda jl: (jl[0]["partition"], _STATE_ORDER.get(jl[0]["state"], 9), jl[0]["id"]))
    rows = [[getter(job if label is None else {**job, "label": label}, now) for _h, getter, _k in fields]
            for job, label in listed]
    lines = render(columns, [h for h, _g, _k in fields], rows, header=not noheader)
    if long_:
        lines.insert(0, time.strftime("%a %b %d %H:%M:%S %Y", time.localtime(now)))
    if lines:
        sys.stdout.write("\n".join(lines) + "\n")


def show_steps(body: dict, step_list: str, fmt: str | None, noheader: bool) -> None:
    """squeue -s: the running jobs' steps, as squeue -s prints them."""
    from ..core.jobids import ArrayError, parse_job_refs, refs_to_wire
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

