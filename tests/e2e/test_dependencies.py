"""--dependency through the CLI on a real (local) cluster: after, afterok, afternotok, afterany,
singleton, ',' and '?', array ids, unknown jobs refused, kill_invalid_depend."""
from __future__ import annotations

import pytest

from .harness import TEST_USER, start_local_cluster, user_dir, wait_for

FINAL = ("COMPLETED", "FAILED", "CANCELLED")


@pytest.fixture(scope="module")
def cluster():
    c = start_local_cluster()
    yield c
    c.close()


def gate(cluster, name: str):
    """A flag file the test creates to let a job finish, and the command that waits for it."""
    flag = user_dir(cluster.workdir, TEST_USER) / name
    return flag, f"while [ ! -e {flag} ]; do sleep 0.1; done"


def reason(cluster, job_id: int) -> str:
    return cluster.cli("hqueue", "-h", "-j", str(job_id), "-o", "%r").stdout.strip()


def test_afterok_waits_for_success_then_runs(cluster):
    flag, wait = gate(cluster, "afterok")
    first = cluster.submit("-o", "/dev/null", "--wrap", wait)
    second = cluster.submit("-o", "/dev/null", f"--dependency=afterok:{first}", "--wrap", "true")
    wait_for(lambda: reason(cluster, second) == "Dependency", 30, what="reason Dependency")
    assert cluster.job(second)["state"] == "PENDING"
    assert f"Dependency=afterok:{first}" in cluster.cli("hcontrol", "show", "job", str(second)).stdout
    flag.touch()
    assert cluster.wait_state(second, *FINAL)["state"] == "COMPLETED"
    assert cluster.job(first)["end_time"] <= cluster.job(second)["start_time"]


def test_failed_job_satisfies_afternotok_and_afterany_never_afterok(cluster):
    failed = cluster.submit("-o", "/dev/null", "--wrap", "exit 3")
    ok = cluster.submit("-o", "/dev/null", "-d", f"afterok:{failed}", "--wrap", "true")
    notok = cluster.submit("-o", "/dev/null", "-d", f"afternotok:{failed}", "--wrap", "true")
    anyway = cluster.submit("-o", "/dev/null", "-d", f"afterany:{failed}", "--wrap", "true")
    assert cluster.wait_state(notok, *FINAL)["state"] == "COMPLETED"
    assert cluster.wait_state(anyway, *FINAL)["state"] == "COMPLETED"
    wait_for(lambda: reason(cluster, ok) == "DependencyNeverSatisfied", 30, what="DependencyNeverSatisfied")
    assert cluster.job(ok)["state"] == "PENDING"  # kill_invalid_depend is off: it stays, as in Slurm
    cluster.cli("hcancel", str(ok))


def test_after_needs_only_the_start(cluster):
    flag, wait = gate(cluster, "after")
    first = cluster.submit("-o", "/dev/null", "--wrap", wait)
    second = cluster.submit("-o", "/dev/null", "-d", f"after:{first}", "--wrap", "true")
    assert cluster.wait_state(second, *FINAL)["state"] == "COMPLETED"
    assert cluster.job(first)["state"] == "RUNNING"
    flag.touch()
    cluster.wait_state(first, *FINAL)


def test_comma_needs_all_question_mark_any(cluster):
    good = cluster.submit("-o", "/dev/null", "--wrap", "true")
    bad = cluster.submit("-o", "/dev/null", "--wrap", "false")
    cluster.wait_state(good, *FINAL)
    cluster.wait_state(bad, *FINAL)
    either = cluster.submit("-o", "/dev/null", "-d", f"afterok:{bad}?afterok:{good}", "--wrap", "true")
    both = cluster.submit("-o", "/dev/null", "-d", f"afterok:{bad},afterok:{good}", "--wrap", "true")
    assert cluster.wait_state(either, *FINAL)["state"] == "COMPLETED"
    wait_for(lambda: reason(cluster, both) == "DependencyNeverSatisfied", 30, what="DependencyNeverSatisfied")
    cluster.cli("hcancel", str(both))


def test_array_dependency_waits_for_every_task_or_one(cluster):
    flag, wait = gate(cluster, "array")
    array_id = cluster.submit("-o", "/dev/null", "--array=0-1", "--wrap",
                              f'[ "$HAI_ARRAY_TASK_ID" = 0 ] || {{ {wait}; }}')
    on_all = cluster.submit("-o", "/dev/null", "-d", f"afterok:{array_id}", "--wrap", "true")
    on_one = cluster.submit("-o", "/dev/null", "-d", f"afterok:{array_id}_0", "--wrap", "true")
    assert cluster.wait_state(on_one, *FINAL)["state"] == "COMPLETED"
    assert cluster.job(on_all)["state"] == "PENDING" and reason(cluster, on_all) == "Dependency"
    flag.touch()
    assert cluster.wait_state(on_all, *FINAL)["state"] == "COMPLETED"


def test_singleton_runs_one_job_of_a_name_at_a_time(cluster):
    flag, wait = gate(cluster, "singleton")
    first = cluster.submit("-o", "/dev/null", "-J", "single", "-d", "singleton", "--wrap", wait)
    second = cluster.submit("-o", "/dev/null", "-J", "single", "-d", "singleton", "--wrap", "true")
    other_name = cluster.submit("-o", "/dev/null", "-J", "other", "-d", "singleton", "--wrap", "true")
    cluster.wait_state(first, "RUNNING")
    assert cluster.wait_state(other_name, *FINAL)["state"] == "COMPLETED"
    wait_for(lambda: reason(cluster, second) == "Dependency", 30, what="reason Dependency")
    flag.touch()
    assert cluster.wait_state(second, *FINAL)["state"] == "COMPLETED"


@pytest.mark.parametrize("value, message", [
    ("afterok:999999", "Job dependency problem: no such job 999999"),
    ("afterok:1_999", "Job dependency problem: no such job 1_999"),
    ("afterwards:1", "invalid dependency type 'afterwards'"),
])
def test_unknown_or_bad_dependency_is_refused_and_submits_nothing(cluster, value, message):
    before = cluster.job_ids()
    res = cluster.cli("hsubmit", f"--dependency={value}", "--wrap", "true", check=False)
    assert res.returncode != 0 and message in res.stderr
    assert cluster.job_ids() == before


def test_kill_invalid_depend_cancels_the_job():
    c = start_local_cluster(controller_toml="kill_invalid_depend = true")
    try:
        failed = c.submit("-o", "/dev/null", "--wrap", "false")
        waiting = c.submit("-o", "/dev/null", "-d", f"afterok:{failed}", "--wrap", "true")
        done = c.wait_state(waiting, *FINAL)
        assert (done["state"], done["reason"]) == ("CANCELLED", "DependencyNeverSatisfied")
        assert c.job(waiting)["runs"] == []
    finally:
        c.close()
