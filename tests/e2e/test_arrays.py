"""Job arrays through the CLI on a real (local) cluster: --array in every form, the array
variables and %A/%a, the task limit, hqueue's collapsed rows, and hcancel/hcontrol/hacct by task."""
from __future__ import annotations

import shutil

import pytest

from .harness import TEST_USER, start_local_cluster, user_dir, wait_for


@pytest.fixture(scope="module")
def cluster():
    c = start_local_cluster(controller_toml="max_array_size = 64")
    yield c
    c.close()


def tasks_of(cluster, array_id: int) -> dict[int, dict]:
    return {j["array_task_id"]: j for j in cluster.call("jobs", {"ids": [array_id], "all": True})["jobs"]}


def wait_all(cluster, array_id: int, *states: str, timeout: float = 90) -> dict[int, dict]:
    final = states or ("COMPLETED", "FAILED", "CANCELLED")
    return wait_for(lambda: (t := tasks_of(cluster, array_id)) and all(j["state"] in final for j in t.values()) and t,
                    timeout, 0.2, f"array {array_id} to end")


def test_array_tasks_get_array_variables_and_output_patterns(cluster):
    home = user_dir(cluster.workdir, TEST_USER)
    array_id = cluster.submit("--array=0-15:4", "-o", "arr-%A_%a.out", "--wrap",
                              "echo $HAI_ARRAY_JOB_ID $HAI_ARRAY_TASK_ID $SLURM_ARRAY_JOB_ID $SLURM_ARRAY_TASK_ID "
                              "$HAI_ARRAY_TASK_COUNT $SLURM_ARRAY_TASK_MIN $SLURM_ARRAY_TASK_MAX $SLURM_JOB_ID")
    done = wait_all(cluster, array_id)
    assert sorted(done) == [0, 4, 8, 12]
    assert all(j["state"] == "COMPLETED" for j in done.values())
    assert done[0]["id"] == array_id  # the first task's id is the array's
    for task, job in done.items():
        text = (home / f"arr-{array_id}_{task}.out").read_text().split()
        assert text == [str(array_id), str(task), str(array_id), str(task), "4", "0", "12", str(job["id"])]


def test_array_from_a_directive_with_a_list_shows_in_hacct(cluster):
    home = user_dir(cluster.workdir, TEST_USER)
    (home / "list.sh").write_text("#!/bin/sh\n#SBATCH --array=1,3,5-9\n#HAI -J listed\ntrue\n")
    array_id = cluster.submit("list.sh")
    wait_all(cluster, array_id)
    ids = cluster.cli("hacct", "-X", "-j", str(array_id), "-P", "-n", "-o", "JobID,JobName,State").stdout.split()
    assert ids == [f"{array_id}_{t}|listed|COMPLETED" for t in (1, 3, 5, 6, 7, 8, 9)]
    for task in (5, 1):  # task 1 is the array's first: its job id is the array's
        one = cluster.cli("hacct", "-X", "-j", f"{array_id}_{task}", "-P", "-n", "-o", "JobID").stdout.split()
        assert one == [f"{array_id}_{task}"]


def test_array_task_limit_never_lets_more_tasks_run_at_once(cluster):
    """%1: the node has room for two CPU tasks, the limit allows one."""
    home = user_dir(cluster.workdir, TEST_USER)
    marks = home / "limit"
    marks.mkdir()
    shutil.chown(marks, TEST_USER, TEST_USER)
    array_id = cluster.submit("--array=0-3%1", "-o", "/dev/null", "--wrap",
                              f"touch {marks}/$HAI_ARRAY_TASK_ID.start; sleep 1; touch {marks}/$HAI_ARRAY_TASK_ID.end")
    seen = wait_for(lambda: "JobArrayTaskLimit" in cluster.cli("hqueue", "-r", "-j", str(array_id), "-o", "%i %t %r").stdout,
                    30, what="a task waiting for the array's limit")
    assert seen
    assert all(j["state"] == "COMPLETED" for j in wait_all(cluster, array_id).values())
    times = sorted((marks / f"{t}.start").stat().st_mtime_ns for t in range(4))
    ends = sorted((marks / f"{t}.end").stat().st_mtime_ns for t in range(4))
    for nxt, prev_end in zip(times[1:], ends):
        assert nxt >= prev_end  # each task started after the one before it ended


def test_hqueue_collapses_pending_tasks_and_expands_them_with_r(cluster):
    array_id = cluster.submit("--array=0-7", "--hold", "--wrap", "true")
    rows = cluster.cli("hqueue", "-h", "-o", "%i %t %r").stdout.splitlines()
    assert f"{array_id}_[0-7] PD JobHeldUser" in [" ".join(r.split()) for r in rows]
    expanded = [r.split()[0] for r in cluster.cli("hqueue", "-r", "-h", "-o", "%i").stdout.splitlines()]
    assert [f"{array_id}_{t}" for t in range(8)] == [r for r in expanded if r.startswith(f"{array_id}_")]
    by_j = cluster.cli("hqueue", "-j", str(array_id), "-r", "-h", "-o", "%i").stdout.split()
    assert by_j == [f"{array_id}_{t}" for t in range(8)]
    cluster.cli("hcontrol", "release", f"{array_id}_2")
    wait_for(lambda: tasks_of(cluster, array_id)[2]["state"] == "COMPLETED", 30, what="released task to run")
    rows = [" ".join(r.split()) for r in cluster.cli("hqueue", "-h", "-o", "%i %t", "-t", "PD", "-j", str(array_id)).stdout.splitlines()]
    assert rows == [f"{array_id}_[0-1,3-7] PD"]
    cluster.cli("hcancel", "--quiet", str(array_id))


def test_hold_and_release_by_array_id_act_on_every_task(cluster):
    array_id = cluster.submit("--array=0-2", "--hold", "-o", "/dev/null", "--wrap", "true")
    cluster.cli("hcontrol", "release", str(array_id))
    done = wait_all(cluster, array_id)
    assert [j["state"] for j in done.values()] == ["COMPLETED"] * 3
    res = cluster.cli("hsubmit", "-W", "--array=0-2", "-o", "/dev/null", "--wrap", 'exit "$HAI_ARRAY_TASK_ID"',
                      check=False)
    assert res.returncode == 2  # -W: the highest exit code of the tasks


def test_hcancel_one_task_a_range_or_the_whole_array(cluster):
    array_id = cluster.submit("--array=0-5", "--hold", "--wrap", "true")
    cluster.cli("hcancel", f"{array_id}_4")
    assert {t for t, j in tasks_of(cluster, array_id).items() if j["state"] == "CANCELLED"} == {4}
    cluster.cli("hcancel", f"{array_id}_[1-3]")
    assert {t for t, j in tasks_of(cluster, array_id).items() if j["state"] == "CANCELLED"} == {1, 2, 3, 4}
    bad = cluster.cli("hcancel", f"{array_id}_9", check=False)
    assert bad.returncode != 0 and f"Invalid job id specified: {array_id}_9" in bad.stderr
    cluster.cli("hcancel", str(array_id))
    assert all(j["state"] == "CANCELLED" for j in tasks_of(cluster, array_id).values())


def test_hcontrol_show_job_for_a_task_and_for_the_whole_array(cluster):
    array_id = cluster.submit("--array=0-2", "--hold", "--wrap", "true")
    one = cluster.cli("hcontrol", "show", "job", f"{array_id}_1").stdout
    assert f"ArrayJobId={array_id} ArrayTaskId=1" in one and one.count("\nJobId=") == 0 and one.startswith("JobId=")
    every = cluster.cli("hcontrol", "show", "job", str(array_id)).stdout
    assert [f"ArrayTaskId={t}" in every for t in range(3)] == [True] * 3 and every.count("\nJobId=") == 2
    cluster.cli("hcancel", str(array_id))


@pytest.mark.parametrize("value, message", [
    ("5-1", "invalid range '5-1': the end is below the start"),
    ("0-100000", "max_array_size is 64"),
    ("0-100", "max_array_size is 64"),  # the controller's configured bound
    ("a", "invalid task index or range 'a'"),
])
def test_bad_array_values_are_refused_and_submit_nothing(cluster, value, message):
    before = cluster.job_ids()
    res = cluster.cli("hsubmit", f"--array={value}", "--wrap", "true", check=False)
    assert res.returncode != 0
    assert f"--array={value}: invalid job array specification" in res.stderr and message in res.stderr
    assert cluster.job_ids() == before
