"""sprio's PRIORITY orders pending jobs exactly as the policy serves them: the same random queues
as test_mlfq_queue.py, against the MLFQ pass's own queue and FIFO's order; and the factors it
shows are those the policy compares."""
from __future__ import annotations

import pytest

from hai_cluster.core.model import JobView, Snapshot
from hai_cluster.core.states import JobState
from hai_cluster.scheduling import fifo
from hai_cluster.scheduling.mlfq import MlfqConfig, MlfqPass
from hai_cluster.scheduling.priority import MAX_AGE, priorities, weights

from .test_mlfq_queue import random_snapshot


def by_priority(rows):
    return [r.job_id for r in sorted(rows, key=lambda r: -r.priority)]


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("starvation", [0.0, 1.0])
@pytest.mark.parametrize("order", ["las", "gittins"])
def test_priority_is_the_mlfq_queue_order(seed, starvation, order):
    snap = random_snapshot(seed)
    cfg = MlfqConfig(starvation_factor=starvation, starvation_floor=1000.0, order=order)
    rows = priorities(snap, "mlfq", cfg)
    queue = MlfqPass(cfg, snap).queue()
    assert by_priority(rows) == [j.id for j, _level, _rank in queue]
    assert sorted(r.priority for r in rows) == list(range(1, len(rows) + 1))
    levels = {j.id: level for j, level, _rank in queue}
    assert all(r.level == levels[r.job_id] for r in rows)


@pytest.mark.parametrize("seed", range(10))
def test_priority_is_the_fifo_order(seed):
    snap = random_snapshot(seed)
    rows = priorities(snap, "fifo", MlfqConfig())
    assert by_priority(rows) == [j.id for j in fifo.service_order(snap.jobs)]
    assert {r.level for r in rows} == {None} and {r.fairshare for r in rows} == {1.0}


def job(jid, **kw):
    base = dict(id=jid, user="u", state=JobState.PENDING, submit_time=0.0, nodes=1, gpus_per_node=1)
    return JobView(**{**base, **kw})


def test_held_and_not_yet_begun_jobs_are_not_listed_and_factors_are_the_policys():
    now = MAX_AGE
    snap = Snapshot(now=now, nodes=(), fairshare={("default", "u"): 0.25}, jobs=(
        job(1, hold=True), job(2, begin_time=now + 60), job(3, begin_time=now - 60, submit_time=now / 2),
        job(4, priority="urgent", attained_gpu_seconds=1e9, nice=5), job(5, dependency="Dependency"),
        job(6, state=JobState.RUNNING)))
    rows = {r.job_id: r for r in priorities(snap, "mlfq", MlfqConfig(order="las"))}
    assert sorted(rows) == [3, 4, 5]
    assert (rows[4].priority, rows[4].level, rows[4].qos, rows[4].nice) == (3, 2, 1.0, 5)  # urgent: first at any level
    assert (rows[3].age, rows[5].age) == (0.5, 1.0)  # since submission, a week is 1
    assert rows[3].fairshare == 0.25 and rows[3].qos == pytest.approx(1 / 3)
    assert weights("mlfq", True)["fairshare"] > 0 and weights("mlfq", False)["fairshare"] == 0
    assert weights("fifo", True)["fairshare"] == 0
