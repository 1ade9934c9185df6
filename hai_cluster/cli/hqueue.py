"""hqueue: list jobs, like squeue."""
from __future__ import annotations

import json
import re
import sys

import click

from ..core.jobids import ArrayError, collapse_pending, parse_job_refs, refs_to_wire
from .common import call_pages, fail, print_table, split_list
from .jobfields import DEFAULT_FORMAT, FIELDS, LONG_FORMAT, NEEDS, RIGHT, ROW_KEYS

_SPEC = re.compile(r"%(\.?)(\d*)([A-Za-z])")


def parse_format(fmt: str) -> list[tuple[str, str]]:
    """squeue -o: '%i %.9P %j' -> [(letter, header)]. Widths are accepted; columns size themselves."""
    cols = []
    for _dot, _width, letter in _SPEC.findall(fmt):
        if letter not in FIELDS:
            raise click.BadParameter(f"unknown field %{letter} (known: {''.join(sorted(FIELDS))})")
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
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def main(users, me, job_ids, states, partitions, names, long_, noheader, fmt, expand, as_json):
    """Show the job queue."""
    body: dict = {}
    if me:
        import getpass
        body["users"] = [getpass.getuser()]
    elif users:
        body["users"] = split_list(users)
    if job_ids:
        try:
            body.update(refs_to_wire(parse_job_refs(job_ids)))
        except ArrayError as exc:
            fail("hqueue", str(exc))
    wanted = split_list(states)
    if wanted and [s.lower() for s in wanted] == ["all"]:
        body["all"] = True
    elif wanted:
        body["states"] = wanted
    if job_ids and not wanted:
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
