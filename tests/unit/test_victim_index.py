"""The indexed victim search chooses exactly what the plain scan over every node chooses: whole
plans are compared on random snapshots (levels, classes, gangs, PREEMPTING runs, partitions,
drained nodes, starvation reservations)."""
import random

import pytest

from hai_cluster.core.model import GpuInfo, JobView, NodeView, Snapshot
from hai_cluster.core.states import JobState
from hai_cluster.scheduling import mlfq
from hai_cluster.scheduling.mlfq import MlfqConfig, MlfqPolicy

PRIORITIES = ["urgent", "high", "normal", "normal", "normal", "low"]


def random_snapshot(seed: int) -> Snapshot:
    rng = random.Random(seed)
    per_node = rng.choice([2, 4, 8])
    n_nodes = rng.randint(2, 24)
    now = 100_000.0
    names = [f"n{i:02d}" for i in range(n_nodes)]
    parts = {n: (("gpu",) if rng.random() < 0.8 else ("debug",)) for n in names}
    free = {n: list(range(per_node)) for n in names}
    jobs, jid = [], 0
    for _ in range(rng.randint(0, 4 * n_nodes)):
        g = rng.choice([1, 1, 2, per_node])
        nodes = rng.choice([1, 1, 1, 2]) if g == per_node else 1
        fitting = [n for n in names if len(free[n]) >= g]
        if len(fitting) < nodes:
            continue
        jid += 1
        chosen = rng.sample(fitting, nodes)
        alloc = tuple((n, tuple(free[n].pop(0) for _ in range(g))) for n in chosen)
        state = JobState.PREEMPTING if rng.random() < 0.1 else JobState.RUNNING
        jobs.append(JobView(id=jid, user="u", state=state, submit_time=0.0, nodes=nodes, gpus_per_node=g,
                            partition=parts[chosen[0]], priority=rng.choice(PRIORITIES),
                            attained_gpu_seconds=rng.choice([0.0, rng.uniform(0, 5000)]),
                            run_start=now - rng.uniform(0, 400), nodelist=tuple(chosen), allocation=alloc,
                            preemptible=rng.random() < 0.9))
    for _ in range(rng.randint(1, 6 * n_nodes)):
        jid += 1
        g = rng.choice([1, 1, 2, per_node, per_node + 1])
        t = now - rng.uniform(0, 2000)
        jobs.append(JobView(id=jid, user="u", state=JobState.PENDING, submit_time=t,
                            nodes=rng.choice([1, 1, 2, 3]) if g == per_node else 1, gpus_per_node=g,
                            partition=rng.choice(["gpu", "gpu", "debug"]), priority=rng.choice(PRIORITIES),
                            attained_gpu_seconds=rng.choice([0.0, 0.0, rng.uniform(0, 5000)]), pending_since=t,
                            cpus_per_task=rng.choice([1, 1, 30]), preemptible=rng.random() < 0.9))
    gpus = tuple(GpuInfo(i, f"G{i}", "sim", 1) for i in range(per_node))
    views = tuple(NodeView(name=n, gpus=gpus, cpus=64, mem_mb=10**6, partitions=parts[n],
                           state="drain" if rng.random() < 0.05 else "up",
                           used_gpus=frozenset(set(range(per_node)) - set(free[n]))) for n in names)
    return Snapshot(now=now, jobs=tuple(jobs), nodes=views)


CONFIGS = [MlfqConfig(thresholds=(100.0, 1000.0), quanta=(10.0, 50.0, 100.0)),
           MlfqConfig(thresholds=(100.0, 1000.0), quanta=(0.0, 0.0, 0.0), placement="spread"),
           MlfqConfig(thresholds=(100.0, 1000.0), quanta=(10.0, 50.0, 100.0), starvation_factor=0.5,
                      starvation_floor=100.0, reservation_after=200.0),
           # the attained-service order (the Gittins order is the default: the ones above)
           MlfqConfig(order="las", thresholds=(100.0, 1000.0), quanta=(10.0, 50.0, 100.0)),
           MlfqConfig(order="las", thresholds=(100.0, 1000.0), quanta=(0.0, 0.0, 0.0), placement="spread")]


def plan_with(search: str, cfg: MlfqConfig, snap: Snapshot):
    old = mlfq.MlfqPass.victim_search
    mlfq.MlfqPass.victim_search = search
    try:
        return MlfqPolicy(cfg).decide(snap)
    finally:
        mlfq.MlfqPass.victim_search = old


@pytest.mark.parametrize("cfg", CONFIGS, ids=["quanta", "no-quanta-spread", "starvation", "las", "las-spread"])
def test_indexed_search_makes_the_plans_the_scan_makes(cfg):
    preempting_plans = 0
    for seed in range(150):
        snap = random_snapshot(seed)
        scan, index = plan_with("scan", cfg, snap), plan_with("index", cfg, snap)
        assert index == scan, f"seed {seed}"
        preempting_plans += bool(scan.preempts)
    assert preempting_plans > 30  # the snapshots do exercise the victim search
