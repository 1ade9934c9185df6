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

import click

from ..core.jobids import ArrayError, parse_job_refs, refs_to_wire
from ..core.timefmt import parse_datetime
from .acctrows import BATCH_STATE, FIELDS, in_window, rows_for, step_rows  # noqa: F401  (hacct's API)
from .common import call_pages, fail, print_table, split_list

DEFAULT_FIELDS = "JobID,JobName,Partition,Account,AllocCPUS,State,ExitCode"
LONG_FIELDS = "JobID,JobName,Partition,State,ExitCode,Elapsed,Restarts,NodeList,AllocGPUS,GPUHours,Reason"
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
