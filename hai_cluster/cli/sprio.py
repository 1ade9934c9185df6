"""sprio, as Slurm names it and prints it: the pending jobs' priority factors, from the controller
(api_priority.py: the factors the running policy orders by, and PRIORITY, the job's place in that
order). Options, defaults, formats, messages and exit codes are Slurm 22.05's (src/sprio/), checked
against it; docs/SLURM.md says what differs."""
from __future__ import annotations

import os
import pwd
import sys

from .. import __version__
from ..core.usertext import printable
from .common import call_pages, check_cluster
from .gnu_getopt import NO, OPTIONAL, REQUIRED, GetoptError, LongOption, getopt_long
from .spriofmt import LETTERS, SortError, default_format, parse_format, render, sort_rows

PROG = "sprio"
MAX_JOB_ID = 2**63 - 1  # what the store's ids hold
LONG_OPTIONS = [
    LongOption("noheader", NO, "h"), LongOption("jobs", OPTIONAL, "j"), LongOption("long", NO, "l"),
    LongOption("cluster", REQUIRED, "M"), LongOption("clusters", REQUIRED, "M"), LongOption("norm", NO, "n"),
    LongOption("format", REQUIRED, "o"), LongOption("sort", REQUIRED, "S"), LongOption("partition", REQUIRED, "p"),
    LongOption("user", REQUIRED, "u"), LongOption("users", REQUIRED, "u"), LongOption("verbose", NO, "v"),
    LongOption("version", NO, "V"), LongOption("weights", NO, "w"), LongOption("federation", NO, "federation"),
    LongOption("help", NO, "help"), LongOption("local", NO, "local"), LongOption("sib", NO, "sibling"),
    LongOption("sibling", NO, "sibling"), LongOption("usage", NO, "usage"),
]
USAGE = """Usage: sprio [-j jid[s]] [-u user_name[s]] [-o format] [-p partitions]
   [--federation] [--local] [--sibling] [--usage] [-hlnvVw]
"""
HELP = """Usage: sprio [OPTIONS]
      --federation                display jobs in federation if a member of one
  -h, --noheader                  no headers on output
  -j, --jobs                      comma separated list of jobs
                                  to view, default is all
      --local                     display jobs on local cluster only
  -l, --long                      long report
  -M, --cluster=cluster_name      cluster to issue commands to.  Default is
                                  current cluster.  cluster with no name will
                                  reset to default.
                                  NOTE: SlurmDBD must be up.
  -n, --norm                      display normalized values
  -o, --format=format             format specification
      --sibling                   display job records separately for each federation cluster
  -p, --partition=partition_name  comma separated list of partitions
  -u, --user=user_name            comma separated list of users to view
  -v, --verbose                   verbosity level
  -V, --version                   output version information and exit
  -w, --weights                   show the weights for each priority factor

Help options:
  --help                          show this help message
  --usage                         display a brief summary of sprio options
"""


class Params:
    """sprio's parameters (struct sprio_parameters)."""

    def __init__(self) -> None:
        self.federation = self.local = self.sibling = False
        self.job_flag = self.long_list = self.no_header = self.normalized = self.weights = False
        self.verbose = 0
        self.clusters: str | None = None
        self.format: str | None = None
        self.jobs: str | None = None
        self.parts: str | None = None
        self.users: str | None = None
        self.sort: str | None = None


def error(message: str) -> None:
    print(f"{PROG}: error: {printable(message)}", file=sys.stderr)


def stop(message: str, *, fatal: bool = False) -> None:
    print(f"{PROG}: {'fatal' if fatal else 'error'}: {printable(message)}", file=sys.stderr)
    sys.exit(1)


def parse_command_line(argv: list[str]) -> Params:
    """opts.c's parse_command_line: the environment, then the options, then the operands."""
    p = Params()
    if os.environ.get("SLURM_CLUSTERS"):
        p.clusters, p.local = os.environ["SLURM_CLUSTERS"], True
    p.federation = bool(os.environ.get("SPRIO_FEDERATION"))
    p.local = p.local or bool(os.environ.get("SPRIO_LOCAL"))
    p.sibling = bool(os.environ.get("SPRIO_SIBLING"))
    try:
        opts, operands = getopt_long(PROG, argv, "hj::lM:no:S:p:u:vVw", LONG_OPTIONS)
    except GetoptError as exc:
        print(printable(str(exc)), file=sys.stderr)
        print(f'Try "{PROG} --help" for more information', file=sys.stderr)
        sys.exit(1)
    override_format_env = False
    for key, value in opts:
        if key == "h":
            p.no_header = True
        elif key == "j":
            if value is not None:
                p.jobs = value
            p.job_flag = True
        elif key == "l":
            p.long_list = override_format_env = True
        elif key == "M":
            p.clusters, p.local = value, True
        elif key == "n":
            p.normalized = True
        elif key == "o":
            p.format, override_format_env = value, True
        elif key == "S":
            p.sort = value
        elif key == "p":
            p.parts = value
        elif key == "u":
            p.users = value
        elif key == "v":
            p.verbose += 1
        elif key == "V":
            print(f"hai-cluster {__version__}")
            sys.exit(0)
        elif key == "w":
            p.weights = True
        elif key in ("federation", "local", "sibling"):
            setattr(p, key, True)
        elif key == "help":
            sys.stdout.write(HELP)
            sys.exit(0)
        elif key == "usage":
            sys.stdout.write(USAGE)
            sys.exit(0)
    if p.long_list and p.format is not None:
        stop("Options -o(--format) and -l(--long) are mutually exclusive. Please remove one and retry.",
             fatal=True)
    if not override_format_env and os.environ.get("SPRIO_FORMAT") is not None:
        p.format = os.environ["SPRIO_FORMAT"]
    if operands and p.job_flag:
        p.jobs = operands.pop(0)
    if operands:
        error(f"Unrecognized option: {operands[0]}")
        sys.stdout.write(USAGE)
        sys.exit(1)
    return p


def job_filter(jobs: str) -> dict:
    """-j 12,13,14_2: ids and array tasks for the request; a wrong one ends sprio, as Slurm's."""
    ids, tasks = [], []
    for token in (t for t in jobs.split(",") if t):
        job, sep, task = token.partition("_")
        if not (job.isascii() and job.isdigit() and 0 < int(job) <= MAX_JOB_ID
                and (not sep or task.isascii() and task.isdigit() and int(task) <= MAX_JOB_ID)):
            stop(f"Invalid job id: {token}")
        if sep:
            tasks.append([int(job), int(task)])
        else:
            ids.append(int(job))
    return {"ids": ids, **({"tasks": tasks} if tasks else {})}


def user_filter(users: str) -> list[str]:
    """-u alice,1001: user names (a uid is its user's name); an unknown one is said and left out."""
    names = []
    for token in (t for t in users.split(",") if t):
        try:
            names.append(pwd.getpwuid(int(token)).pw_name if token.isascii() and token.isdigit()
                         else pwd.getpwnam(token).pw_name)
        except (KeyError, ValueError, OverflowError):
            error(f"Invalid user: {token}")
            print(file=sys.stderr)  # Slurm's message ends with a newline of its own
    return names


def print_options(p: Params, ids: list[int] | None, users: list[str] | None) -> None:
    """-v: the parameters, as opts.c's _print_options."""
    def shown(v):
        return "(null)" if v is None else printable(v)
    print("-----------------------------")
    print(f"format     = {shown(p.format)}")
    print(f"job_flag   = {int(p.job_flag)}")
    print(f"jobs       = {shown(p.jobs)}")
    print(f"partition  = {shown(p.parts)}")
    print(f"users      = {shown(p.users)}")
    print(f"verbose    = {p.verbose}")
    if p.verbose > 1:
        for i, j in enumerate(ids or ()):
            print(f"job_list[{i}] = {j}")
        for i, name in enumerate(users or ()):
            print(f"user_list[{i}] = {pwd.getpwnam(name).pw_uid}")
    print("-----------------------------\n\n")


def main(argv: list[str] | None = None) -> int:
    p = parse_command_line(sys.argv[1:] if argv is None else argv)
    if p.clusters is not None:
        if "," in p.clusters:
            stop("Only one cluster can be used at a time with sprio", fatal=True)
        check_cluster(PROG, p.clusters)
    body: dict = {}
    if p.jobs is not None:
        body.update(job_filter(p.jobs))
    users = user_filter(p.users) if p.users is not None else None
    if users is not None:
        body["users"] = users
    if p.parts is not None:
        body["partitions"] = [x for x in p.parts.split(",") if x]
    if p.verbose:
        print_options(p, body.get("ids"), users)
    reply = call_pages(PROG, "priorities", body)
    for job, task in reply.get("missing_tasks") or ():
        stop(f"Invalid job id: {job}_{task}")
    weights = reply["weights"]
    fmt = p.format
    if fmt is None:
        fmt = default_format(normalized=p.normalized, long_=p.long_list, users=p.users is not None,
                             cluster=p.sibling and not p.local, weights=weights, level=reply["policy"] == "mlfq")
    columns, errors = parse_format(fmt, LETTERS)
    for message in errors:
        error(message)
    # one line per partition of a job (-p a,b), only those asked for with -p
    wanted = set(body["partitions"]) if "partitions" in body else None
    rows = [{**job, "partition": part} for job in reply["jobs"] for part in (job["partitions"] or [""])
            if wanted is None or part in wanted]
    if p.jobs is not None and not rows:
        print("Unable to find jobs matching user/id(s) specified")
        return 0
    out = sys.stdout
    if not p.no_header or p.weights:
        out.write("".join(line + "\n" for line in render(columns, [], weights, header=not p.no_header,
                                                          weights_line=p.weights)))
    if p.weights:
        return 0
    try:
        rows = sort_rows(rows, p.sort, weights)
    except SortError as exc:
        out.flush()
        stop(str(exc))
    out.write("".join(line + "\n" for line in render(columns, rows, weights, header=False, weights_line=False)))
    return 0
