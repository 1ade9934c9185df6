"""hacct: accounting, one row per run of each job (like sacct, which shows requeued runs too)."""
from __future__ import annotations

import json
import sys

import click

from ..core.hostlist import compress
from ..core.states import JobState
from ..core.timefmt import format_duration
from .common import call, fail, print_table, split_list

HEADERS = ["JobID", "JobName", "Partition", "State", "ExitCode", "Elapsed", "Restarts", "NodeList", "AllocGPUS"]


def exit_code(code, sig) -> str:
    return f"{code if code is not None else 0}:{sig or 0}"


def rows_for(reply: dict) -> list[list]:
    now = reply["now"]
    by_job: dict[int, list] = {}
    for r in reply["runs"]:
        end = r["end_time"] or now
        state = r["state"] if r["end_time"] else reply_job_state(reply, r["job_id"], r["state"])
        by_job.setdefault(r["job_id"], []).append([
            r["job_id"], r["name"], r["partition"], state, exit_code(r["exit_code"], r["exit_signal"]),
            format_duration(int(end - r["start_time"])), r["attempt"],
            compress([n for n in r["nodelist"].split(",") if n]), r["gpus"]])
    rows = []
    for job in reply["jobs"]:
        rows.extend(by_job.get(job["id"], []))
        if job["state"] == JobState.PENDING.value or (not by_job.get(job["id"]) and job["state"] != "RUNNING"):
            # a job waiting for its (next) run, or one that ended before any run started
            rows.append([job["id"], job["name"], job["partition"], job["state"],
                         exit_code(job["exit_code"], job["exit_signal"]), "0:00",
                         job["restart_count"], "None assigned", 0])
    return rows


def reply_job_state(reply: dict, job_id: int, run_state: str) -> str:
    """A run still going shows the job's live state (RUNNING, COMPLETING, ...)."""
    for j in reply["jobs"]:
        if j["id"] == job_id:
            return j["state"]
    return run_state


@click.command(context_settings={"help_option_names": ["--help"]})
@click.option("-j", "--jobs", "job_ids", multiple=True, help="only these job ids (comma list)")
@click.option("-u", "--user", "users", multiple=True, help="only these users")
@click.option("--me", is_flag=True, help="only my jobs")
@click.option("-n", "--noheader", is_flag=True, help="no header line")
@click.option("-P", "--parsable2", "parsable", is_flag=True, help="'|'-separated output")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def main(job_ids, users, me, noheader, parsable, as_json):
    """Show accounting data: every run of every job."""
    body: dict = {}
    if job_ids:
        try:
            body["ids"] = [int(x) for x in split_list(job_ids)]
        except ValueError:
            fail("hacct", f"invalid job id in {','.join(job_ids)!r}")
    if me:
        import getpass
        body["users"] = [getpass.getuser()]
    elif users:
        body["users"] = split_list(users)
    reply = call("hacct", "acct", body)
    if as_json:
        json.dump(reply, sys.stdout, indent=2, default=str)
        print()
        return
    rows = rows_for(reply)
    if parsable:
        if not noheader:
            print("|".join(HEADERS))
        for row in rows:
            print("|".join(str(c) for c in row))
        return
    print_table(HEADERS, rows, header=not noheader, right=[0, 5, 6, 8])
