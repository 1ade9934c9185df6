"""Partitions with limits through the CLI: the default marked '*' in hinfo, max_time and allowed
users enforced at submission, and -p a,b starting in whichever partition can start the job first."""
from __future__ import annotations

import pytest

from .harness import OTHER_USER, TEST_USER, start_local_cluster, start_ssh_cluster, user_dir, wait_for

LIMITS = f"""
[[partitions]]
name = "gpu"
default = true
[[partitions]]
name = "short"
max_time = "10:00"
[[partitions]]
name = "private"
allowed_users = ["{OTHER_USER}"]
"""


@pytest.fixture(scope="module")
def cluster():
    c = start_local_cluster(controller_toml=LIMITS)
    yield c
    c.close()


def test_default_partition_is_marked_in_hinfo_with_time_limits(cluster):
    rows = {r.split()[0]: r.split() for r in cluster.cli("hinfo", "-h").stdout.splitlines()}
    assert rows["gpu*"][1:3] == ["up", "UNLIMITED"]
    assert rows["short"][1:3] == ["up", "10:00"]
    j = cluster.submit("--hold", "--wrap", "true")
    assert cluster.job(j)["partition"] == "gpu"
    cluster.cli("hcancel", str(j))


def test_time_limit_over_the_partition_max_time_is_refused(cluster):
    before = cluster.job_ids()
    res = cluster.cli("hsubmit", "-p", "short", "-t", "20:00", "--wrap", "true", check=False)
    assert res.returncode != 0
    assert "Requested time limit is invalid" in res.stderr and "MaxTime=10:00 of partition short" in res.stderr
    assert cluster.job_ids() == before
    j = cluster.submit("-p", "short", "--hold", "--wrap", "true")  # no -t: the partition's MaxTime
    assert cluster.cli("hqueue", "-h", "-j", str(j), "-o", "%l").stdout.strip() == "10:00"
    cluster.cli("hcancel", str(j))
    # moved into the partition later: its MaxTime applies as at submission (fifth audit: the job
    # kept an unlimited time limit in a partition with MaxTime)
    moved = cluster.submit("--hold", "--wrap", "true")
    cluster.cli("hcontrol", "update", f"JobId={moved}", "Partition=short")
    assert (cluster.job(moved)["partition"], cluster.job(moved)["time_limit"]) == ("short", 600)
    over = cluster.submit("--hold", "-t", "20:00", "--wrap", "true")
    res = cluster.cli("hcontrol", "update", f"JobId={over}", "Partition=short", check=False)
    assert res.returncode != 0 and "MaxTime=10:00 of partition short" in res.stderr
    assert (cluster.job(over)["partition"], cluster.job(over)["time_limit"]) == ("gpu", 1200)
    cluster.cli("hcancel", str(moved), str(over))


def test_user_not_allowed_in_a_partition_is_refused(cluster):
    before = cluster.job_ids()
    res = cluster.cli("hsubmit", "-p", "private", "--wrap", "true", check=False)
    assert res.returncode != 0 and f"Access/permission denied: user {TEST_USER} may not use partition private" in res.stderr
    assert cluster.job_ids() == before
    mine = cluster.submit("-p", "private", "-o", "/dev/null", "--wrap", "true", user=OTHER_USER)
    assert cluster.wait_state(mine, "COMPLETED", "FAILED")["state"] == "COMPLETED"
    # a list keeps the partitions that take the job
    listed = cluster.submit("-p", "private,gpu", "--hold", "--wrap", "true")
    assert cluster.job(listed)["partition"] == "gpu"
    cluster.cli("hcancel", str(listed))


def test_unknown_partition_is_refused(cluster):
    res = cluster.cli("hsubmit", "-p", "gpu,nope", "--wrap", "true", check=False)
    assert res.returncode != 0 and "invalid partition specified: nope" in res.stderr


def test_job_in_two_partitions_starts_in_whichever_has_room_first(ssh_nodes):
    names = [n.name for n in ssh_nodes]
    tables = (f'[[partitions]]\nname = "a"\nnodes = ["{names[0]}"]\n'
              f'[[partitions]]\nname = "b"\nnodes = ["{names[1]}"]\n')
    c = start_ssh_cluster(ssh_nodes, gpus_per_node=2, controller_toml=tables)
    try:
        flag = user_dir(c.workdir, TEST_USER) / "free-a"
        busy = c.submit("-p", "a", "--gpus-per-node=2", "-o", "/dev/null", "--wrap",
                        f"while [ ! -e {flag} ]; do sleep 0.1; done")
        c.wait_state(busy, "RUNNING")
        out = user_dir(c.workdir, TEST_USER) / "either.out"
        either = c.submit("-p", "a,b", "--gpus-per-node=2", "-o", str(out), "--wrap", "echo $SLURM_JOB_PARTITION")
        done = c.wait_state(either, "COMPLETED", "FAILED")
        assert (done["state"], done["partition"], done["nodelist"]) == ("COMPLETED", "b", names[1])
        assert out.read_text().strip() == "b"
        flag.touch()
        c.wait_state(busy, "COMPLETED")
        first = c.submit("-p", "b,a", "--hold", "--wrap", "true")
        assert c.cli("hqueue", "-h", "-j", str(first), "-o", "%P").stdout.strip() == "b,a"
        c.cli("hcontrol", "release", str(first))
        assert c.wait_state(first, "COMPLETED", "FAILED")["partition"] == "b"  # both free: the first listed
    finally:
        c.close()
