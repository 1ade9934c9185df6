"""submitit (PyPI, unmodified) against the Slurm-named commands on real daemons: submit and result,
2 nodes x 2 tasks, map_array, cancel, and a Checkpointable job that the MLFQ preempts (submitit's
--signal=USR2@90 contract: it pickles itself and runs `scontrol requeue`) and that resumes."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from .harness import OTHER_USER, TEST_USER, start_ssh_cluster, user_dir, wait_for

pytest.importorskip("submitit")
DRIVER = Path(__file__).with_name("clients") / "submitit_driver.py"
# The production order (gittins) with a restart cost of 0.5 s, so that a run may be preempted
# 5 s into it (10 restart costs) for a job of a higher level.
SCHEDULER = """[scheduler]
policy = "mlfq"
restart_cost = 0.5
"""


@pytest.fixture(scope="module")
def cluster(ssh_nodes):
    c = start_ssh_cluster(ssh_nodes, gpus_per_node=2, scheduler_toml=SCHEDULER)
    # Jobs that end within seconds, as a busy cluster has seen: what it learns of job sizes (the
    # Gittins order's) then puts a fresh job ahead of a run that has had 10 s of service.
    for j in [c.submit("--gpus-per-node=1", "--wrap", "true") for _ in range(3)]:
        assert c.wait_state(j, "COMPLETED", "FAILED", timeout=60)["state"] == "COMPLETED"
    yield c
    c.close()


def drive(cluster, mode: str, *args: str) -> str:
    home = user_dir(cluster.workdir, TEST_USER)
    driver = home / "submitit_driver.py"
    shutil.copy(DRIVER, driver)
    return cluster.cli("python", str(driver), mode, str(home / "sublogs"), *args).stdout.strip()


def test_submit_and_result(cluster):
    assert drive(cluster, "add") == "add 5"


def test_two_nodes_two_tasks_each(cluster):
    # (global rank, local rank, node, tasks, nodes) of every task, as submitit reads Slurm's variables
    assert drive(cluster, "ranks") == "ranks [(0, 0, 0, 4, 2), (1, 1, 0, 4, 2), (2, 0, 1, 4, 2), (3, 1, 1, 4, 2)]"


def test_map_array(cluster):
    assert drive(cluster, "map") == "map [1, 4, 9] 1"  # one array of three tasks


def test_cancel(cluster):
    assert drive(cluster, "cancel") == "cancel CANCELLED"


def test_checkpointable_job_is_preempted_and_resumes_from_its_checkpoint(cluster):
    job = drive(cluster, "count", "150")  # 15 s of counting on every GPU of the cluster
    wait_for(lambda: cluster.job(int(job))["state"] == "RUNNING", 60, what="the submitit job to run")
    assert cluster.job(int(job))["resumes"] == "signal"  # --signal=USR2@90: it may be time-sliced
    short = cluster.submit("--gpus-per-node=2", "--wrap", "true", user=OTHER_USER)
    assert cluster.wait_state(short, "COMPLETED", timeout=90)["state"] == "COMPLETED"
    # counted to the end over two runs: the second went on from the pickled count
    assert drive(cluster, "count-result", job) == "count (150, [0, 1])"
    # the result file is written before the job's process ends: its run's end is recorded after
    assert cluster.wait_state(int(job), "COMPLETED", "FAILED", timeout=60)["state"] == "COMPLETED"
    runs = cluster.job(int(job))["runs"]
    assert [r["state"] for r in runs] == ["PREEMPTED", "COMPLETED"]
    # the stop signal reached the task once (the agent signals every process; srun does not pass
    # it on again: a second USR2 while submitit pickled the checkpoint failed the job)
    log = (user_dir(cluster.workdir, TEST_USER) / "sublogs" / f"{job}_0_log.err").read_text()
    assert log.count("Caught signal SIGUSR2") == 1, log
