"""The workload and the invariant check the fault tests share.

After a scenario: every acknowledged job ends exactly once, COMPLETED (requeued through every
failure); no GPU was held by two runs at once (from what the jobs themselves saw, with the run end
times the agents' shepherds recorded); no process of the test user is left behind by the cluster."""
from __future__ import annotations

import random
from pathlib import Path

from tests.e2e.harness import TEST_USER, user_dir, user_processes, wait_for

REPO = Path(__file__).resolve().parents[2]
FINAL = ("COMPLETED", "FAILED", "CANCELLED", "NODE_FAIL")

JOB = """#!/bin/bash
echo "$HAI_JOB_ID $HAI_RESTART_COUNT $(hostname) $CUDA_VISIBLE_DEVICES $(date +%s.%N)" >> {log}
exec python3 {repo}/examples/train_loop.py {steps} {step} 5 > /dev/null
"""


def starts_log(cluster) -> Path:
    return user_dir(cluster.workdir, TEST_USER) / "starts.log"


def submit_workload(cluster, rng: random.Random, count: int, *, long_every: int = 6, long_steps: int = 60) -> list[int]:
    """Short jobs and, every `long_every`, a preemptible checkpointing long one; 1-4 GPUs each."""
    d = user_dir(cluster.workdir, TEST_USER)
    env = {"HAI_EXAMPLES": str(REPO / "examples")}
    acked = []
    for i in range(count):
        long = i % long_every == 0
        script = d / f"job{i}.sh"
        script.write_text(JOB.format(log=starts_log(cluster), repo=REPO,
                                     steps=long_steps if long else rng.randint(3, 10), step=0.1))
        gpus = rng.choice([1, 1, 2, 4])
        acked.append(cluster.submit(f"--gpus-per-node={gpus}", "--grace=5", "-o", "/dev/null", str(script), env=env))
    return acked


def check_invariants(cluster, acked: list[int], context: str, timeout: float = 300) -> list[dict]:
    def settled():
        try:
            jobs = cluster.call("jobs", {"all": True})["jobs"]
        except Exception:
            return None
        return jobs if all(j["state"] in FINAL for j in jobs) else None
    jobs = wait_for(settled, timeout, 0.5, f"every job to end ({context})")
    assert sorted(j["id"] for j in jobs) == sorted(acked), context
    assert [j for j in jobs if j["state"] != "COMPLETED"] == [], context

    # No GPU held by two runs at once.
    runs = {}
    for j in acked:
        for r in cluster.job(j)["runs"]:
            runs[(j, r["attempt"])] = r
    holds = []
    for line in starts_log(cluster).read_text().splitlines():
        job, restart, host, gpus, t0 = line.split()
        run = runs[(int(job), int(restart))]
        holds.append((host, set(gpus.split(",")), float(t0), run["end_time"], f"{job}.{restart}"))
    for i, (h1, g1, s1, e1, n1) in enumerate(holds):
        for h2, g2, s2, e2, n2 in holds[i + 1:]:
            if h1 == h2 and g1 & g2:
                assert e1 <= s2 or e2 <= s1, f"runs {n1} and {n2} shared GPUs {g1 & g2} on {h1} ({context})"
    # Nothing of the user is left running (of this cluster: other test workers run their own).
    wait_for(lambda: not user_processes(TEST_USER, cluster.workdir), 60, 0.5,
             f"no process of {TEST_USER} left ({context}): {user_processes(TEST_USER, cluster.workdir)}")
    return jobs
