"""--exclusive, -w and -x in the pure core: placement, the fit test and a pass of each policy."""
from dataclasses import replace

from hai_cluster.core.model import GpuInfo, JobView, NodeView, Placement, Snapshot
from hai_cluster.core.resources import could_ever_fit, fits, placement_misfit
from hai_cluster.core.states import JobState
from hai_cluster.scheduling.fifo import FifoPolicy
from hai_cluster.scheduling.mlfq import MlfqConfig, MlfqPolicy
from hai_cluster.scheduling.placement import place, reserve


def node(name, gpus=4, cpus=16, used=(), used_cpus=0):
    return NodeView(name=name, gpus=tuple(GpuInfo(i, f"{name}{i}", "sim", 1) for i in range(gpus)), cpus=cpus,
                    mem_mb=64000, partitions=("gpu",), used_gpus=frozenset(used), used_cpus=used_cpus)


def job(id=1, nodes=1, gpus=1, **kw):
    return JobView(id=id, user="u", state=JobState.PENDING, submit_time=float(id), nodes=nodes, gpus_per_node=gpus,
                   partition="gpu", **kw)


def test_exclusive_takes_idle_nodes_whole_and_nothing_joins_them():
    nodes = {"a": node("a", used=(0,), used_cpus=1), "b": node("b"), "c": node("c", gpus=8, cpus=32)}
    ex = job(gpus=1, exclusive=True)
    assert not fits(ex, nodes["a"]) and "in use" in fits(ex, nodes["a"]).reason
    p = place(ex, nodes)
    assert p == Placement(("b",), ((0, 1, 2, 3),))  # every GPU of the idle node (binpack: the smaller)
    reserve(ex, p, nodes)
    assert nodes["b"].used_cpus == 16 and not nodes["b"].free_gpus  # every CPU too
    assert place(job(id=2, gpus=0), {"b": nodes["b"]}) is None  # no other job joins it
    assert placement_misfit(ex, Placement(("c",), ((0, 1),)), {"c": node("c", gpus=8)}).endswith("needs 8 distinct ones")


def test_nodelist_and_exclude():
    nodes = {n: node(n) for n in ("a", "b", "c", "d")}
    assert place(job(nodes=2, required_nodes=("c", "d")), nodes).nodes == ("c", "d")
    assert set(place(job(nodes=3, required_nodes=("d",)), nodes).nodes) >= {"d"}  # d and two more
    assert place(job(nodes=3, excluded_nodes=("a", "b")), nodes) is None
    assert place(job(nodes=2, excluded_nodes=("a", "b")), nodes).nodes == ("c", "d")
    busy = {**nodes, "d": node("d", used=(0, 1, 2, 3))}
    assert place(job(nodes=2, required_nodes=("c", "d")), busy) is None  # a named node has no room
    fit = could_ever_fit(job(nodes=1, excluded_nodes=("a", "b", "c", "d")), tuple(nodes.values()))
    assert not fit


def snapshot(nodes, jobs):
    return Snapshot(now=100.0, jobs=tuple(jobs), nodes=tuple(nodes))


def test_policies_start_constrained_jobs_only_where_they_may():
    nodes = [node("a"), node("b")]
    jobs = [job(1, gpus=1, excluded_nodes=("a",)), job(2, gpus=1, exclusive=True), job(3, gpus=1)]
    for policy in (MlfqPolicy(MlfqConfig()), FifoPolicy()):
        starts = {s.job_id: s.placement for s in policy.decide(snapshot(nodes, jobs)).starts}
        assert starts[1].nodes == ("b",)
        assert starts[2].nodes == ("a",) and starts[2].gpus == ((0, 1, 2, 3),)  # a whole: b has job 1
        assert 3 in starts and starts[3].nodes == ("b",)


def test_a_running_exclusive_job_keeps_its_node_whole_in_the_next_pass():
    held = replace(job(1, gpus=1, exclusive=True), state=JobState.RUNNING, run_start=0.0,
                   allocation=(("a", (0, 1, 2, 3)),), nodelist=("a",))
    a = node("a", used=(0, 1, 2, 3), used_cpus=16)  # what the store's ranks say it holds
    plan = MlfqPolicy(MlfqConfig()).decide(snapshot([a], [held, job(2, gpus=0)]))
    assert plan.starts == ()


def test_unknown_required_node_is_named():
    fit = could_ever_fit(job(required_nodes=("zz9",)), (node("a"),))
    assert not fit and fit.reason.startswith("Invalid node name specified: -w names zz9")
