"""The fast paths of squeue and sacct give what the plain ones gave: the lines (one %-format per
line against the cell-by-cell formatting they replaced, kept here as the reference), the reply made
safe to print (shown_listing against shown), and the options (the fast parse against click's)."""
import string

import click
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hai_cluster.cli import sacct, squeue
from hai_cluster.cli.common import shown, shown_listing
from hai_cluster.cli.fastargs import Option, command_of, parse_simple
from hai_cluster.cli.slurmfmt import Column, Field, render, sacct_lines

# Values as users make them: ordinary, long, with %, wide and hostile characters (ESC, newline,
# right-to-left override), the empty string.
TEXT = st.text(alphabet=st.sampled_from([*string.ascii_letters, *string.digits, " ", "%", "|", "+", "_", "[", "]",
                                         "é", "名", "\x1b", "\n", "\u202e", "\t"]), max_size=30)


def reference_render(columns, headers, rows, header=True):
    def cell(text, width, right):
        if not width:
            return text
        text = text[:width]
        return text.rjust(width) if right else text.ljust(width)

    def line(values):
        return "".join(f"{c.prefix}{cell(v, c.width, c.right)}{c.suffix}" for c, v in zip(columns, values))
    return ([line(headers)] if header else []) + [line(r) for r in rows]


def reference_sacct(fields, rows, header=True):
    def fit(f, value):
        width = abs(f.width)
        if len(value) > width and not f.number:
            value = value[:width - 1] + "+"
        return (value.rjust(width) if f.width > 0 else value.ljust(width)) + " "

    def head(f):
        width = abs(f.width)
        name = f.name[:width]
        return (name.rjust(width) if f.width > 0 else name.ljust(width)) + " "
    lines = []
    if header:
        lines.append("".join(head(f) for f in fields))
        lines.append("".join("-" * abs(f.width) + " " for f in fields))
    return lines + ["".join(fit(f, v) for f, v in zip(fields, r)) for r in rows]


COLUMNS = st.lists(st.builds(Column, st.sampled_from("ijPTRM"), st.integers(0, 25), st.booleans(), TEXT, TEXT),
                   min_size=1, max_size=6)


@settings(max_examples=300, deadline=None)
@given(COLUMNS, st.data(), st.booleans())
def test_squeue_lines_are_the_cell_by_cell_ones(columns, data, header):
    rows = data.draw(st.lists(st.lists(TEXT, min_size=len(columns), max_size=len(columns)), max_size=8))
    headers = data.draw(st.lists(TEXT, min_size=len(columns), max_size=len(columns)))
    assert render(columns, headers, rows, header) == reference_render(columns, headers, rows, header)


FIELDS = st.lists(st.builds(Field, st.sampled_from(["JobID", "State", "Elapsed", "JobName", "X"]),
                            st.integers(-20, 20), st.booleans()), min_size=1, max_size=6)


@settings(max_examples=300, deadline=None)
@given(FIELDS, st.data(), st.booleans())
def test_sacct_lines_are_the_cell_by_cell_ones(fields, data, header):
    rows = data.draw(st.lists(st.lists(TEXT, min_size=len(fields), max_size=len(fields)), max_size=8))
    assert sacct_lines(fields, rows, header=header) == reference_sacct(fields, rows, header)


SCALAR = st.one_of(TEXT, st.integers(-2**40, 2**40), st.floats(allow_nan=False), st.booleans(), st.none())
ROW = st.dictionaries(st.one_of(TEXT, st.sampled_from(["id", "name", "state"])), SCALAR, max_size=6)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(ROW, ROW.map(lambda r: {**r, "nested": ["a\x1bb", {"k\n": 1}]})), max_size=6),
       st.lists(ROW, max_size=3))
def test_a_listing_is_made_safe_to_print_as_shown_makes_it(jobs, runs):
    reply = {"now": 1.5, "more": False, "next": None, "jobs": jobs, "runs": runs, "x\x1b": "y\n"}
    assert shown_listing(reply, ("jobs", "runs")) == shown(reply)


def test_hostile_names_are_escaped_in_a_listing():
    reply = {"jobs": [{"id": 1, "name": "ok"}, {"id": 2, "name": "\x1b[2Jgone\nforged line"}], "now": 0}
    assert shown_listing(reply, ("jobs",))["jobs"][1]["name"] == "\\x1b[2Jgone\\nforged line"


def clicks(options, argv):
    """What click passes to the command for argv (or its exception)."""
    got = {}

    def record(**kw):
        got.update(kw)
    try:
        command_of(record, options).main(args=list(argv), prog_name="x", standalone_mode=False)
    except click.ClickException as exc:
        return type(exc).__name__
    return got


TOKENS = ["-h", "--noheader", "-o", "%i|%T", "-o%.18i", "--format=%i", "--format", "-t", "PD", "-tR,PD", "--states=all",
          "-u", "root", "--user=a,b", "-l", "-hl", "--long", "-a", "--me", "-s", "-s12.0", "-v", "-vv", "--start",
          "-O", "jobid:10,state", "-M", "c", "-j", "12", "-", "--", "x", "-o", "", "--format=", "-z", "--long=1",
          "-P", "-X", "-n", "--name", "a", "-r", "-S", "2026-01-01", "-E", "now", "-p", "--parsable", "-e"]


@pytest.mark.parametrize("options", [squeue.OPTIONS, sacct.OPTIONS], ids=["squeue", "sacct"])
@settings(max_examples=400, deadline=None)
@given(argv=st.lists(st.sampled_from(TOKENS), max_size=6))
def test_the_fast_parse_gives_what_click_gives_or_leaves_it_to_click(options, argv):
    fast = parse_simple(options, argv)
    if fast is not None:
        assert fast == clicks(options, argv)


def test_the_common_forms_are_parsed_fast():
    assert parse_simple(squeue.OPTIONS, ["-h", "-o", "%i|%T"])["fmt"] == "%i|%T"
    assert parse_simple(squeue.OPTIONS, []) is not None
    assert parse_simple(sacct.OPTIONS, ["-P", "-o", "JobID,State,Elapsed"])["fmt"] == "JobID,State,Elapsed"
    assert parse_simple(squeue.OPTIONS, ["--help"]) is None and parse_simple(squeue.OPTIONS, ["-hl"]) is None


def test_an_option_table_is_checked():
    with pytest.raises(ValueError):
        Option(("-x",), "x", "list", None)


def test_sacct_asks_for_every_job_key_it_prints():
    """sacct asks the controller for ACCT_JOB_KEYS of each job, not the whole row: every field of
    every row (a pending job, a requeued job with a live run and its steps, an array task) must
    read the same from those keys as from the whole job."""
    from hai_cluster.cli.acctrows import ACCT_JOB_KEYS, rows_for

    def job(i, state, **kw):
        return {"id": i, "state": state, "submit_time": 100.0 + i, "user": f"u{i}", "uid": 1000 + i, "gid": 7,
                "name": f"n{i}", "partition": "p", "account": "acct", "exit_code": 3, "exit_signal": 9,
                "end_time": None, "restart_count": 2, "reason": "Priority", "array_job_id": None,
                "array_task_id": None, "cpus_per_task": 3, "tasks_per_node": 2, "nodes": 2, "interactive": False, "overcommit": False,
                "mem_mb": 512, "time_limit": 3600, "priority": "urgent", "qos": "high", "constraint": "a100",
                "start_time": 150.0, "gpus_per_node": 1, "nodelist": "a,b", "attained_gpu_seconds": 5.0,
                "code": "R", "level": 1, "hold": False, "attempts": 2, "version": 4, **kw}

    def run(i, job_id, attempt, **kw):
        return {"id": i, "job_id": job_id, "attempt": attempt, "state": "PREEMPTED", "start_time": 120.0,
                "end_time": 130.0, "exit_code": 0, "exit_signal": 15, "nodelist": "a,b", "gpus": 2, "reason": "x",
                "cpu_seconds": 40.0, "max_rss_kb": 2048, "ave_rss_kb": 1024, "gpu_charge": None,
                "account": "acct", "name": "n", "user": "u", "partition": "p", **kw}
    jobs = [job(1, "PENDING", start_time=None, nodelist=None), job(2, "RUNNING"),
            job(3, "COMPLETED", array_job_id=3, array_task_id=4, end_time=200.0, interactive=True)]
    runs = [run(10, 2, 0), run(11, 2, 1, state="RUNNING", end_time=None), run(12, 3, 0, state="COMPLETED")]
    steps = [{"run_id": 11, "step_id": 0, "name": "python", "state": "RUNNING", "exit_code": None,
              "exit_signal": None, "start_time": 160.0, "end_time": None, "nodelist": "a", "cpus": 3, "ntasks": 2}]

    def cells(job_keys):
        reply = {"now": 300.0, "runs": [dict(r) for r in runs], "steps": steps,
                 "jobs": [{k: j[k] for k in (job_keys or j)} for j in jobs]}
        by_id = {j["id"]: j for j in reply["jobs"]}
        rows = rows_for(reply, True)
        for r in rows:
            r["job"] = by_id.get(r["job_id"], {})
        return [[str(get(r)) for _w, _n, get in sacct.FIELDS.values()] for r in rows]
    assert cells(ACCT_JOB_KEYS) == cells(None)
    assert len(cells(None)) == 7  # the pending job; two runs of job 2, a batch step each, a step; job 3's run
