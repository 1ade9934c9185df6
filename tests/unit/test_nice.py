"""--nice[=N]: sbatch's parse, and the order it gives a user's jobs in the MLFQ and FIFO queues."""
import pytest

from hai_cluster.core.jobscript import JobScriptError, parse_submission
from hai_cluster.core.model import GpuInfo, JobView, NodeView, Snapshot
from hai_cluster.core.states import JobState
from hai_cluster.scheduling.plan import Start
from hai_cluster.scheduling.registry import CONTROLLER_POLICIES, make_policy


def spec(*options):
    return parse_submission("#!/bin/sh\ntrue\n", list(options), cwd="/tmp", env={}, now=0.0).spec


def test_nice_alone_is_100_and_a_value_needs_its_equals_sign():
    assert spec().nice == 0 and spec("--nice").nice == 100 and spec("--nice=5").nice == 5
    assert spec("--nice=-5").nice == -5  # the controller lets administrators alone give it
    with pytest.raises(JobScriptError, match="Invalid nice value, must be between -2147483645 and 2147483645"):
        spec("--nice=2147483646")
    with pytest.raises(JobScriptError, match="--nice=soon: expected a whole number"):
        spec("--nice=soon")


@pytest.mark.parametrize("name", sorted(CONTROLLER_POLICIES))
def test_a_nicer_job_goes_after_its_peers(name):
    node = NodeView(name="a", gpus=(GpuInfo(0, "a0", "sim", 1),), cpus=8, mem_mb=1000, partitions=("gpu",))
    jobs = tuple(JobView(id=i, user="ann", state=JobState.PENDING, submit_time=float(i), nodes=1, gpus_per_node=1,
                         partition="gpu", nice=nice) for i, nice in ((1, 100), (2, 0), (3, 50)))
    plan = make_policy(name).decide(Snapshot(now=10.0, jobs=jobs, nodes=(node,)))
    assert [a.job_id for a in plan.actions if isinstance(a, Start)] == [2]  # the one GPU: the least nice first
