import pytest

from hai_cluster.core.patterns import NO_VAL, expand_output_pattern, resolve_output_path

JOB = dict(job_id=42, job_name="train", user="alice", node="gpu03", restart_count=2)


@pytest.mark.parametrize("pattern, expected", [
    ("plain.log", "plain.log"),
    ("%j.out", "42.out"),
    ("%J.out", "42.out"),
    ("%x-%j.out", "train-42.out"),
    ("%u/%x", "alice/train"),
    ("%N.log", "gpu03.log"),
    ("run%r.log", "run2.log"),
    ("%4j", "0042"),
    ("%1j", "42"),
    ("%04j", "0042"),
    ("%3r", "002"),
    ("%15j", "0000000042"),  # at most 10 wide, as in Slurm
    ("x%" + "9" * 4400 + "j", "x0000000042"),  # sixth audit: int() of it raised and the job's dispatch failed forever
    ("%5x", "train"),  # width is ignored for text
    ("%A", "42"),  # not an array: the job id
    ("%a", str(NO_VAL)),  # not an array: Slurm's NO_VAL
    ("100%%", "100%"),
    ("%%j", "%j"),
    ("%q.out", "%q.out"),  # unknown letters stay
    ("%5q", "%5q"),
    ("50%", "50%"),
    ("a%-b", "a%-b"),
    ("%j\\%j", "%j%j"),  # a backslash turns substitution off
])
def test_expand(pattern, expected):
    assert expand_output_pattern(pattern, **JOB) == expected


def test_array_fields():
    got = expand_output_pattern("%A_%a_%3a", **JOB, array_job_id=40, array_task_id=7)
    assert got == "40_7_007"


@pytest.mark.parametrize("pattern, expected", [
    (None, "/home/alice/run/slurm-42.out"),
    ("none", "/dev/null"),
    ("NONE", "/dev/null"),
    ("logs/%x-%j.out", "/home/alice/run/logs/train-42.out"),
    ("../%j.out", "/home/alice/42.out"),
    ("/scratch//%u/./%j.err", "/scratch/alice/42.err"),
])
def test_resolve(pattern, expected):
    assert resolve_output_path(pattern, "/home/alice/run", **JOB) == expected


def test_resolve_needs_an_absolute_workdir():
    with pytest.raises(ValueError, match="workdir must be an absolute path"):
        resolve_output_path(None, "relative/dir", **JOB)


def test_default_output_is_sbatch_s():
    # sbatch: slurm-%j.out, and slurm-%A_%a.out for an array's task
    assert resolve_output_path(None, "/w", **JOB) == "/w/slurm-42.out"
    assert resolve_output_path(None, "/w", **{**JOB, "job_id": 45}, array_job_id=40, array_task_id=5) == "/w/slurm-40_5.out"
