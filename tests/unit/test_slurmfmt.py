"""Slurm's output formats, line for line as Slurm 22.05 printed them on this machine (the peer:
squeue -o/-O, sinfo's %#P, sacct's columns)."""
from __future__ import annotations

import pytest

from hai_cluster.cli.slurmfmt import Field, FormatError, parse_letters, parse_names, render, sacct_lines, slurm_bytes

KNOWN = set("ijTtPu")


def test_squeue_o_with_widths_and_literal_text():
    cols = parse_letters("%.18i|%T|%j", KNOWN)
    assert render(cols, ["JOBID", "STATE", "NAME"], [["10", "PENDING", "big"]]) == [
        "             JOBID|STATE|NAME",
        "                10|PENDING|big",
    ]


def test_squeue_o_left_width_prefix_cut_and_percent():
    # squeue -o "x%5i y%.3j z%%" printed exactly these
    cols = parse_letters("x%5i y%.3j z%%", KNOWN)
    lines = render(cols, ["JOBID", "NAME"], [["10", "big"], ["8", "averyveryverylongname"]])
    assert lines == ["xJOBID yNAM z", "x10    ybig z", "x8     yave z"]


def test_squeue_o_no_width_is_the_whole_value_and_no_header():
    cols = parse_letters("%i|%T", KNOWN)
    assert render(cols, ["JOBID", "STATE"], [["10", "PENDING"]], header=False) == ["10|PENDING"]


def test_squeue_O_names_twenty_wide_by_default():
    cols = parse_names("jobid,state,name:5,reason", {"jobid", "state", "name", "reason"})
    lines = render(cols, ["JOBID", "STATE", "NAME", "REASON"], [["8", "RUNNING", "averyveryverylongname", "None"]])
    assert lines == ["JOBID               STATE               NAME REASON              ",
                     "8                   RUNNING             averyNone                "]
    right = parse_names("nodelist:.8", {"nodelist"})
    assert render(right, ["NODELIST"], [["n[1-4]"]]) == ["NODELIST", "  n[1-4]"]


def test_unknown_fields_are_named():
    with pytest.raises(FormatError, match="Invalid job format specification: Z"):
        parse_letters("%i %Z", KNOWN)
    with pytest.raises(FormatError, match="Invalid job format specification: bogus"):
        parse_names("jobid,bogus", {"jobid"})
    with pytest.raises(FormatError, match="no fields"):
        parse_letters("just text", KNOWN)


def test_sacct_columns_rule_and_cut_with_plus():
    fields = [Field("JobID", -12), Field("JobName", 10), Field("AllocCPUS", 10, number=True), Field("ExitCode", 8)]
    lines = sacct_lines(fields, [["12", "averyveryverylongname", "16", "0:0"], ["12.batch", "batch", "1", "0:0"]])
    assert lines == [
        "JobID           JobName  AllocCPUS ExitCode ",
        "------------ ---------- ---------- -------- ",
        "12           averyvery+         16      0:0 ",
        "12.batch          batch          1      0:0 ",
    ]


def test_sacct_parsable_forms():
    fields = [Field("JobID", -12), Field("State", 10)]
    rows = [["12", "CANCELLED by 1000"]]
    assert sacct_lines(fields, rows, parsable="P") == ["JobID|State", "12|CANCELLED by 1000"]
    assert sacct_lines(fields, rows, parsable="p", header=False) == ["12|CANCELLED by 1000|"]


@pytest.mark.parametrize("n,shown", [(None, ""), (0, "0"), (1000, "1000"), (4096, "4K"), (12345 * 1024, "12345K"),
                                     (512 << 20, "512M"), (2560 << 10, "2.50M"), (3 << 29, "1.50G")])
def test_sizes_as_sacct_prints_maxrss(n, shown):
    """Slurm's convert_num_unit with CONVERT_NUM_UNIT_EXACT, from bytes: up a unit while nothing
    but a half would be lost."""
    assert slurm_bytes(n) == shown
