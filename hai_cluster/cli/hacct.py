"""hacct: accounting, one row per run of each job (like sacct, which shows requeued runs too),
each followed by its steps as sacct shows them: `12.batch` (the batch script) and `12.0`, `12.1`...
(its sruns); -X shows the runs alone.

A job that never started has one row with its own state. Fields are sacct's names; the extra ones
are AllocGPUS, GPUHours, Restarts and Reason, and the GPU telemetry rollups GPUUtil, MaxGPUUtil,
MaxGPUMem and Energy (sacct's ConsumedEnergy). AveCPU, MaxRSS, AveRSS and TotalCPU are what the
run's cgroups were charged (CPU time and memory peaks, exited processes included); AveCPU here is
a percent of one CPU per rank (sacct's is the CPU time per task)."""
from __future__ import annotations

import json
import re
import sys
import time
from typing import Callable

import click

from ..core.hostlist import compress
from ..core.jobids import ArrayError, job_label, parse_job_refs, refs_to_wire
from ..core.timefmt import format_duration, parse_datetime
from .common import call_pages, fail, iso_time, print_table, split_list
from .jobfields import cpus
from .telemetry_fmt import energy, mib

DEFAULT_FIELDS = "JobID,JobName,Partition,Account,AllocCPUS,State,ExitCode"
LONG_FIELDS = "JobID,JobName,Partition,State,ExitCode,Elapsed,Restarts,NodeList,AllocGPUS,GPUHours,Reason"



def _state(row: dict) -> str:
    why = row.get("reason") or ""
    if row["state"] == "CANCELLED" and why.startswith("cancelled by "):
        return f"CANCELLED by {why.split()[-1]}"
    return row["state"]


def _opt(v, fmt: str) -> str:
    return "" if v is None else fmt.format(v)


def _elapsed(row: dict) -> int:
    if not row.get("start_time"):
        return 0
    return int((row.get("end_time") or row["now"]) - row["start_time"])


def _ranks(row: dict) -> int:
    return len([n for n in (row.get("nodelist") or "").split(",") if n]) or 1


def _avecpu(row: dict) -> float | None:
    """Percent of one CPU per rank: from the cgroups' CPU time once the run ended, else (running,
    or a node without cgroups) the telemetry samples' mean."""
    if row.get("cpu_seconds") is not None and _elapsed(row) > 0:
        return row["cpu_seconds"] / _elapsed(row) / _ranks(row) * 100
    return row.get("cpu_mean")


def _charged(row: dict) -> float:
    """GPUs the run is charged: whole GPUs, or a sharing run's share (0.25)."""
    return row.get("gpu_charge") or row["gpus"]


FIELDS: dict[str, Callable[[dict], object]] = {
    # 12_4 for a task of array 12; 12.batch and 12.0 for its steps
    "jobid": lambda r: job_label({**r, "id": r["job_id"]}) + ("" if r.get("step") is None else f".{r['step']}"),
    "jobname": lambda r: r["name"],
    "partition": lambda r: r["partition"],
    "account": lambda r: r.get("account") or "default",
    "user": lambda r: r["user"],
    "alloccpus": lambda r: r["cpus"],
    "allocgpus": lambda r: f"{_charged(r):g}",
    "state": _state,
    "exitcode": lambda r: f"{r['exit_code'] if r['exit_code'] is not None else 0}:{r['exit_signal'] or 0}",
    "elapsed": lambda r: format_duration(_elapsed(r)),
    "submit": lambda r: iso_time(r["submit_time"]),
    "start": lambda r: iso_time(r.get("start_time")),
    "end": lambda r: iso_time(r.get("end_time")),
    "restarts": lambda r: r["attempt"],
    "nodelist": lambda r: compress([n for n in (r.get("nodelist") or "").split(",") if n]) or "None assigned",
    "gpuhours": lambda r: f"{_charged(r) * _elapsed(r) / 3600:.2f}",
    "reason": lambda r: r.get("reason") or "",
    # GPU telemetry rollups of the run (empty when no sample came)
    "gpuutil": lambda r: _opt(r.get("gpu_util_mean"), "{:.1f}%"),
    "maxgpuutil": lambda r: _opt(r.get("gpu_util_max"), "{:.0f}%"),
    "maxgpumem": lambda r: mib(r["gpu_mem_max_mb"]) if r.get("gpu_mem_max_mb") is not None else "",
    "energy": lambda r: energy(r.get("energy_j")),
    "consumedenergy": lambda r: energy(r.get("energy_j")),
    "avecpu": lambda r: _opt(_avecpu(r), "{:.1f}%"),
    "totalcpu": lambda r: "" if r.get("cpu_seconds") is None else format_duration(int(r["cpu_seconds"])),
    "maxrss": lambda r: "" if r.get("max_rss_kb") is None else mib(-(-r["max_rss_kb"] // 1024)),
    "averss": lambda r: "" if r.get("ave_rss_kb") is None else mib(-(-r["ave_rss_kb"] // 1024)),
}
RIGHT = {"jobid", "alloccpus", "allocgpus", "elapsed", "restarts", "gpuhours", "gpuutil", "maxgpuutil", "maxgpumem",
         "energy", "consumedenergy", "avecpu", "totalcpu", "maxrss", "averss"}
_FIELD = re.compile(r"([A-Za-z]+)(?:%(\d+))?")


def parse_fields(text: str) -> list[tuple[str, str, int | None]]:
    """sacct -o: 'JobID,State%20' -> [(key, header, width)]."""
    out = []
    for item in text.split(","):
        m = _FIELD.fullmatch(item.strip())
        if not m or m[1].lower() not in FIELDS:
            raise click.BadParameter(f"invalid field {item!r}; valid: {', '.join(sorted(FIELDS))}")
        out.append((m[1].lower(), m[1], int(m[2]) if m[2] else None))
    return out


def _fit(text: str, width: int, right: bool) -> str:
    return text[:width].rjust(width) if right else text[:width].ljust(width)


# A batch script ended by the time limit or preemption was signalled: sacct shows its step CANCELLED.
BATCH_STATE = {"TIMEOUT": "CANCELLED", "PREEMPTED": "CANCELLED", "DEADLINE": "CANCELLED"}


def step_rows(run: dict, steps: list[dict], job: dict) -> list[dict]:
    """A started run's steps as rows: its batch step, on the first node (an allocation of salloc or
    srun has none, as in Slurm), then each srun's."""
    first = (run.get("nodelist") or "").split(",")[0]
    common = {"job_id": run["job_id"], "array_job_id": run.get("array_job_id"),
              "array_task_id": run.get("array_task_id"), "partition": "", "account": run.get("account"),
              "user": run["user"], "submit_time": run["submit_time"], "now": run["now"], "attempt": run["attempt"],
              "gpus": 0, "reason": ""}
    state = run["state"] if run["end_time"] else "RUNNING"
    rows = [] if job.get("interactive") else [{**common, "step": "batch", "name": "batch", "state": BATCH_STATE.get(state, state),
             "exit_code": run["exit_code"], "exit_signal": run["exit_signal"], "start_time": run["start_time"],
             "end_time": run["end_time"], "nodelist": first, "cpus": cpus(job) // max(1, job["nodes"]), "ntasks": 1}]
    for s in steps:
        rows.append({**common, "step": s["step_id"], "name": s["name"], "state": s["state"],
                     "exit_code": s["exit_code"], "exit_signal": s["exit_signal"], "start_time": s["start_time"],
                     "end_time": s["end_time"], "nodelist": s["nodelist"], "cpus": s["cpus"], "ntasks": s.get("ntasks")})
    return rows


def rows_for(reply: dict, with_steps: bool = True) -> list[dict]:
    """Flat rows: one per run (and its steps), plus one for each job waiting for its (next) run or
    ended unrun."""
    now = reply["now"]
    jobs = {j["id"]: j for j in reply["jobs"]}
    steps_of: dict[int, list] = {}
    for s in reply.get("steps", ()):
        steps_of.setdefault(s["run_id"], []).append(s)
    by_job: dict[int, list] = {}
    for r in reply["runs"]:
        job = jobs.get(r["job_id"])
        if job is None:
            continue
        state = r["state"] if r["end_time"] else job["state"]  # a live run shows the job's state
        by_job.setdefault(r["job_id"], []).append({
            **r, "state": state, "now": now, "submit_time": job["submit_time"], "user": job["user"],
            "cpus": cpus(job)})
    rows = []
    for job in reply["jobs"]:
        runs = by_job.get(job["id"], [])
        for run in runs:
            rows.append(run)
            if with_steps:
                rows.extend(step_rows(run, steps_of.get(run["id"], []), job))
        if job["state"] == "PENDING" or (not runs and job["state"] not in ("RUNNING", "COMPLETING", "PREEMPTING")):
            rows.append({"job_id": job["id"], "array_job_id": job.get("array_job_id"),
                         "array_task_id": job.get("array_task_id"), "name": job["name"], "partition": job["partition"], "user": job["user"],
                         "state": job["state"], "exit_code": job["exit_code"], "exit_signal": job["exit_signal"],
                         "start_time": None, "end_time": job["end_time"], "submit_time": job["submit_time"],
                         "now": now, "attempt": job["restart_count"], "nodelist": "", "gpus": 0,
                         "cpus": cpus(job), "reason": job["reason"]})
    return rows


def in_window(row: dict, start: float | None, end: float | None) -> bool:
    """sacct -S/-E: the row's lifetime (submit to end, or now) overlaps the window."""
    first = row.get("start_time") or row["submit_time"]
    last = row.get("end_time") or row["now"]
    return (start is None or last >= start) and (end is None or first <= end)


@click.command(context_settings={"help_option_names": ["--help"]})
@click.option("-j", "--jobs", "job_ids", multiple=True, help="only these job ids (comma list)")
@click.option("-u", "--user", "users", multiple=True, help="only these users")
@click.option("--me", is_flag=True, help="only my jobs")
@click.option("-S", "--starttime", help="from this time (default: midnight today, unless -j)")
@click.option("-E", "--endtime", help="until this time (default: now)")
@click.option("-o", "--format", "fmt", help=f"fields, e.g. JobID,State%20 (default {DEFAULT_FIELDS})")
@click.option("-l", "--long", "long_", is_flag=True, help=f"fields {LONG_FIELDS}")
@click.option("-X", "--allocations", is_flag=True, help="runs only, not their steps")
@click.option("-n", "--noheader", is_flag=True, help="no header line")
@click.option("-P", "--parsable2", "parsable", is_flag=True, help="'|'-separated output")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def main(job_ids, users, me, starttime, endtime, fmt, long_, allocations, noheader, parsable, as_json):
    """Show accounting data: every run of every job."""
    body: dict = {}
    if job_ids:
        try:
            body.update(refs_to_wire(parse_job_refs(job_ids)))
        except ArrayError as exc:
            fail("hacct", str(exc))
    if me:
        import getpass
        body["users"] = [getpass.getuser()]
    elif users:
        body["users"] = split_list(users)
    try:
        fields = parse_fields(fmt or (LONG_FIELDS if long_ else DEFAULT_FIELDS))
        now = time.time()
        start = parse_datetime(starttime, now) if starttime else (None if job_ids else parse_datetime("midnight", now))
        end = parse_datetime(endtime, now) if endtime else None
    except (click.BadParameter, ValueError) as exc:
        fail("hacct", getattr(exc, "message", None) or str(exc))
    if start is not None:
        body["since"] = start  # only jobs that had not ended by then: the rest is filtered out below anyway
    reply = call_pages("hacct", "acct", body, keys=("jobs", "runs", "steps"))
    if as_json:
        json.dump(reply, sys.stdout, indent=2, default=str)
        print()
        return
    rows = [r for r in rows_for(reply, not allocations) if in_window(r, start, end)]
    cells = [[FIELDS[key](r) for key, _h, _w in fields] for r in rows]
    if parsable:
        if not noheader:
            print("|".join(h for _k, h, _w in fields))
        for row in cells:
            print("|".join(str(c) for c in row))
        return
    # sacct's Field%W is the column's width: cut or padded to W, the header too
    cells = [[_fit(str(c), w, k in RIGHT) if w else c for c, (k, _h, w) in zip(row, fields)] for row in cells]
    print_table([_fit(h, w, k in RIGHT) if w else h for k, h, w in fields], cells, header=not noheader,
                right=[i for i, (k, _h, _w) in enumerate(fields) if k in RIGHT])
