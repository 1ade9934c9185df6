"""Job array specifications, job ids with tasks, and squeue's collapsed pending rows."""
import pytest

from hai_cluster.core.jobids import (ArrayError, JobRef, collapse_pending, format_indices, job_label, parse_array,
                                     parse_job_ref, parse_job_refs, refs_to_wire)


@pytest.mark.parametrize("text, indices, limit", [
    ("0-7", tuple(range(8)), None),
    ("1,3,5-9", (1, 3, 5, 6, 7, 8, 9), None),
    ("0-15:4", (0, 4, 8, 12), None),
    ("0-15%2", tuple(range(16)), 2),
    ("7", (7,), None),
    ("3,1,3", (1, 3), None),
    ("0-1000", tuple(range(1001)), None),
])
def test_array_specs(text, indices, limit):
    spec = parse_array(text)
    assert (spec.indices, spec.limit) == (indices, limit)
    assert parse_array(spec.text) == spec  # the canonical text reads back the same


@pytest.mark.parametrize("text, message", [
    ("5-1", "end is below the start"),
    ("0-100000", "max_array_size is 1001"),
    ("a", "invalid task index or range 'a'"),
    ("", "no task indices"),
    ("1,,2", "invalid task index"),
    ("0-9:0", "step"),
    ("0-9%0", "task limit"),
    ("0-9%x", "task limit"),
    ("0-9%99999999999999999999", "task limit"),  # past what the store holds
])
def test_bad_array_specs_name_the_problem(text, message):
    with pytest.raises(ArrayError, match=message):
        parse_array(text)


def test_max_array_size_is_configurable():
    assert parse_array("0-4999", 5000).indices[-1] == 4999
    with pytest.raises(ArrayError, match="max_array_size is 10"):
        parse_array("10", 10)


def test_format_indices_collapses_runs():
    assert format_indices([7, 0, 1, 2, 3, 9, 10]) == "0-3,7,9-10"
    assert format_indices([0, 4, 8]) == "0,4,8"


def test_job_refs():
    assert parse_job_ref("12") == JobRef(12)
    assert parse_job_ref("12_4") == JobRef(12, (4,))
    assert parse_job_ref("12_[1-3,5]") == JobRef(12, (1, 2, 3, 5))
    assert str(parse_job_ref("12_[1-3]")) == "12_[1-3]" and str(JobRef(12, (4,))) == "12_4"
    assert parse_job_refs(["12_[1,2],13", "14_0"]) == [JobRef(12, (1, 2)), JobRef(13), JobRef(14, (0,))]
    assert refs_to_wire(parse_job_refs(["12,13_1"])) == {"ids": [12], "tasks": [[13, 1]]}
    for bad in ("x", "12_", "12_[]", "12_[3-1]", "-1"):
        with pytest.raises(ArrayError, match="Invalid job id"):
            parse_job_ref(bad)


def job(i, state="PENDING", array=None, task=None, reason="Priority"):
    return {"id": i, "state": state, "array_job_id": array, "array_task_id": task, "reason": reason}


def test_pending_tasks_collapse_running_ones_do_not():
    jobs = [job(11), job(12, "RUNNING", 12, 0), job(13, "RUNNING", 12, 1), job(14, array=12, task=2),
            job(15, array=12, task=3), job(16, array=12, task=5), job(17, array=12, task=6, reason="JobHeldUser"),
            job(18)]
    assert [label for _j, label in collapse_pending(jobs)] == ["11", "12_0", "12_1", "12_[2-3,5]", "12_6", "18"]
    assert job_label(job(14, array=12, task=2)) == "12_2" and job_label(job(11)) == "11"
