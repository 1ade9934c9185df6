"""hcancel: cancel or signal jobs, like scancel."""
from __future__ import annotations

import signal as signals
import sys

import click

from ..core.jobids import ArrayError, parse_job_refs, refs_to_wire
from .common import call, fail, split_list


def parse_signal(text: str) -> int:
    t = text.strip().upper()
    if t.isdigit():
        return int(t)
    name = t if t.startswith("SIG") else "SIG" + t
    try:
        return int(signals.Signals[name])
    except KeyError:
        raise click.BadParameter(f"invalid signal {text!r}") from None


@click.command(context_settings={"help_option_names": ["--help"]})
@click.argument("job_ids", nargs=-1)
@click.option("-u", "--user", "users", multiple=True, help="cancel these users' jobs")
@click.option("--me", is_flag=True, help="cancel my jobs")
@click.option("-t", "--state", "states", multiple=True, help="only jobs in these states (e.g. PENDING)")
@click.option("-n", "--name", "names", multiple=True, help="only jobs with these names")
@click.option("-p", "--partition", "partitions", multiple=True, help="only jobs in these partitions")
@click.option("-s", "--signal", "sig", help="send this signal instead of cancelling")
@click.option("-Q", "--quiet", is_flag=True, help="do not report jobs that have already ended")
def main(job_ids, users, me, states, names, partitions, sig, quiet):
    """Cancel jobs (or send them a signal)."""
    cancel("hcancel", job_ids, users, me, states, names, partitions, sig,
           lambda err: not (quiet and "already completing or completed" in err))


def cancel(prog: str, job_ids, users, me, states, names, partitions, sig, reported) -> None:
    """Ask the controller to cancel (or signal) what the options select; print the errors
    `reported` keeps, and exit 1 if there is one."""
    body: dict = {}
    try:
        body.update(refs_to_wire(parse_job_refs(job_ids)))  # 12 (a job, or a whole array), 12_4, 12_[1-3]
    except ArrayError as exc:
        fail(prog, str(exc))
    if me:
        import getpass
        body["users"] = [getpass.getuser()]
    elif users:
        body["users"] = split_list(users)
    for key, values in (("states", states), ("names", names), ("partitions", partitions)):
        if values:
            body[key] = split_list(values)
    if sig:
        try:
            body["signal"] = parse_signal(sig)
        except click.BadParameter as exc:
            fail(prog, exc.message)
    if len(body) == (1 if sig else 0):
        fail(prog, "No job identification provided")
    reply = call(prog, "cancel", body)
    errors = [e for e in reply["errors"] if reported(e)]
    for err in errors:
        print(f"{prog}: error: {err}", file=sys.stderr)
    if errors:
        sys.exit(1)
