"""Node health: a real health-check program that fails while a flag file exists drains the node
with its first output line as the reason (shown by hinfo -N and hcontrol show node); the node
comes back by itself when the program passes again; an admin's RESUME and DRAIN keep working."""
from __future__ import annotations

import os
import time

import pytest

from tests.e2e.harness import start_local_cluster, wait_for

pytestmark = pytest.mark.timeout(300)

CHECK = """#!/bin/sh
if [ -e {base}/hang ]; then sleep 30; fi
if [ -e {base}/sick ]; then echo "ib0 link down"; echo "second line"; exit 1; fi
exit 0
"""


@pytest.fixture
def cluster():
    base = "/tmp/hai-health-" + os.urandom(4).hex()
    os.makedirs(base)
    program = f"{base}/check.sh"
    with open(program, "w") as f:
        f.write(CHECK.format(base=base))
    os.chmod(program, 0o755)
    c = start_local_cluster(gpus=2, agent_toml=f'health_check_program = "{program}"\nhealth_check_interval = 0.3\n'
                                                f'health_check_timeout = 1.0\nallow_root_jobs = true')
    c.flags = base
    yield c
    c.close()
    for name in ("sick", "hang", "check.sh"):
        if os.path.exists(f"{base}/{name}"):
            os.unlink(f"{base}/{name}")
    os.rmdir(base)


def node(cluster) -> dict:
    return cluster.call("nodes", {})["nodes"][0]


def wait_node(cluster, state: str, reason_start: str | None = None) -> dict:
    def check():
        n = node(cluster)
        ok = n["state"] == state and (reason_start is None or (n["reason"] or "").startswith(reason_start))
        return n if ok else None
    return wait_for(check, 60, 0.1, f"node {state} {reason_start or ''}")


def test_health_program_drains_and_resumes(cluster):
    flag = f"{cluster.flags}/sick"
    assert node(cluster)["state"] == "up"
    open(flag, "w").close()
    n = wait_node(cluster, "drain", "health: ")
    assert n["reason"] == "health: ib0 link down"
    assert "health: ib0 link down" in cluster.cli("hinfo", "-N").stdout
    assert "Reason=health: ib0 link down" in cluster.cli("hcontrol", "show", "node").stdout
    # a drained node takes no work
    job = cluster.submit("--gpus-per-node=1", "-o", "/dev/null", "--wrap", "true")
    assert cluster.job(job)["state"] == "PENDING"
    os.unlink(flag)
    wait_node(cluster, "up")
    cluster.wait_state(job, "COMPLETED")

    # an admin's RESUME works, and a node still failing is drained again at the next check
    open(flag, "w").close()
    wait_node(cluster, "drain", "health: ")
    cluster.cli("hcontrol", "update", "NodeName=local1", "State=RESUME", user="root")
    wait_node(cluster, "drain", "health: ")
    os.unlink(flag)
    wait_node(cluster, "up")

    # a node an admin drained stays drained while the checks pass
    cluster.cli("hcontrol", "update", "NodeName=local1", "State=DRAIN", "Reason=maintenance", user="root")
    n = wait_node(cluster, "drain", "maintenance")
    time.sleep(1.5)  # several checks pass meanwhile
    assert node(cluster)["state"] == "drain" and node(cluster)["reason"] == n["reason"]
    cluster.cli("hcontrol", "update", "NodeName=local1", "State=RESUME", user="root")
    wait_node(cluster, "up")

    # a program that hangs past its timeout is unhealthy too
    open(f"{cluster.flags}/hang", "w").close()
    n = wait_node(cluster, "drain", "health: ")
    assert "timed out after 1 s" in n["reason"], n
    os.unlink(f"{cluster.flags}/hang")
    wait_node(cluster, "up")


def test_critical_xid_drains_until_an_admin_resumes():
    """An XID line in the simulated GPUs' event file goes through the agent's NVML event thread:
    the node is drained at once with the XID as the reason, stays drained while every other
    check passes (and across an agent restart), and returns to service only by an admin's RESUME."""
    base = "/tmp/hai-xid-" + os.urandom(4).hex()
    os.makedirs(base)
    xids = f"{base}/xids"
    c = start_local_cluster(gpus=2, agent_toml="health_check_interval = 0.3\nallow_root_jobs = true",
                            gpus_toml=f'simulated_xid_file = "{xids}"')
    try:
        time.sleep(1.0)  # the sampler's event set exists (it reads only lines written after it)
        with open(xids, "a") as f:
            f.write("1 13\n")  # not a critical XID: nothing happens
        time.sleep(1.0)
        assert node(c)["state"] == "up"
        with open(xids, "a") as f:
            f.write("1 79\n")
        n = wait_node(c, "drain", "health: GPU 1 XID 79")
        assert n["reason"].startswith("health: GPU 1 XID 79 (GPU has fallen off the bus)"), n
        assert "XID 79" in c.cli("hinfo", "-N").stdout
        job = c.submit("--gpus-per-node=1", "-o", "/dev/null", "--wrap", "true")
        time.sleep(1.5)  # several passing checks, and ticks
        assert node(c)["state"] == "drain" and c.job(job)["state"] == "PENDING"
        agent = c.agents["local1"]
        agent.stop()
        agent.start()
        time.sleep(2.0)  # the new agent reports healthy
        assert node(c)["state"] == "drain" and node(c)["reason"] == n["reason"]
        c.cli("hcontrol", "update", "NodeName=local1", "State=RESUME", user="root")
        wait_node(c, "up")
        c.wait_state(job, "COMPLETED")
        time.sleep(1.0)
        assert node(c)["state"] == "up"  # the XID was delivered once, not reported forever
    finally:
        c.close()
        if os.path.exists(xids):
            os.unlink(xids)
        os.rmdir(base)
