"""Chaos under load: a seeded schedule of controller and agent SIGKILLs and network cuts while
short jobs and preemptible long ones run; then the invariants.

- every acknowledged job ends exactly once, COMPLETED (requeued through every failure);
- no GPU was held by two runs at once (from what the jobs themselves saw, with the run end times
  the agents' shepherds recorded);
- no process of the test user is left behind.
Replay a failure with HAI_CHAOS_SEED=<seed printed in the failure message>."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import time

import pytest

from tests.e2e.harness import start_ssh_cluster
from tests.faults.invariants import check_invariants, submit_workload

# The production order (gittins) with a restart cost of 0.2 s: a run may be preempted 2 s into it.
SCHEDULER = '[scheduler]\nrestart_cost = 0.2\n'
CONTROLLER = "node_down_after = 5.0\nping_interval = 0.5\n"
SEED = int(os.environ.get("HAI_CHAOS_SEED", random.SystemRandom().randrange(10**6)))


@pytest.fixture(scope="module")
def cluster(ssh_nodes):
    c = start_ssh_cluster(ssh_nodes, gpus_per_node=4, scheduler_toml=SCHEDULER, controller_toml=CONTROLLER)
    yield c
    for n in ssh_nodes:
        subprocess.run(["ip", "link", "set", n.network.node(n.name).veth_host, "up"], check=False)
    c.close()


def chaos(cluster, ssh_nodes, rng: random.Random, duration: float, events: list) -> None:
    end = time.monotonic() + duration
    while time.monotonic() < end:
        time.sleep(rng.uniform(1.0, 3.0))
        what = rng.choice(["controller", "agent", "cut", "nothing"])
        if what == "controller":
            cluster.controller.kill(signal.SIGKILL)
            time.sleep(rng.uniform(0.2, 1.5))
            cluster.controller.start()
        elif what == "agent":
            node = rng.choice(ssh_nodes).name
            cluster.agents[node].kill(signal.SIGKILL)
            time.sleep(rng.uniform(0.2, 1.5))
            cluster.agents[node].start()
        elif what == "cut":
            node = rng.choice(ssh_nodes)
            veth = node.network.node(node.name).veth_host
            subprocess.run(["ip", "link", "set", veth, "down"], check=True)
            time.sleep(rng.choice([1.0, 7.0]))  # a flap, or long enough for the node to go down
            subprocess.run(["ip", "link", "set", veth, "up"], check=True)
            node = node.name
        else:
            node = ""
        events.append(f"{what} {node if what != 'controller' else ''}".strip())


def test_jobs_survive_kills_and_cuts(cluster, ssh_nodes):
    rng = random.Random(SEED)
    acked = submit_workload(cluster, rng, 24)
    events: list[str] = []
    chaos(cluster, ssh_nodes, rng, 25.0, events)
    context = f"seed {SEED}, events {events}"
    assert any(e != "nothing" for e in events), context

    check_invariants(cluster, acked, context)
