"""--array=...%N: never more than N tasks of the array running, under every policy."""
import pytest

from hai_cluster.core.model import GpuInfo, JobView, NodeView, Snapshot
from hai_cluster.core.states import JobState
from hai_cluster.scheduling.limits import ARRAY_LIMIT, throttled
from hai_cluster.scheduling.registry import POLICIES, make_policy


def node(name="n1", gpus=8):
    return NodeView(name=name, gpus=tuple(GpuInfo(i, f"u{i}", "sim", 1000) for i in range(gpus)), cpus=64,
                    mem_mb=100000)


def task(i, state=JobState.PENDING, limit=2, array=10, **kw):
    return JobView(id=i, user="u", state=state, submit_time=float(i), nodes=1, gpus_per_node=1,
                   array_job_id=array, array_task_limit=limit, pending_since=float(i), **kw)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_no_policy_starts_more_tasks_than_the_limit(name):
    jobs = tuple(task(i) for i in range(10, 16))
    plan = make_policy(name).decide(Snapshot(now=100.0, jobs=jobs, nodes=(node(),)))
    assert sorted(s.job_id for s in plan.starts) == [10, 11]
    assert {w.job_id for w in plan.waits if w.reason == ARRAY_LIMIT} == {12, 13, 14, 15}


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_running_tasks_use_up_the_limit(name):
    running = task(10, JobState.RUNNING, run_start=50.0, allocation=(("n1", (0,)),), nodelist=("n1",))
    n = node()
    n = NodeView(**{**n.__dict__, "used_gpus": frozenset({0}), "used_cpus": 1})
    jobs = (running, task(11), task(12), task(13))
    plan = make_policy(name).decide(Snapshot(now=100.0, jobs=jobs, nodes=(n,)))
    assert [s.job_id for s in plan.starts] == [11]


def test_held_tasks_take_no_slot_and_other_arrays_are_separate():
    jobs = (task(10, hold=True), task(11), task(12), task(13), task(20, array=20, limit=1), task(21, array=20, limit=1),
            task(30, array=30, limit=None))
    snap = Snapshot(now=0.0, jobs=jobs, nodes=(node(),))
    assert throttled(snap) == {13, 21}
    plan = make_policy("fifo").decide(snap)
    assert sorted(s.job_id for s in plan.starts) == [11, 12, 20, 30]
