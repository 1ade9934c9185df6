"""sprio's output and options, line for line as Slurm 22.05's sprio printed them on this machine (the
peer, multifactor with PriorityWeightAge=1000, PriorityWeightFairshare=10000, PriorityWeightQOS=1000;
its values here are ours): default and -l/-n/-w columns, -o with widths, literal text and wrong
letters, -S, and getopt's parsing and messages."""
from __future__ import annotations

import pytest

from hai_cluster.cli.gnu_getopt import GetoptError, getopt_long
from hai_cluster.cli.sprio import LONG_OPTIONS
from hai_cluster.cli.spriofmt import (LETTERS, LONG_FORMAT, LONG_NORM_FORMAT, SortError, default_format,
                                      parse_format, render, sort_rows)

PEER_WEIGHTS = {"age": 1000, "fairshare": 10000, "qos": 1000, "jobsize": 0, "partition": 0, "assoc": 0}


def row(job_id, priority, *, nice=0, age=0.0, fairshare=0.0, qos=0.0, level=0, user="root", partition="gpu"):
    return {"job_id": job_id, "user": user, "partition": partition, "priority": priority, "level": level,
            "age": age, "fairshare": fairshare, "qos": qos, "nice": nice}


# the peer's four pending jobs: 3 had nice -20 (PRIORITY 20), 5 nice 50 (PRIORITY clamped to 1)
PEER_ROWS = [row(2, 1), row(3, 20, nice=-20), row(4, 1, nice=10), row(5, 1, nice=50)]


def lines(fmt, rows=PEER_ROWS, weights=PEER_WEIGHTS, *, header=True, weights_line=False):
    columns, errors = parse_format(fmt, LETTERS)
    return render(columns, rows, weights, header=header, weights_line=weights_line), errors


def test_default_columns_leave_out_factors_without_weight():
    fmt = default_format(normalized=False, long_=False, users=False, cluster=False, weights=PEER_WEIGHTS,
                         level=False)
    assert fmt == "%.15i %9r %.10Y %.10S %.10A %.10F %.10Q"
    out, _ = lines(fmt, PEER_ROWS[:2])
    assert out == ["          JOBID PARTITION   PRIORITY       SITE        AGE  FAIRSHARE        QOS",
                   "              2 gpu                1          0          0          0          0",
                   "              3 gpu               20          0          0          0          0"]
    assert lines(fmt, weights_line=True)[0][1] == (
        "        Weights                               1       1000      10000       1000")
    users = default_format(normalized=False, long_=False, users=True, cluster=False, weights=PEER_WEIGHTS,
                           level=False)
    assert lines(users, [])[0] == [
        "          JOBID PARTITION     USER   PRIORITY       SITE        AGE  FAIRSHARE        QOS"]


def test_our_level_column_ends_the_default_under_the_mlfq():
    fmt = default_format(normalized=False, long_=False, users=False, cluster=False, weights=PEER_WEIGHTS,
                         level=True)
    out, _ = lines(fmt, [row(7, 2, level=1)])
    assert out == ["          JOBID PARTITION   PRIORITY       SITE        AGE  FAIRSHARE        QOS LEVEL",
                   "              7 gpu                2          0          0          0          0     1"]


def test_long_and_normalized_columns():
    out, _ = lines(LONG_FORMAT, [PEER_ROWS[3]])
    assert out == [
        "          JOBID PARTITION     USER   PRIORITY       SITE        AGE      ASSOC  FAIRSHARE    JOBSIZE  PARTITION"
        "        QOS        NICE                 TRES",
        "              5 gpu           root          1          0          0          0          0          0          0"
        "          0          50                     "]
    assert lines(LONG_FORMAT, weights_line=True)[0][1] == (
        "        Weights                                        1       1000          0      10000          0          0"
        "       1000                           (null)")
    out, _ = lines(LONG_NORM_FORMAT, [PEER_ROWS[0]])
    assert out == [
        "          JOBID PARTITION     USER PRIORITY   AGE        ASSOC      FAIRSHARE  JOBSIZE    PARTITION  QOS      "
        "  TRES                ",
        "              2 gpu           root 0.00000000 0.0000000  0.0000000  0.0000000  0.0000000  0.0000000  0.0000000"
        "                      "]
    norm = default_format(normalized=True, long_=False, users=False, cluster=False, weights=PEER_WEIGHTS, level=False)
    assert lines(norm, [PEER_ROWS[0]])[0] == [
        "          JOBID PARTITION PRIORITY   AGE        FAIRSHARE  QOS       ",
        "              2 gpu       0.00000000 0.0000000  0.0000000  0.0000000 "]
    assert lines(norm, weights_line=True)[0][1] == "        Weights                      1000       10000      1000      "


def test_normalized_priority_is_over_two_to_the_32_and_factors_over_their_weight():
    out, _ = lines("%i %a %f %q %y %j %p", [row(2, 1, age=0.25, fairshare=0.5, qos=1 / 3)])
    assert out == ["JOBID AGE FAIRSHARE QOS PRIORITY JOBSIZE PARTITION",
                   "2 0.2500000 0.5000000 0.3333333 0.00000000023283 0.0000000 0.0000000"]
    assert lines("%.3i|%3r|%.20y", [PEER_ROWS[1]])[0][1] == "  3|gpu|    0.00000000465661"


def test_format_text_percent_and_wrong_letters_as_sprio():
    assert lines("%i|%Y|%r|%u|%N", PEER_ROWS[3:])[0] == ["JOBID|PRIORITY|PARTITION|USER|NICE", "5|1|gpu|root|50"]
    assert lines("x%i y%.5Y z", PEER_ROWS[:1])[0] == ["xJOBID yPRIOR z", "x2 y    1 z"]
    assert lines("%5i%Y", PEER_ROWS[:1])[0] == ["JOBIDPRIORITY", "2    1"]
    assert lines("%i %z %Y", PEER_ROWS[:1]) == (["JOBID PRIORITY", "2 1"], ["Invalid job format specification: z"])
    assert lines("%i %% %Y", PEER_ROWS[:1]) == (["JOBID PRIORITY", "2 1"], ["Invalid job format specification:  "])
    assert lines("%.3i|%3r|%-5Y|%.20y", PEER_ROWS[:1])[1] == ["Invalid job format specification: -"]
    assert lines("%i %5", PEER_ROWS[:1]) == (["JOBID ", "2 "], ["Invalid job format specification: "])
    assert lines("%i%", PEER_ROWS[:1])[0] == ["JOBID", "2"]
    assert lines("", PEER_ROWS[:2])[0] == ["", "", ""]
    assert lines("abc", PEER_ROWS[:2])[0] == ["abc", "abc", "abc"]
    assert lines("%i %c %S %b %B %t %T %j %J %p %P", PEER_ROWS[:1])[0] == [
        "JOBID CLUSTER SITE ASSOC ASSOC TRES TRES JOBSIZE JOBSIZE PARTITION PARTITION",
        "2 (null) 0 0.0000000 0   0.0000000 0 0.0000000 0"]
    assert lines("%i %r %N %y %Y %S %u|", weights_line=True)[0][1] == "Weights     1 |"


def ids(spec):
    return [r["job_id"] for r in sort_rows(PEER_ROWS, spec, PEER_WEIGHTS)]


def test_sort_as_sprio_from_the_last_letter():
    assert ids(None) == ids("+i") == [2, 3, 4, 5]
    assert ids("-i") == [5, 4, 3, 2]
    assert ids("-y") == [3, 2, 4, 5]  # the peer's order: equal ones stay in id order
    assert ids("y") == [2, 4, 5, 3]
    assert ids("y,-i") == [5, 4, 2, 3]
    assert ids("-N,i") == [5, 4, 2, 3]
    with pytest.raises(SortError, match="^Invalid sort specification: x$"):
        ids("x")


def parse(*argv):
    return getopt_long("sprio", list(argv), "hj::lM:no:S:p:u:vVw", LONG_OPTIONS)


def test_getopt_as_glibc():
    assert parse("-j2", "-hl", "-o", "%i", "--sort=-y") == ([("j", "2"), ("h", None), ("l", None), ("o", "%i"),
                                                             ("S", "-y")], [])
    assert parse("-j", "2", "3") == ([("j", None)], ["2", "3"])  # an optional argument is attached or absent
    assert parse("3", "-j") == ([("j", None)], ["3"])  # operands after the options
    assert parse("--nor", "--users", "a", "--jobs=") == ([("n", None), ("u", "a"), ("j", "")], [])
    assert parse("--", "-j", "2") == ([], ["-j", "2"])
    assert parse("--h") == ([("help", None)], [])  # the only option that starts so
    for argv, message in [
            (["-x"], "sprio: invalid option -- 'x'"),
            (["-o"], "sprio: option requires an argument -- 'o'"),
            (["--foo=1"], "sprio: unrecognized option '--foo=1'"),
            (["--us"], "sprio: option '--us' is ambiguous; possibilities: '--user' '--usage'"),
            (["--norm=3"], "sprio: option '--norm' doesn't allow an argument"),
            (["--format"], "sprio: option '--format' requires an argument")]:
        with pytest.raises(GetoptError) as exc:
            parse(*argv)
        assert str(exc.value) == message
