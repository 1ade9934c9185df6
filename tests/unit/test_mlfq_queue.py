"""The MLFQ pass orders its pending jobs by groups and stable sorts (mlfq.MlfqPass.queue); the
order must be exactly that of the one sort key it replaces, compared here on random queues with
every field of the key in play: classes, levels (the lowest one round-robin), best-effort shares,
fair-share factors, equal submit times, with and without the starvation guard."""
import math
import random

import pytest

from hai_cluster.core.model import JobView, Snapshot
from hai_cluster.core.sharing import GpuShare
from hai_cluster.core.states import JobState
from hai_cluster.core.model import PRIORITY_RANK
from hai_cluster.scheduling.mlfq import MlfqConfig, MlfqPass

PRIORITIES = ["urgent", "high", "normal", "normal", "low"]


def reference_order(d: MlfqPass) -> list[tuple[int, int, int]]:
    """The single sort key of the MLFQ order, written out as the documentation states it."""
    keyed = []
    for j in d.pending:
        level = d.effective_level(j)
        rank = PRIORITY_RANK.get(j.priority, 2)
        rr = (j.last_run_end or -math.inf) if level == d.cfg.levels - 1 else 0.0
        share = d.snap.fairshare.get((j.account, j.user), 1.0) if d.snap.fairshare else 1.0
        best_effort = j.gpu_share is not None and j.gpu_share.qos == "best-effort"
        keyed.append(((0 if rank == 0 else 1, level, rank, best_effort, rr, -share, j.submit_time, j.id),
                      (j.id, level, rank)))
    return [out for _, out in sorted(keyed)]


def random_snapshot(seed: int) -> Snapshot:
    rng = random.Random(seed)
    now = 100_000.0
    users = [f"u{i}" for i in range(rng.randint(1, 5))]
    accounts = ["a", "b"]
    fairshare = {} if rng.random() < 0.3 else {(a, u): rng.choice([0.25, 0.5, 1.0, rng.random()])
                                               for a in accounts for u in users if rng.random() < 0.7}
    jobs = []
    ids = list(range(1, rng.randint(1, 300) + 1))
    rng.shuffle(ids)  # the snapshot's order is not the id order
    for jid in ids:
        share = None
        if rng.random() < 0.2:
            share = GpuShare(fraction=0.5, qos=rng.choice(["guaranteed", "best-effort"]))
        submit = rng.choice([50_000.0, 60_000.0, rng.uniform(0, now)])  # ties on submit time
        jobs.append(JobView(
            id=jid, user=rng.choice(users), account=rng.choice(accounts), state=JobState.PENDING,
            submit_time=submit, pending_since=submit, nodes=1,
            gpus_per_node=0 if share else rng.choice([1, 2, 8]), gpu_share=share,
            priority=rng.choice(PRIORITIES),
            attained_gpu_seconds=rng.choice([0.0, 0.0, rng.uniform(0, 100_000)]),
            last_run_end=rng.choice([None, 0.0, 70_000.0, rng.uniform(0, now)])))
    return Snapshot(now=now, jobs=tuple(jobs), nodes=(), fairshare=fairshare)


@pytest.mark.parametrize("seed", range(60))
@pytest.mark.parametrize("starvation", [0.0, 1.0])
def test_queue_is_the_order_of_the_single_key(seed, starvation):
    snap = random_snapshot(seed)
    cfg = MlfqConfig(starvation_factor=starvation, starvation_floor=1000.0, order="las")
    queued = [(j.id, level, rank) for j, level, rank in MlfqPass(cfg, snap).queue()]
    assert queued == reference_order(MlfqPass(cfg, snap))
    assert len(queued) == len(snap.jobs)
