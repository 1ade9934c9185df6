"""decide() time on a large synthetic snapshot: N nodes x G GPUs, R running jobs, P pending jobs.

The snapshot is random but seeded: job sizes 1/2/4/8 GPUs (8-GPU jobs on 1, 2 or 4 nodes),
attained service spread over every MLFQ level, running jobs started up to 6 hours ago."""
from __future__ import annotations

import gc
import random
import statistics
import time

from hai_cluster.core.model import GpuInfo, JobView, NodeView, Snapshot
from hai_cluster.core.states import JobState
from hai_cluster.scheduling.registry import make_policy


def synthetic_snapshot(nodes: int = 1000, gpus_per_node: int = 8, running: int = 2000, pending: int = 10000,
                       seed: int = 1) -> Snapshot:
    rng = random.Random(seed)
    gpus = tuple(GpuInfo(i, f"GPU-{i}", "sim", 81920) for i in range(gpus_per_node))
    free = {f"n{i:04d}": list(range(gpus_per_node)) for i in range(nodes)}
    names = list(free)
    now = 1_000_000.0
    jobs = []
    for jid in range(1, running + 1):
        g = rng.choice([1, 1, 2, 4, 8])
        fitting = [n for n in names if len(free[n]) >= g]
        if not fitting:
            break
        n = rng.choice(fitting)
        start = now - rng.uniform(0, 6 * 3600)
        jobs.append(JobView(id=jid, user=f"u{jid % 50}", state=JobState.RUNNING, submit_time=start - 60, nodes=1,
                            gpus_per_node=g, attained_gpu_seconds=rng.uniform(0, 200_000), run_start=start,
                            nodelist=(n,), allocation=((n, tuple(free[n].pop(0) for _ in range(g))),)))
    for jid in range(running + 1, running + pending + 1):
        g = rng.choice([1, 1, 2, 4, 8, 8])
        t = now - rng.uniform(0, 50_000)
        jobs.append(JobView(id=jid, user=f"u{jid % 50}", state=JobState.PENDING, submit_time=t,
                            nodes=rng.choice([1, 1, 2, 4]) if g == 8 else 1, gpus_per_node=g,
                            attained_gpu_seconds=rng.choice([0.0, 0.0, rng.uniform(0, 200_000)]), pending_since=t))
    node_views = tuple(NodeView(name=n, gpus=gpus, cpus=128, mem_mb=2_000_000,
                                used_gpus=frozenset(set(range(gpus_per_node)) - set(free[n]))) for n in names)
    return Snapshot(now=now, jobs=tuple(jobs), nodes=node_views)


# (label, policy name, options): the production MLFQ (Gittins order, max_preemptions bound), the
# previous LAS order, and both without the per-pass preemption bound.
VARIANTS = (("fifo", "fifo", {}), ("mlfq", "mlfq", {}), ("mlfq order=las", "mlfq", {"order": "las"}),
            ("mlfq max_preemptions=0", "mlfq", {"max_preemptions": 0}),
            ("mlfq order=las max_preemptions=0", "mlfq", {"order": "las", "max_preemptions": 0}))


def measure(policies=VARIANTS, reps: int = 3, **shape) -> list[dict]:
    """Each variant `reps` times, interleaved (so that a busy moment of a shared machine falls on
    all of them alike). `policies`: names, or (label, name, options) triples."""
    snap = synthetic_snapshot(**shape)
    variants = [(p, p, {}) if isinstance(p, str) else p for p in policies]
    made = [(label, make_policy(name, **opts)) for label, name, opts in variants]
    times: dict[str, list[float]] = {label: [] for label, _ in made}
    counts = {}
    for _ in range(reps):
        for label, policy in made:
            gc.collect()  # (the previous pass's garbage is not this one's cost)
            t0 = time.perf_counter()
            plan = policy.decide(snap)
            times[label].append(time.perf_counter() - t0)
            counts[label] = (len(plan.starts), len(plan.preempts), len(plan.waits))
            del plan
    out = []
    for label, _ in made:
        ts, (starts, preempts, waits) = times[label], counts[label]
        out.append({"policy": label, "median_s": statistics.median(ts), "min_s": min(ts), "max_s": max(ts),
                    "starts": starts, "preempts": preempts, "waits": waits})
    return out
