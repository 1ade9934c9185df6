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
from pathlib import Path

import pytest

from tests.e2e.harness import TEST_USER, start_ssh_cluster, user_dir, wait_for

REPO = Path(__file__).resolve().parents[2]
SCHEDULER = '[scheduler]\nthresholds = [4.0, 100000.0]\nquanta = [1.0, 2.0, 4.0]\n'
CONTROLLER = "node_down_after = 5.0\nping_interval = 0.5\n"
SEED = int(os.environ.get("HAI_CHAOS_SEED", random.SystemRandom().randrange(10**6)))


@pytest.fixture(scope="module")
def cluster(ssh_nodes):
    c = start_ssh_cluster(ssh_nodes, gpus_per_node=4, scheduler_toml=SCHEDULER, controller_toml=CONTROLLER)
    yield c
    for n in ssh_nodes:
        subprocess.run(["ip", "link", "set", n.network.node(n.name).veth_host, "up"], check=False)
    c.close()


JOB = """#!/bin/bash
echo "$HAI_JOB_ID $HAI_RESTART_COUNT $(hostname) $CUDA_VISIBLE_DEVICES $(date +%s.%N)" >> {log}
exec python3 {repo}/examples/train_loop.py {steps} {step} 5 > /dev/null
"""


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
    d = user_dir(cluster.workdir, TEST_USER)
    log = d / "starts.log"
    env = {"HAI_EXAMPLES": str(REPO / "examples")}
    acked = []
    for i in range(24):
        long = i % 6 == 0
        script = d / f"job{i}.sh"
        script.write_text(JOB.format(log=log, repo=REPO, steps=60 if long else rng.randint(3, 10),
                                     step=0.1))
        gpus = rng.choice([1, 1, 2, 4])
        acked.append(cluster.submit(f"--gpus-per-node={gpus}", "--grace=5", "-o", "/dev/null", str(script), env=env))
    events: list[str] = []
    chaos(cluster, ssh_nodes, rng, 25.0, events)
    context = f"seed {SEED}, events {events}"
    assert any(e != "nothing" for e in events), context

    def settled():
        try:
            jobs = cluster.call("jobs", {"all": True})["jobs"]
        except Exception:
            return None
        return jobs if all(j["state"] in ("COMPLETED", "FAILED", "CANCELLED", "NODE_FAIL") for j in jobs) else None
    jobs = wait_for(settled, 300, 0.5, f"every job to end ({context})")
    assert sorted(j["id"] for j in jobs) == sorted(acked), context
    assert [j for j in jobs if j["state"] != "COMPLETED"] == [], context

    # No GPU held by two runs at once.
    runs = {}
    for j in acked:
        for r in cluster.job(j)["runs"]:
            runs[(j, r["attempt"])] = r
    holds = []
    for line in log.read_text().splitlines():
        job, restart, host, gpus, t0 = line.split()
        run = runs[(int(job), int(restart))]
        holds.append((host, set(gpus.split(",")), float(t0), run["end_time"], f"{job}.{restart}"))
    for i, (h1, g1, s1, e1, n1) in enumerate(holds):
        for h2, g2, s2, e2, n2 in holds[i + 1:]:
            if h1 == h2 and g1 & g2:
                assert e1 <= s2 or e2 <= s1, f"runs {n1} and {n2} shared GPUs {g1 & g2} on {h1} ({context})"
    # Nothing of the user is left running.
    wait_for(lambda: subprocess.run(["pgrep", "-u", TEST_USER], capture_output=True).returncode == 1, 60, 0.5,
             f"no process of {TEST_USER} left ({context})")
