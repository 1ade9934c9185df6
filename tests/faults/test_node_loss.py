"""A node that vanishes from the network: it goes down, its runs end as NODE_FAIL and are requeued
(the checkpointing job resumes elsewhere), a gang loses all its ranks together, and when the node
comes back its leftover processes are killed before it takes new work."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.e2e.harness import TEST_USER, start_ssh_cluster, user_dir, wait_for

REPO = Path(__file__).resolve().parents[2]
CONTROLLER = "node_down_after = 4.0\nping_interval = 0.5\n"


@pytest.fixture(scope="module")
def cluster(ssh_nodes):
    c = start_ssh_cluster(ssh_nodes, gpus_per_node=2, controller_toml=CONTROLLER)
    yield c
    for n in ssh_nodes:  # whatever a test did to the links, leave them up
        subprocess.run(["ip", "link", "set", n.network.node(n.name).veth_host, "up"], check=False)
    c.close()


def cut(node, up: bool) -> None:
    subprocess.run(["ip", "link", "set", node.network.node(node.name).veth_host, "up" if up else "down"],
                   check=True)


def node_row(cluster, name):
    return next(n for n in cluster.call("nodes", {})["nodes"] if n["name"] == name)


def test_lost_node_fails_its_runs_requeues_them_and_is_cleaned_when_back(cluster, ssh_nodes):
    d = user_dir(cluster.workdir, TEST_USER)
    pidfile = d / "lost.pid"
    job = cluster.submit("--gpus-per-node=2", "--wrap", f"echo $$ >> {pidfile}; sleep 1000")
    first = cluster.wait_state(job, "RUNNING")
    node = next(n for n in ssh_nodes if n.name == first["nodelist"])
    other = next(n for n in ssh_nodes if n is not node)
    old_pid = int(wait_for(lambda: pidfile.exists() and pidfile.read_text().split()[0], 30, what="pid"))
    cut(node, up=False)
    try:
        wait_for(lambda: node_row(cluster, node.name)["state"] == "down", 60, what="node down")
        assert node_row(cluster, node.name)["reason"].startswith("Not responding")
        # The run ended NODE_FAIL; the job was requeued and runs again, on the other node.
        job_now = cluster.wait_state(job, "RUNNING", timeout=60)
        wait_for(lambda: cluster.job(job)["nodelist"] == other.name, 30, what="restart on the other node")
        runs = cluster.job(job)["runs"]
        assert runs[0]["state"] == "NODE_FAIL" and "stopped responding" in runs[0]["reason"]
        assert job_now["restart_count"] == 1
        assert "down" in cluster.cli("hinfo", "-N").stdout
        # The old process is still alive on the partitioned node (it cannot be told yet).
        assert os.path.exists(f"/proc/{old_pid}")
    finally:
        cut(node, up=True)
    # Back: the leftover is killed, then the node is up again and takes work.
    wait_for(lambda: not os.path.exists(f"/proc/{old_pid}"), 60, what="leftover process killed")
    wait_for(lambda: node_row(cluster, node.name)["state"] == "up" and node_row(cluster, node.name)["responding"],
             60, what="node back up")
    again = cluster.submit("--gpus-per-node=2", "--wrap", "hostname")
    assert cluster.wait_state(again, "COMPLETED", timeout=60)["nodelist"] == node.name
    cluster.cli("hcancel", str(job))
    cluster.wait_state(job, "CANCELLED", timeout=30)


def test_gang_loses_all_ranks_together(cluster, ssh_nodes):
    job = cluster.submit("-N", "2", "--gpus-per-node=1", "--no-requeue", "--wrap", "sleep 1000")
    cluster.wait_state(job, "RUNNING")
    cut(ssh_nodes[1], up=False)
    try:
        done = cluster.wait_state(job, "NODE_FAIL", "FAILED", "CANCELLED", timeout=60)
        assert done["state"] == "NODE_FAIL"  # --no-requeue: not requeued
        # The rank on the healthy node was stopped too: nothing of the job still holds a GPU.
        wait_for(lambda: node_row(cluster, ssh_nodes[0].name)["gpus_alloc"] == 0, 30, what="rank 0 stopped")
    finally:
        cut(ssh_nodes[1], up=True)
    wait_for(lambda: node_row(cluster, ssh_nodes[1].name)["state"] == "up", 60, what="node back")


def test_drain_and_resume(cluster, ssh_nodes):
    name = ssh_nodes[0].name
    proc = cluster.cli("hcontrol", "update", f"NodeName={name}", "State=DRAIN", user="root", check=False)
    assert proc.returncode != 0 and "reason is required" in proc.stderr
    proc = cluster.cli("hcontrol", "update", f"NodeName={name}", "State=DRAIN", "Reason=maintenance", check=False)
    assert proc.returncode != 0 and "only operators and administrators" in proc.stderr
    cluster.cli("hcontrol", "update", f"NodeName={name}", "State=DRAIN", "Reason=maintenance", user="root")
    assert node_row(cluster, name)["reason"] == "maintenance [root]"
    jobs = [cluster.submit("--gpus-per-node=1", "--wrap", "hostname") for _ in range(3)]
    for j in jobs:
        assert cluster.wait_state(j, "COMPLETED", timeout=60)["nodelist"] != name
    assert "drain" in cluster.cli("hinfo").stdout
    cluster.cli("hcontrol", "update", f"NodeName={name}", "State=RESUME", user="root")
    assert node_row(cluster, name)["state"] == "up"
