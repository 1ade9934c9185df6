"""hqueue: list jobs, like squeue; -s lists the running jobs' steps, as squeue -s does."""
from __future__ import annotations

import json
import re
import sys

import click

from ..core.hostlist import compress
from ..core.jobids import ArrayError, collapse_pending, job_label, parse_job_refs, refs_to_wire
from ..core.timefmt import format_duration
from .common import call_pages, fail, print_table, split_list
from .jobfields import DEFAULT_FORMAT, FIELDS, LONG_FORMAT, NEEDS, RIGHT, ROW_KEYS
from .listfilters import filters

_SPEC = re.compile(r"%(\.?)(\d*)([A-Za-z])")


# squeue -s: letter -> (header, getter(step row, now)); a row is a step, its job's keys beside
STEP_FIELDS = {
    "i": ("STEPID", lambda r, now: f"{job_label(r)}.{r['step']}"),
    "j": ("NAME", lambda r, now: r["step_name"]),
    "P": ("PARTITION", lambda r, now: r["partition"]),
    "u": ("USER", lambda r, now: r["user"]),
    "M": ("TIME", lambda r, now: format_duration(max(0, int(now - r["step_start"])))),
    "N": ("NODELIST", lambda r, now: r["step_nodes"]),
}
STEP_FORMAT = "%.15i %.8j %.9P %.8u %.9M %N"
STEP_RIGHT = {"i", "j", "P", "u", "M"}  # squeue's %.N: right-aligned


def parse_format(fmt: str, fields=FIELDS) -> list[tuple[str, str]]:
    """squeue -o: '%i %.9P %j' -> [(letter, header)]. Widths are accepted; columns size themselves."""
    cols = []
    for _dot, _width, letter in _SPEC.findall(fmt):
        if letter not in fields:
            raise click.BadParameter(f"unknown field %{letter} (known: {''.join(sorted(fields))})")
        cols.append(letter)
    if not cols:
        raise click.BadParameter(f"no fields in format {fmt!r}")
    return cols


@click.command(context_settings={"help_option_names": ["--help"]})
@click.option("-u", "--user", "users", multiple=True, help="only these users' jobs (comma list)")
@click.option("--me", is_flag=True, help="only my jobs")
@click.option("-j", "--jobs", "job_ids", multiple=True, help="only these job ids (comma list)")
@click.option("-t", "--states", "states", multiple=True, help="states (names or codes, comma list, or 'all')")
@click.option("-p", "--partition", "partitions", multiple=True, help="only these partitions")
@click.option("-n", "--name", "names", multiple=True, help="only jobs with these names")
@click.option("-l", "--long", "long_", is_flag=True, help="more columns")
@click.option("-h", "--noheader", is_flag=True, help="no header line")
@click.option("-o", "--format", "fmt", help="squeue-style format, e.g. '%i %j %T %R'")
@click.option("-r", "--array", "expand", is_flag=True, help="one row per array task (pending ones too)")
@click.option("-s", "--steps", "step_list", is_flag=False, flag_value="", default=None,
              help="the running jobs' steps instead (optionally only these, e.g. 12.0,13.batch)")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def main(users, me, job_ids, states, partitions, names, long_, noheader, fmt, expand, step_list, as_json):
    """Show the job queue."""
    body, listing_all = filters("hqueue", users, me, job_ids, states)
    if step_list is not None:
        return show_steps(body, step_list, fmt, noheader, as_json, partitions)
    if job_ids and not listing_all:
        body["all"] = True  # squeue -j shows a job whatever its state
    if partitions:
        body["partitions"] = split_list(partitions)
    if names:
        body["names"] = split_list(names)
    try:
        columns = parse_format(fmt or (LONG_FORMAT if long_ else DEFAULT_FORMAT))
    except click.BadParameter as exc:
        fail("hqueue", str(exc.message))
    if not as_json:  # only the columns shown: a tenth of the bytes for a default listing
        body["fields"] = sorted({key for c in columns for key in NEEDS[c]} | set(ROW_KEYS))
    reply = call_pages("hqueue", "jobs", body)
    if as_json:
        json.dump({"jobs": reply["jobs"]}, sys.stdout, indent=2, default=str)
        print()
        return
    now = reply["now"]
    getters = [FIELDS[c][1] for c in columns]
    listed = [(j, None) for j in reply["jobs"]] if expand else collapse_pending(reply["jobs"])
    rows = [[get(job if label is None else {**job, "label": label}, now) for get in getters] for job, label in listed]
    print_table([FIELDS[c][0] for c in columns], rows, header=not noheader,
                right=[i for i, c in enumerate(columns) if c in RIGHT])


def step_rows(reply: dict) -> list[dict]:
    """Each job's numbered steps, then its batch step (on the job's first node), as squeue -s
    orders them."""
    steps_of: dict[int, list] = {}
    for s in reply["steps"]:
        steps_of.setdefault(s["job_id"], []).append(s)
    rows = []
    for job in reply["jobs"]:
        if not job.get("start_time"):
            continue  # COMPLETING before it started: no step ever ran
        for s in steps_of.get(job["id"], []):
            rows.append({**job, "step": s["step_id"], "step_name": s["name"], "step_start": s["start_time"],
                         "step_nodes": compress(s["nodelist"].split(","))})
        if job.get("interactive"):
            continue  # salloc's or srun's allocation runs no batch script, as in Slurm
        first = (job.get("nodelist") or "").split(",")[0]
        rows.append({**job, "step": "batch", "step_name": "batch", "step_start": job["start_time"],
                     "step_nodes": compress([first]) if first else ""})
    return rows


def parse_steps(text: str) -> set[tuple[str, str]]:
    """squeue -s 12.0,13.batch: (job label, step) pairs."""
    wanted = set()
    for item in filter(None, text.split(",")):
        job, dot, step = item.partition(".")
        if not dot or not job or not (step.isdigit() or step == "batch"):
            raise click.BadParameter(f"Invalid job step id: {item!r} (expected JOBID.STEPID, e.g. 12.0 or 12.batch)")
        wanted.add((job, str(int(step)) if step.isdigit() else step))
    return wanted


def show_steps(body: dict, step_list: str, fmt: str | None, noheader: bool, as_json: bool, partitions) -> None:
    try:
        columns = parse_format(fmt or STEP_FORMAT, STEP_FIELDS)
        wanted = parse_steps(step_list)
        if wanted and "ids" not in body and "tasks" not in body:
            body.update(refs_to_wire(parse_job_refs([",".join(sorted({j for j, _s in wanted}))])))
    except click.BadParameter as exc:
        fail("hqueue", str(exc.message))
    except ArrayError as exc:
        fail("hqueue", str(exc))
    if partitions:
        body["partitions"] = split_list(partitions)
    reply = call_pages("hqueue", "steps", body, keys=("jobs", "steps"))
    rows = step_rows(reply)
    if wanted:
        rows = [r for r in rows if (job_label(r), str(r["step"])) in wanted]
    if as_json:
        json.dump({"steps": rows}, sys.stdout, indent=2, default=str)
        print()
        return
    now = reply["now"]
    print_table([STEP_FIELDS[c][0] for c in columns], [[STEP_FIELDS[c][1](r, now) for c in columns] for r in rows],
                header=not noheader, right=[i for i, c in enumerate(columns) if c in STEP_RIGHT])
