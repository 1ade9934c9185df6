"""Every reason a policy gives a waiting job is one of the table's (core/reasons.py)."""
import pytest

from hai_cluster.core.model import GpuInfo, JobView, NodeView, Snapshot
from hai_cluster.core.quota import Quotas
from hai_cluster.core.reasons import PENDING_REASONS
from hai_cluster.core.states import JobState
from hai_cluster.scheduling.registry import POLICIES, make_policy

# (nodes, GPUs per node) of the pending jobs; some of them held, not yet begun, waiting on a
# dependency, or tasks of an array that runs one at a time
SHAPES = [(2, 4), (1, 4), (1, 2), (1, 1), (1, 1), (1, 1), (1, 1), (1, 1), (1, 1), (1, 4), (2, 2), (1, 3)]


def snapshot() -> Snapshot:
    nodes = tuple(NodeView(name=f"n{i}", gpus=tuple(GpuInfo(g, f"u{i}{g}", "sim", 81920) for g in range(4)),
                           cpus=32, mem_mb=100000, partitions=("gpu",)) for i in range(2))
    running = JobView(id=1, user="a", state=JobState.RUNNING, submit_time=0, nodes=1, gpus_per_node=4, run_start=10,
                      attained_gpu_seconds=10**7, nodelist=("n0",), allocation=(("n0", (0, 1, 2, 3)),),
                      time_limit=10**6)
    pending = tuple(
        JobView(id=10 + k, user="b" if k % 2 else "a", state=JobState.PENDING, submit_time=100 + k, nodes=n,
                gpus_per_node=g, hold=k in (3, 4), held_by_admin=k == 4, begin_time=10**9 if k == 5 else None,
                dependency="Dependency" if k == 6 else None, array_job_id=100 if k in (7, 8) else None,
                array_task_limit=1 if k in (7, 8) else None, time_limit=3600)
        for k, (n, g) in enumerate(SHAPES))
    return Snapshot(now=1000.0, jobs=(running, *pending), nodes=nodes, quotas=Quotas(user_gpus={"b": 1}))


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_wait_reason_is_in_the_table(name):
    plan = make_policy(name).decide(snapshot())
    reasons = {w.reason for w in plan.waits}
    assert len(reasons) >= 7 and reasons <= set(PENDING_REASONS), reasons
