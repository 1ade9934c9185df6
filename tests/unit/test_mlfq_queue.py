"""The MLFQ pass orders its pending jobs by groups and stable sorts (mlfq.MlfqPass.queue); the
order must be exactly that of the one sort key it replaces, compared here on random queues with
every field of the key in play: classes, levels, interactive jobs, (the lowest one round-robin), best-effort shares,
fair-share factors, equal submit times, with and without the starvation guard."""
import math
from dataclasses import replace
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
        keyed.append(((0 if rank == 0 else 1, level, not j.interactive, rank, best_effort, rr, -share, j.submit_time,
                       j.id),
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
            last_run_end=rng.choice([None, 0.0, 70_000.0, rng.uniform(0, now)]), interactive=rng.random() < 0.2))
    return Snapshot(now=now, jobs=tuple(jobs), nodes=(), fairshare=fairshare)


@pytest.mark.parametrize("seed", range(60))
@pytest.mark.parametrize("starvation", [0.0, 1.0])
def test_queue_is_the_order_of_the_single_key(seed, starvation):
    snap = random_snapshot(seed)
    cfg = MlfqConfig(starvation_factor=starvation, starvation_floor=1000.0, order="las")
    queued = [(j.id, level, rank) for j, level, rank in MlfqPass(cfg, snap).queue()]
    assert queued == reference_order(MlfqPass(cfg, snap))
    assert len(queued) == len(snap.jobs)


# Issue 23: jobs of salloc / srun (JobView.interactive) start ahead of batch jobs of their level,
# in both MLFQ orders and in the FIFO-like policies, and never ahead of a higher level or class.
def _node(gpus=4):
    from hai_cluster.core.model import GpuInfo, NodeView
    return NodeView(name="a", gpus=tuple(GpuInfo(i, f"a{i}", "sim", 1) for i in range(gpus)), cpus=64,
                    mem_mb=10**6, partitions=("gpu",))


def _job(jid, t, interactive=False, priority="normal", attained=0.0):
    return JobView(id=jid, user="u", name="x", state=JobState.PENDING, submit_time=t, pending_since=t, nodes=1,
                   gpus_per_node=4, partition="gpu", priority=priority, attained_gpu_seconds=attained,
                   interactive=interactive, time_limit=3600.0)


def _started(policy, jobs, now=10.0):
    from hai_cluster.scheduling.plan import Start
    plan = policy.decide(Snapshot(now=now, jobs=tuple(jobs), nodes=(_node(),)))
    return [a.job_id for a in plan.actions if isinstance(a, Start)]


def _policies():
    from hai_cluster.scheduling.registry import make_policy
    return {"mlfq-gittins": make_policy("mlfq", order="gittins"), "mlfq-las": make_policy("mlfq", order="las"),
            "fifo": make_policy("fifo"), "backfill": make_policy("backfill")}


@pytest.mark.parametrize("name", ["mlfq-gittins", "mlfq-las", "fifo", "backfill"])
def test_an_interactive_job_starts_ahead_of_an_older_batch_job_of_its_level(name):
    policy = _policies()[name]
    batch, session = _job(1, 0.0), _job(2, 5.0, interactive=True)
    assert _started(policy, [batch, session]) == [2]
    assert _started(policy, [batch, replace(session, interactive=False)]) == [1]  # submit order otherwise
    # an urgent job still goes first (under FIFO any higher class does: tested below)
    assert _started(policy, [replace(batch, priority="urgent"), session]) == [1]


@pytest.mark.parametrize("order", ["gittins", "las"])
def test_an_interactive_job_does_not_pass_a_batch_job_of_a_higher_level(order):
    policy = _policies()[f"mlfq-{order}"]
    fresh = _job(1, 0.0)
    session = _job(2, 5.0, interactive=True, attained=400_000.0)  # (its earlier runs sank it)
    assert _started(policy, [fresh, session]) == [1]


def test_sprio_order_follows_interactive_first_under_fifo():
    from hai_cluster.scheduling.fifo import service_order
    jobs = [_job(1, 0.0), _job(2, 5.0, interactive=True), _job(3, 1.0, priority="high")]
    assert [j.id for j in service_order(jobs)] == [3, 2, 1]
