"""sacct, as Slurm prints it: hacct's rows (one per run, each followed by its steps) with sacct's
options, field names, widths, `+`-cut values, dashed rule, `-P`/`-p` and SACCT_FORMAT. Fields we
have no data for are empty, as sacct prints a field a job did not record. MaxRSS, AveRSS, AveCPU
and TotalCPU come from the run's cgroups (its CPU time and memory peaks, as the kernel charged
them, exited processes included) and are on the job's line: a step has no cgroup of its own."""
from __future__ import annotations

import getpass
import os
import sys
import time

import click

from ..core.jobids import ArrayError, parse_job_refs, refs_to_wire
from ..core.states import parse_state
from ..core.timefmt import parse_datetime, slurm_cpu_time, slurm_duration
from .common import call_pages, check_cluster, fail, iso_time, split_list
from .hacct import FIELDS as OURS, _charged, _elapsed, _ranks, in_window, rows_for
from .slurmfmt import Field, sacct_lines, slurm_bytes
from .squeue import SLURM_STATE

PROG = "sacct"
DEFAULT_FORMAT = "JobID,JobName,Partition,Account,AllocCPUS,State,ExitCode"
# sacct -l's fields that we have (the rest of Slurm's long list are per-task I/O and VM figures)
LONG_FORMAT = ("JobID,JobIDRaw,JobName,Partition,MaxRSS,AveRSS,AveCPU,NTasks,AllocCPUS,Elapsed,State,ExitCode,"
               "ReqMem,ConsumedEnergy,AllocTRES")


def _job(r: dict) -> dict:
    return r.get("job") or {}


def _alloc_tres(r: dict) -> str:
    if not r.get("start_time") and r.get("step") is None:
        return ""
    job = _job(r)
    nodes = len([n for n in (r.get("nodelist") or "").split(",") if n]) or job.get("nodes", 1)
    parts = {"billing": r["cpus"], "cpu": r["cpus"], "node": nodes}
    gpus = _charged(r) if r.get("step") is None else 0
    if gpus:
        parts["gres/gpu"] = f"{gpus:g}"
    if job.get("mem_mb") and r.get("step") is None:
        parts["mem"] = f"{job['mem_mb'] * nodes}M"
    return ",".join(f"{k}={v}" for k, v in sorted(parts.items()))


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
    "ReqMem": (10, False, lambda r: f"{_job(r)['mem_mb']}M" if _job(r).get("mem_mb") else "0"),
    "State": (10, False, lambda r: SLURM_STATE.get(r["state"], None) or OURS["state"](r)),
    "ExitCode": (8, False, OURS["exitcode"]),
    "DerivedExitCode": (15, False, lambda r: "" if r.get("step") is not None else OURS["exitcode"](r)),
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


def parse_fields(text: str) -> list[tuple[str, Field]]:
    """sacct -o 'JobID,State%20,jobn': (our name, the column). Names any case, a unique prefix
    (the first in sacct's list, as sacct takes it); %W sets the width (right-justified)."""
    out = []
    for item in filter(None, text.split(",")):
        name, pct, width = item.strip().partition("%")
        key = _BY_LOWER.get(name.lower()) or next((n for n in FIELDS if n.lower().startswith(name.lower()) and name),
                                                  None)
        if key is None:
            fail(PROG, f'Invalid field requested: "{name}"')
        w, number, _get = FIELDS[key]
        if pct:
            if not width.isdigit():
                fail(PROG, f'Invalid field width in "{item}"')
            w = int(width)
        out.append((key, Field(key, w, number)))
    if not out:
        fail(PROG, "no fields requested")
    return out


@click.command(context_settings={"help_option_names": ["--help"]})
@click.option("-a", "--allusers", is_flag=True, help="every user's jobs")
@click.option("-u", "--user", "--uid", "users", multiple=True, help="only these users")
@click.option("--me", is_flag=True, help="only my jobs (the default, except for root)")
@click.option("-j", "--jobs", "job_ids", multiple=True, help="only these jobs (12, 12_4, 12.batch)")
@click.option("-S", "--starttime", help="from this time (default: midnight today, unless -j)")
@click.option("-E", "--endtime", help="until this time (default: now)")
@click.option("-s", "--state", "states", multiple=True, help="only these states (CD,F,CA,R,PD,TO,...)")
@click.option("--name", "names", multiple=True, help="only jobs with these names")
@click.option("-r", "--partition", "partitions", multiple=True, help="only these partitions")
@click.option("-o", "--format", "fmt", help=f"fields, e.g. JobID,State%20 (default {DEFAULT_FORMAT})")
@click.option("-l", "--long", "long_", is_flag=True, help="more fields")
@click.option("-X", "--allocations", is_flag=True, help="the jobs' allocations, not their steps")
@click.option("-n", "--noheader", is_flag=True, help="no header lines")
@click.option("-P", "--parsable2", "parsable2", is_flag=True, help="'|' between fields")
@click.option("-p", "--parsable", "parsable1", is_flag=True, help="'|' after every field")
@click.option("-e", "--helpformat", is_flag=True, help="list the fields")
@click.option("-M", "--clusters", help="only the local cluster")
@click.option("-D", "--duplicates", is_flag=True, help="every run of a requeued job (always shown here)")
def main(allusers, users, me, job_ids, starttime, endtime, states, names, partitions, fmt, long_, allocations,
         noheader, parsable2, parsable1, helpformat, clusters, duplicates):
    """Accounting data of jobs and their steps, as Slurm's sacct prints them."""
    if helpformat:
        names_ = list(FIELDS)
        for i in range(0, len(names_), 4):
            print("".join(f"{n:<20}" for n in names_[i:i + 4]).rstrip())
        return
    check_cluster(PROG, clusters)
    fields = parse_fields(fmt or (None if long_ else os.environ.get("SACCT_FORMAT"))
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
            fail(PROG, str(exc))
    if me or not (allusers or users or job_ids or os.getuid() == 0):
        body["users"] = [getpass.getuser()]
    elif users:
        body["users"] = split_list(users)
    wanted_states = None
    if states:
        try:
            wanted_states = {parse_state(s).value for s in split_list(states)}
        except ValueError as exc:
            fail(PROG, str(exc))
    try:
        now = time.time()
        start = parse_datetime(starttime, now) if starttime else (None if job_ids else parse_datetime("midnight", now))
        end = parse_datetime(endtime, now) if endtime else None
    except ValueError as exc:
        fail(PROG, str(exc))
    if start is not None:
        body["since"] = start
    reply = call_pages(PROG, "acct", body, keys=("jobs", "runs", "steps"))
    jobs = {j["id"]: j for j in reply["jobs"]}
    rows = [r for r in rows_for(reply, not allocations) if in_window(r, start, end)]
    for r in rows:
        r["job"] = jobs.get(r["job_id"], {})
    wanted_names = set(split_list(names) or ())
    wanted_parts = set(split_list(partitions) or ())
    rows = [r for r in rows if (not wanted_names or r["job"].get("name") in wanted_names)
            and (not wanted_parts or r["job"].get("partition") in wanted_parts)
            and (wanted_states is None or SLURM_STATE.get(r["state"], r["state"]).split()[0] in wanted_states)
            and (not steps_named or r.get("step") is None or FIELDS["JobID"][2](r) in steps_named)]
    cells = [[str(FIELDS[key][2](r)) for key, _f in fields] for r in rows]
    mode = "P" if parsable2 else "p" if parsable1 else None
    lines = sacct_lines([f for _k, f in fields], cells, header=not noheader, parsable=mode)
    if lines:
        sys.stdout.write("\n".join(lines) + "\n")
