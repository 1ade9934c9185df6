"""sacct, as Slurm prints it: hacct's rows (one per run, each followed by its steps) with sacct's
options, field names, widths, `+`-cut values, dashed rule, `-P`/`-p` and SACCT_FORMAT. Fields we
have no data for are empty, as sacct prints a field a job did not record. MaxRSS, AveRSS, AveCPU
and TotalCPU come from the run's cgroups (its CPU time and memory peaks, as the kernel charged
them, exited processes included) and are on the job's line: a step has no cgroup of its own."""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass

from ..core.jobids import ArrayError, parse_job_refs, refs_to_wire
from ..core.states import parse_state
from ..core.timefmt import parse_datetime, slurm_cpu_time, slurm_duration
from .acctrows import ACCT_JOB_KEYS, FIELDS as OURS, _charged, _elapsed, _ranks, in_window, rows_for
from .common import call_pages, check_cluster, fail, iso_time, split_list
from .fastargs import Option, command_of, run_main
from .jobfields import SLURM_STATE
from .slurmfmt import Field, sacct_lines, slurm_bytes

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

PROG = "sacct"
DEFAULT_FORMAT = "JobID,JobName,Partition,Account,AllocCPUS,State,ExitCode"
# sacct -l's fields that we have (the rest of Slurm's long list are per-task I/O and VM figures)
LONG_FORMAT = ("JobID,JobIDRaw,JobName,Partition,MaxRSS,AveRSS,AveCPU,NTasks,AllocCPUS,Elapsed,State,ExitCode,"
               "ReqMem,ConsumedEnergy,AllocTRES")


def _job(r: dict) -> dict:
    return r.get("job") or {}


def _mem(mb: int) -> str:
    """MiB as sacct prints ReqMem and a TRES's mem (1024M is 1G)."""
    return slurm_bytes(mb << 20)


def _alloc_tres(r: dict) -> str:
    """Slurm 22.05's, checked against the peer with slurmdbd: a job's line has billing (and the
    GPUs and memory it holds), a step's none of billing and the GPUs, and mem=0 without --mem."""
    if not r.get("start_time") and r.get("step") is None:
        return ""
    job = _job(r)
    nodes = len([n for n in (r.get("nodelist") or "").split(",") if n]) or job.get("nodes", 1)
    mem = (job.get("mem_mb") or 0) * nodes
    if r.get("step") is not None:
        parts = {"cpu": r["cpus"], "mem": _mem(mem) if mem else "0", "node": nodes}
    else:
        parts = {"billing": r["cpus"], "cpu": r["cpus"], "node": nodes}
        if gpus := _charged(r):
            parts["gres/gpu"] = f"{gpus:g}"
        if mem:
            parts["mem"] = _mem(mem)
    return ",".join(f"{k}={v}" for k, v in sorted(parts.items()))


def _state(r: dict) -> str:
    if r.get("step") is not None and r["state"] == "FAILED" and r.get("exit_signal"):
        return "CANCELLED"  # a step a signal ended, as Slurm records it
    return SLURM_STATE.get(r["state"], None) or OURS["state"](r)


def _exit_code(r: dict) -> str:
    """A job Slurm ended itself (scancel, its time limit) shows 0:0 on its own line: the batch
    script's end, by the signal, comes after the job's and is on the batch step's line alone."""
    if r.get("step") is None and r["state"] in ("CANCELLED", "TIMEOUT") and r.get("start_time"):
        return "0:0"
    return OURS["exitcode"](r)


def _derived_exit_code(r: dict) -> str:
    if r.get("step") is not None:
        return ""
    code, sig = r.get("derived_exit") or (0, 0)
    return f"{code}:{sig}"


def _kib(kib: int | None) -> str:
    return slurm_bytes(None if kib is None else kib * 1024)


def _tasks(r: dict) -> str:
    """A step's tasks (sacct shows none on a job's own row)."""
    return "" if r.get("step") is None else str(r.get("ntasks") or "")


# sacct's name (its header, as Slurm spells it) -> (width; negative: left-justified, number?, getter)
FIELDS = {
    "JobID": (-12, False, OURS["jobid"]),
    "JobIDRaw": (-12, False, lambda r: str(r["job_id"]) + ("" if r.get("step") is None else f".{r['step']}")),
    "JobName": (10, False, OURS["jobname"]),
    "Partition": (10, False, OURS["partition"]),
    "Account": (10, False, OURS["account"]),
    "User": (9, False, lambda r: "" if r.get("step") is not None else r["user"]),
    "UID": (6, True, lambda r: "" if r.get("step") is not None else str(_job(r).get("uid", ""))),
    "Group": (9, False, lambda r: ""),
    "AllocCPUS": (10, True, lambda r: str(r["cpus"])),
    "NCPUS": (10, True, lambda r: str(r["cpus"])),
    "AllocNodes": (10, False, lambda r: str(len([n for n in (r.get("nodelist") or "").split(",") if n]))),
    "NNodes": (8, True, lambda r: str(len([n for n in (r.get("nodelist") or "").split(",") if n])
                                      or _job(r).get("nodes", 1))),
    "NTasks": (8, True, _tasks),
    "AllocTRES": (10, False, _alloc_tres),
    "ReqMem": (10, False, lambda r: "" if r.get("step") is not None else
               _mem(_job(r)["mem_mb"]) if _job(r).get("mem_mb") else "0"),
    "State": (10, False, _state),
    "ExitCode": (8, False, _exit_code),
    "DerivedExitCode": (15, False, _derived_exit_code),
    "Elapsed": (10, False, lambda r: slurm_duration(_elapsed(r))),
    "ElapsedRaw": (10, True, lambda r: str(_elapsed(r))),
    "Timelimit": (10, False, lambda r: "" if r.get("step") is not None else
                  ("UNLIMITED" if _job(r).get("time_limit") is None else slurm_duration(_job(r)["time_limit"]))),
    "TimelimitRaw": (10, False, lambda r: "" if r.get("step") is not None else
                     ("UNLIMITED" if _job(r).get("time_limit") is None else str(_job(r)["time_limit"] // 60))),
    "Submit": (19, False, lambda r: iso_time(r["submit_time"])),
    "Eligible": (19, False, lambda r: iso_time(r["submit_time"])),
    "Start": (19, False, lambda r: iso_time(r.get("start_time"))),
    "End": (19, False, lambda r: iso_time(r.get("end_time"))),
    "NodeList": (15, False, OURS["nodelist"]),
    "Reason": (22, False, lambda r: r.get("reason") or "None"),
    "Priority": (10, False, lambda r: _job(r).get("priority", "")),
    "Restarts": (8, True, lambda r: str(r["attempt"])),
    "MaxRSS": (10, False, lambda r: _kib(r.get("max_rss_kb"))),
    "AveRSS": (10, False, lambda r: _kib(r.get("ave_rss_kb"))),
    "AveCPU": (10, False, lambda r: "" if r.get("cpu_seconds") is None
               else slurm_cpu_time(int(r["cpu_seconds"] / _ranks(r)))),
    "TotalCPU": (10, False, lambda r: "" if r.get("cpu_seconds") is None else slurm_cpu_time(r["cpu_seconds"])),
    "ConsumedEnergy": (14, False, OURS["consumedenergy"]),
    "CPUTime": (10, False, lambda r: slurm_duration(_elapsed(r) * r["cpus"])),
    "CPUTimeRAW": (10, True, lambda r: str(_elapsed(r) * r["cpus"])),
    "QOS": (10, False, lambda r: "" if r.get("step") is not None else _job(r).get("qos") or "normal"),
    "Comment": (14, False, lambda r: ""),
    "WCKey": (10, False, lambda r: ""),
    "Reservation": (20, False, lambda r: ""),
    "Constraints": (19, False, lambda r: "" if r.get("step") is not None else _job(r).get("constraint") or ""),
    "Cluster": (10, False, lambda r: r.get("cluster", "")),
    # ours (sacct has none of these)
    "AllocGPUS": (9, True, OURS["allocgpus"]),
    "GPUHours": (8, True, OURS["gpuhours"]),
    "GPUUtil": (7, True, OURS["gpuutil"]),
    "MaxGPUUtil": (10, True, OURS["maxgpuutil"]),
    "MaxGPUMem": (9, True, OURS["maxgpumem"]),
}
_BY_LOWER = {name.lower(): name for name in FIELDS}


class SacctError(Exception):
    """A bad option value: the message sacct prints after "sacct: error: "."""


def parse_fields(text: str) -> list[tuple[str, Field]]:
    """sacct -o 'JobID,State%20,jobn': (our name, the column). Names any case, a unique prefix
    (the first in sacct's list, as sacct takes it); %W sets the width (right-justified)."""
    out = []
    for item in filter(None, text.split(",")):
        name, pct, width = item.strip().partition("%")
        key = _BY_LOWER.get(name.lower()) or next((n for n in FIELDS if n.lower().startswith(name.lower()) and name),
                                                  None)
        if key is None:
            raise SacctError(f'Invalid field requested: "{name}"')
        w, number, _get = FIELDS[key]
        if pct:
            if not width.isdigit():
                raise SacctError(f'Invalid field width in "{item}"')
            w = int(width)
        out.append((key, Field(key, w, number)))
    if not out:
        raise SacctError("no fields requested")
    return out


# sacct's options, for click (--help, errors, the rare forms) and for the fast parse of the common
# ones (fastargs.py): the same table, so they cannot disagree.
OPTIONS = (
    Option(("-a", "--allusers"), "allusers", "flag", "every user's jobs"),
    Option(("-u", "--user", "--uid"), "users", "multiple", "only these users"),
    Option(("--me",), "me", "flag", "only my jobs (the default, except for root)"),
    Option(("-j", "--jobs"), "job_ids", "multiple", "only these jobs (12, 12_4, 12.batch)"),
    Option(("-S", "--starttime"), "starttime", "value", "from this time (default: midnight today, unless -j)"),
    Option(("-E", "--endtime"), "endtime", "value", "until this time (default: now)"),
    Option(("-s", "--state"), "states", "multiple", "only these states (CD,F,CA,R,PD,TO,...)"),
    Option(("--name",), "names", "multiple", "only jobs with these names"),
    Option(("-r", "--partition"), "partitions", "multiple", "only these partitions"),
    Option(("-o", "--format"), "fmt", "value", f"fields, e.g. JobID,State%20 (default {DEFAULT_FORMAT})"),
    Option(("-l", "--long"), "long_", "flag", "more fields"),
    Option(("-X", "--allocations"), "allocations", "flag", "the jobs' allocations, not their steps"),
    Option(("-n", "--noheader"), "noheader", "flag", "no header lines"),
    Option(("-P", "--parsable2"), "parsable2", "flag", "'|' between fields"),
    Option(("-p", "--parsable"), "parsable1", "flag", "'|' after every field"),
    Option(("-e", "--helpformat"), "helpformat", "flag", "list the fields"),
    Option(("-M", "--clusters"), "clusters", "value", "only the local cluster"),
    Option(("-D", "--duplicates"), "duplicates", "flag", "every run of a requeued job (always shown here)"),
)


def main(argv: list[str] | None = None) -> int:
    """The command (bin/): the common option forms parsed here, the rest (and --help) by click."""
    return run_main(sacct, OPTIONS, argv, lambda: __getattr__("command"))


def __getattr__(name: str):
    if name == "command":  # the click command, built on first use (click costs ~20 ms to import)
        global command
        command = command_of(sacct, OPTIONS)
        return command
    raise AttributeError(name)


@dataclass
class Query:
    """What one sacct call asks the controller (`body`, for the acct listing) and how it prints the
    rows: the same for the Python sacct and the controller's sacct_text (api_sacct_text.py)."""
    body: dict
    fields: list[tuple[str, Field]]
    start: float | None
    end: float | None
    with_steps: bool
    steps_named: set[str]
    states: set[str] | None
    names: set[str]
    partitions: set[str]
    header: bool
    parsable: str | None


def query(env: Mapping[str, str], me_name: Callable[[], str], is_root: bool, now: float, *, allusers, users, me,
          job_ids, starttime, endtime, states, names, partitions, fmt, long_, allocations, noheader, parsable2,
          parsable1) -> Query:
    """sacct's options (and SACCT_FORMAT of `env`) as a Query; SacctError for a bad value, in the
    order sacct checks them. me_name: getpass.getuser() of the caller; now: the caller's clock."""
    fields = parse_fields(fmt or (None if long_ else env.get("SACCT_FORMAT"))
                          or (LONG_FORMAT if long_ else DEFAULT_FORMAT))
    body: dict = {}
    steps_named: set[str] = set()
    if job_ids:
        refs = []
        for ref in split_list(job_ids):
            job, dot, step = ref.partition(".")
            refs.append(job)
            if dot:
                steps_named.add(ref)
        try:
            body.update(refs_to_wire(parse_job_refs(refs)))
        except ArrayError as exc:
            raise SacctError(str(exc)) from None
    if me or not (allusers or users or job_ids or is_root):
        body["users"] = [me_name()]
    elif users:
        body["users"] = split_list(users)
    wanted_states = None
    if states:
        try:
            wanted_states = {parse_state(s).value for s in split_list(states)}
        except ValueError as exc:
            raise SacctError(str(exc)) from None
    try:
        start = parse_datetime(starttime, now) if starttime else (None if job_ids else parse_datetime("midnight", now))
        end = parse_datetime(endtime, now) if endtime else None
    except ValueError as exc:
        raise SacctError(str(exc)) from None
    if wanted_states is not None and (starttime or endtime or not job_ids):
        # -s asks which jobs were in those states during the window, which Slurm 22.05 makes
        # now..now without -S, and S..S without -E (checked: `sacct -s F -S 00:00` lists nothing
        # that ended since); -j without -S/-E: the jobs' states as they are
        start = start if starttime else now
        end = end if endtime else start
    if start is not None:
        body["since"] = start
    body["fields"] = list(ACCT_JOB_KEYS)
    return Query(body, fields, start, end, not allocations, steps_named, wanted_states, set(split_list(names) or ()),
                 set(split_list(partitions) or ()), not noheader, "P" if parsable2 else "p" if parsable1 else None)


def shown_rows(q: Query, reply: dict) -> list[dict]:
    """The rows sacct prints, of an acct reply (its pages joined, made printable), in order."""
    jobs = {j["id"]: j for j in reply["jobs"]}
    rows = rows_for(reply, q.with_steps)
    for r in rows:
        r["job"] = jobs.get(r["job_id"], {})
    if q.states is None:
        rows = [r for r in rows if in_window(r, q.start, q.end)]
    else:  # a job (a run) is chosen by its state; its steps come with it, whatever theirs (as Slurm's)
        chosen = {(r["job_id"], r["attempt"]) for r in rows if r.get("step") is None and _in_states(r, q)}
        rows = [r for r in rows if (r["job_id"], r["attempt"]) in chosen]
    return [r for r in rows if (not q.names or r["job"].get("name") in q.names)
            and (not q.partitions or r["job"].get("partition") in q.partitions)
            and (not q.steps_named or r.get("step") is None or FIELDS["JobID"][2](r) in q.steps_named)]


def _in_states(r: dict, q: Query) -> bool:
    """Whether a run (or a job waiting for one) was in one of -s's states during the window, as
    Slurm 22.05 answers (checked with its slurmdbd): R, a run that ran in it (so -s R lists jobs
    that have ended since); PD, a job that waited in it; an end state, a run that ended so in it.
    Without a window (-j without -S/-E), the state it is in."""
    state = SLURM_STATE.get(r["state"], r["state"]).split()[0]
    if q.start is None and q.end is None:
        return state in q.states
    start, end = q.start, q.end
    began, ended = r.get("start_time"), r.get("end_time")
    if "RUNNING" in q.states and began is not None and began <= end and (ended or r["now"]) >= start:
        return True
    if "PENDING" in q.states and r["submit_time"] <= end and (began or ended or r["now"]) >= start:
        return True
    return state in q.states and ended is not None and start <= ended <= end


def text_of(q: Query, rows: list[dict]) -> str:
    """What sacct writes for these rows (shown_rows)."""
    cells = [[str(FIELDS[key][2](r)) for key, _f in q.fields] for r in rows]
    lines = sacct_lines([f for _k, f in q.fields], cells, header=q.header, parsable=q.parsable)
    return "\n".join(lines) + "\n" if lines else ""


def sacct(allusers, users, me, job_ids, starttime, endtime, states, names, partitions, fmt, long_, allocations,
          noheader, parsable2, parsable1, helpformat, clusters, duplicates):
    """Accounting data of jobs and their steps, as Slurm's sacct prints them."""
    if helpformat:
        names_ = list(FIELDS)
        for i in range(0, len(names_), 4):
            print("".join(f"{n:<20}" for n in names_[i:i + 4]).rstrip())
        return
    check_cluster(PROG, clusters)

    def me_name() -> str:
        import getpass
        return getpass.getuser()
    try:
        q = query(os.environ, me_name, os.getuid() == 0, time.time(), allusers=allusers, users=users, me=me,
                  job_ids=job_ids, starttime=starttime, endtime=endtime, states=states, names=names,
                  partitions=partitions, fmt=fmt, long_=long_, allocations=allocations, noheader=noheader,
                  parsable2=parsable2, parsable1=parsable1)
    except SacctError as exc:
        fail(PROG, str(exc))
    reply = call_pages(PROG, "acct", q.body, keys=("jobs", "runs", "steps"))
    sys.stdout.write(text_of(q, shown_rows(q, reply)))
