"""A step's name, end state and exit code as sacct shows them, and hacct's and hqueue -s's rows."""
from hai_cluster.cli.hacct import rows_for
from hai_cluster.cli.hqueue import parse_steps, step_rows
from hai_cluster.cli.srun import step_outcome
from hai_cluster.core.steps import step_end_state, step_name

import click
import pytest


def test_a_step_is_named_for_its_command():
    assert step_name(["/usr/bin/python3", "train.py"]) == "python3"
    assert step_name(["torchrun", "--nproc-per-node=8"]) == "torchrun"
    assert step_name(["./bin/"]) == "bin"


def test_end_state_and_outcome():
    assert step_end_state(0, None, False) == "COMPLETED"
    assert step_end_state(3, None, False) == "FAILED"
    assert step_end_state(0, 9, False) == "FAILED"
    assert step_end_state(0, None, True) == "CANCELLED"
    assert step_outcome([(0, None), (3, None), (1, None)]) == (3, None)
    assert step_outcome([(0, None), (None, 9)]) == (0, 9)
    assert step_outcome([]) == (0, None)


def reply(run_state="COMPLETED", end=20.0):
    job = {"id": 12, "array_job_id": None, "array_task_id": None, "name": "train", "partition": "gpu", "user": "u",
           "state": run_state, "exit_code": 0, "exit_signal": None, "end_time": end, "submit_time": 1.0,
           "restart_count": 0, "reason": None, "nodes": 2, "tasks_per_node": 2, "cpus_per_task": 3}
    run = {"id": 5, "job_id": 12, "attempt": 0, "state": run_state, "start_time": 2.0, "end_time": end,
           "exit_code": 0, "exit_signal": None, "nodelist": "n1,n2", "gpus": 4, "account": "lab", "name": "train",
           "user": "u", "partition": "gpu"}
    step = {"run_id": 5, "step_id": 0, "name": "python", "state": "FAILED", "exit_code": 3, "exit_signal": None,
            "start_time": 3.0, "end_time": 9.0, "nodelist": "n1,n2", "cpus": 12}
    return {"now": 30.0, "jobs": [job], "runs": [run], "steps": [step]}


def test_hacct_rows_follow_each_run_with_its_batch_and_numbered_steps():
    rows = rows_for(reply())
    assert [(r.get("step"), r["name"], r["state"], r["nodelist"], r["cpus"]) for r in rows] == [
        (None, "train", "COMPLETED", "n1,n2", 12), ("batch", "batch", "COMPLETED", "n1", 6),
        (0, "python", "FAILED", "n1,n2", 12)]
    assert rows[2]["partition"] == "" and rows[2]["exit_code"] == 3
    assert [r.get("step") for r in rows_for(reply(), with_steps=False)] == [None]
    # the time limit's signal ended the batch script: its step was cancelled, the job timed out
    assert [r["state"] for r in rows_for(reply("TIMEOUT"))][:2] == ["TIMEOUT", "CANCELLED"]


def test_hqueue_steps_list_numbered_steps_then_the_batch_step():
    jobs = [{"id": 7, "array_job_id": 6, "array_task_id": 1, "name": "j", "user": "u", "partition": "gpu",
             "start_time": 100.0, "nodelist": "n2,n3"},
            {"id": 8, "array_job_id": None, "array_task_id": None, "name": "k", "user": "u", "partition": "gpu",
             "start_time": None, "nodelist": ""}]
    steps = [{"job_id": 7, "step_id": 0, "name": "python", "start_time": 110.0, "nodelist": "n2,n3"}]
    rows = step_rows({"jobs": jobs, "steps": steps})
    assert [(r["step"], r["step_name"], r["step_nodes"]) for r in rows] == [
        (0, "python", "n[2-3]"), ("batch", "batch", "n2")]


def test_step_lists():
    assert parse_steps("12.0,13.batch,6_1.01") == {("12", "0"), ("13", "batch"), ("6_1", "1")}
    for bad in ("12", "12.x", ".0"):
        with pytest.raises(click.BadParameter, match="Invalid job step id"):
            parse_steps(bad)
