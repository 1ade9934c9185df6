"""hcontrol requeuehold and update JobId= through the CLI on a real (local) cluster, and time
limits that count each run's wall time only (time spent preempted does not count)."""
from __future__ import annotations

from pathlib import Path

import pytest

from .harness import TEST_USER, start_local_cluster, user_dir, wait_for

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = {"HAI_EXAMPLES": str(REPO / "examples")}


@pytest.fixture(scope="module")
def cluster():
    c = start_local_cluster(controller_toml='partitions = ["gpu", "debug"]')
    yield c
    c.close()


def started(cluster, name: str) -> tuple[Path, str]:
    """A file the job creates once its script runs (RUNNING is recorded a little earlier)."""
    mark = user_dir(cluster.workdir, TEST_USER) / name
    return mark, f"touch {mark}; sleep 1000"


def test_requeuehold_requeues_and_holds_until_released(cluster):
    mark, cmd = started(cluster, "rqh-user")
    j = cluster.submit("-o", "/dev/null", "--wrap", cmd)
    wait_for(mark.exists, 30, what="the job to run")
    cluster.cli("hcontrol", "requeuehold", str(j))
    wait_for(lambda: cluster.job(j)["reason"] == "JobHeldUser", 30, what="the job to be requeued and held")
    job = cluster.job(j)
    assert (job["state"], job["restart_count"], [r["state"] for r in job["runs"]]) == ("PENDING", 1, ["REQUEUED"])
    assert "requeued and held by haitest" in job["runs"][0]["reason"]
    cluster.cli("hcontrol", "release", str(j))
    cluster.wait_state(j, "RUNNING")
    cluster.cli("hcancel", str(j))
    cluster.wait_state(j, "CANCELLED")


def test_requeuehold_by_an_admin_is_not_releasable_by_the_user(cluster):
    mark, cmd = started(cluster, "rqh-admin")
    j = cluster.submit("-o", "/dev/null", "--wrap", cmd)
    wait_for(mark.exists, 30, what="the job to run")
    cluster.cli("hcontrol", "requeuehold", str(j), user="root")
    wait_for(lambda: cluster.job(j)["reason"] == "JobHeldAdmin", 30, what="JobHeldAdmin")
    res = cluster.cli("hcontrol", "release", str(j), check=False)
    assert res.returncode != 0 and "held by an administrator" in res.stderr
    cluster.cli("hcontrol", "release", str(j), user="root")
    cluster.wait_state(j, "RUNNING")
    cluster.cli("hcancel", str(j))
    cluster.wait_state(j, "CANCELLED")


def test_update_pending_job_time_limit_partition_and_dependency(cluster):
    target = cluster.submit("-o", "/dev/null", "--wrap", "true")
    j = cluster.submit("--hold", "-t", "30:00", "--wrap", "true")
    cluster.cli("hcontrol", "update", f"JobId={j}", "TimeLimit=10:00")
    assert cluster.job(j)["time_limit"] == 600
    res = cluster.cli("hcontrol", "update", f"JobId={j}", "TimeLimit=1:00:00", check=False)
    assert res.returncode != 0 and "only an administrator may raise the time limit" in res.stderr
    res = cluster.cli("hcontrol", "update", f"JobId={j}", "TimeLimit=UNLIMITED", check=False)
    assert res.returncode != 0 and "Access/permission denied" in res.stderr
    cluster.cli("hcontrol", "update", f"JobId={j}", "TimeLimit=2:00:00", user="root")
    cluster.cli("hcontrol", "update", f"JobId={j}", "Partition=debug", f"Dependency=afterany:{target}")
    job = cluster.job(j)
    assert (job["time_limit"], job["partition"], job["spec"]["time_limit"]) == (7200, "debug", 7200)
    assert f"Dependency=afterany:{target}" in cluster.cli("hcontrol", "show", "job", str(j)).stdout
    for assignment, message in [("Partition=nope", "invalid partition specified: nope"),
                                ("Dependency=afterok:999999", "no such job 999999"),
                                ("TimeLimit=abc", "Invalid TimeLimit=abc"),
                                # eighth audit: an internal error (past SQLite's INTEGER) before
                                ("TimeLimit=99999999999999999999", "longer than 2147483647 seconds"),
                                ("Nodes=3", "unknown field Nodes"),
                                (f"Dependency=afterany:{j}", "cannot depend on itself")]:
        res = cluster.cli("hcontrol", "update", f"JobId={j}", assignment, check=False)
        assert res.returncode != 0 and message in res.stderr, (assignment, res.stderr)
    cluster.cli("hcontrol", "update", f"JobId={j}", "Dependency=")
    assert cluster.job(j)["dependency"] is None
    res = cluster.cli("hcontrol", "update", f"JobId={j}", "TimeLimit=5:00", user="haiother", check=False)
    assert res.returncode != 0 and "Access/permission denied" in res.stderr
    cluster.cli("hcontrol", "release", str(j))
    cluster.wait_state(j, "COMPLETED")
    res = cluster.cli("hcontrol", "update", f"JobId={j}", "TimeLimit=5:00", check=False)
    assert res.returncode != 0 and "only a pending job can be updated" in res.stderr


def test_time_spent_preempted_does_not_count_against_the_time_limit(cluster):
    """16 steps of 0.5 s under a 20 s limit, preempted after a few steps and kept waiting 25 s by a
    higher-priority job: well over 20 s pass between its first start and its end, yet it completes."""
    script = str(REPO / "examples" / "train_loop.sh")
    j = cluster.submit("--gpus-per-node=2", "-t", "0:20", "--grace=10", "-o", "limit-%j.out", script, "16", "0.5", "1",
                       env=EXAMPLES)
    steps = user_dir(cluster.workdir, TEST_USER) / ".hai" / "checkpoints" / str(j) / "steps.log"
    wait_for(lambda: steps.exists() and len(steps.read_text().splitlines()) >= 4, 60, what="a few steps")
    blocker = cluster.submit("--gpus-per-node=2", "--priority=high", "-o", "/dev/null", "--wrap", "sleep 25")
    cluster.cli("hcontrol", "preempt", str(j), user="root")
    done = cluster.wait_state(j, "COMPLETED", "FAILED", "TIMEOUT", "CANCELLED", timeout=120)
    runs = done["runs"]
    assert [r["state"] for r in runs] == ["PREEMPTED", "COMPLETED"], runs
    assert cluster.job(blocker)["state"] == "COMPLETED"
    assert runs[-1]["start_time"] >= cluster.job(blocker)["end_time"]  # it really waited behind the blocker
    assert runs[-1]["end_time"] - runs[0]["start_time"] > 20 + 5
    assert "done: steps=16" in (user_dir(cluster.workdir, TEST_USER) / f"limit-{j}.out").read_text()
