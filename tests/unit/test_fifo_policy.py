from hypothesis import given, settings
from hypothesis import strategies as st

from hai_cluster.core.model import GpuInfo, JobView, NodeView, Snapshot
from hai_cluster.core.states import JobState
from hai_cluster.scheduling.fifo import decide
from hai_cluster.scheduling.plan import Start, Wait


def node(name, gpus=4, used=(), cpus=32, partitions=("gpu",), responding=True, state="up"):
    return NodeView(name=name, gpus=tuple(GpuInfo(i, f"GPU-{name}-{i}", "sim", 1000) for i in range(gpus)),
                    cpus=cpus, mem_mb=100_000, partitions=partitions, used_gpus=frozenset(used),
                    responding=responding, state=state)


def job(id, nodes=1, gpus=1, t=None, priority="normal", hold=False, partition="gpu", cpus=1):
    return JobView(id=id, user="u", state=JobState.PENDING, submit_time=t if t is not None else id, nodes=nodes,
                   gpus_per_node=gpus, cpus_per_task=cpus, partition=partition, priority=priority, hold=hold)


def test_fifo_starts_in_order_and_blocks_behind_the_first_that_does_not_fit():
    snap = Snapshot(now=100, nodes=(node("a"), node("b")), jobs=(job(1, gpus=3), job(2, gpus=4), job(3, gpus=4),
                                                                 job(4, gpus=1)))
    plan = decide(snap)
    starts = {a.job_id: a for a in plan.starts}
    waits = {a.job_id: a.reason for a in plan.waits}
    assert set(starts) == {1, 2}
    assert waits == {3: "Resources", 4: "Priority"}  # 4 would fit but must not jump the queue


def test_gang_gets_distinct_whole_nodes_or_nothing():
    snap = Snapshot(now=0, nodes=(node("a", used=(0,)), node("b"), node("c")), jobs=(job(1, nodes=2, gpus=4),))
    (start,) = decide(snap).starts
    assert start.placement.nodes == ("b", "c")
    assert start.placement.gpus == ((0, 1, 2, 3), (0, 1, 2, 3))
    snap = Snapshot(now=0, nodes=(node("a", used=(0,)), node("b")), jobs=(job(1, nodes=2, gpus=4),))
    assert decide(snap).waits == (Wait(1, "Resources"),)


def test_best_fit_keeps_big_holes_and_gpus_are_never_reused():
    snap = Snapshot(now=0, nodes=(node("a"), node("b", used=(0, 1))), jobs=(job(1, gpus=2), job(2, gpus=4)))
    starts = {s.job_id: s.placement for s in decide(snap).starts}
    assert starts[1].nodes == ("b",) and starts[1].gpus == ((2, 3),)
    assert starts[2].nodes == ("a",)


def test_priority_class_goes_first_held_jobs_wait_and_bad_nodes_are_skipped():
    snap = Snapshot(now=0, nodes=(node("a", gpus=1), node("down", state="drain"), node("gone", responding=False)),
                    jobs=(job(1), job(2, priority="urgent", t=50), job(3, hold=True, t=0)))
    plan = decide(snap)
    assert [s.job_id for s in plan.starts] == [2]
    assert dict((w.job_id, w.reason) for w in plan.waits) == {1: "Resources", 3: "JobHeldUser"}


def test_partitions_block_independently():
    snap = Snapshot(now=0, nodes=(node("a", gpus=1, partitions=("gpu",)), node("d", gpus=1, partitions=("debug",))),
                    jobs=(job(1, gpus=2), job(2, partition="debug")))
    plan = decide(snap)
    assert [s.job_id for s in plan.starts] == [2]


nodes_st = st.lists(st.tuples(st.integers(0, 8), st.sets(st.integers(0, 7), max_size=8)), min_size=1, max_size=5)
jobs_st = st.lists(st.tuples(st.integers(1, 3), st.integers(0, 8), st.sampled_from(["low", "normal", "urgent"]),
                             st.booleans()), max_size=25)


@settings(max_examples=300, deadline=None)
@given(nodes_st, jobs_st)
def test_plan_invariants(node_specs, job_specs):
    nodes = tuple(node(f"n{i}", gpus=g, used=[u for u in used if u < g]) for i, (g, used) in enumerate(node_specs))
    jobs = tuple(job(i + 1, nodes=n, gpus=g, priority=p, hold=h) for i, (n, g, p, h) in enumerate(job_specs))
    snap = Snapshot(now=0, nodes=nodes, jobs=jobs)
    plan = decide(snap)
    assert plan == decide(snap)  # the same snapshot gives the same plan
    by_name = {n.name: n for n in nodes}
    taken = set()
    decided = set()
    for a in plan.actions:
        assert a.job_id not in decided
        decided.add(a.job_id)
        if isinstance(a, Start):
            j = jobs[a.job_id - 1]
            assert not j.hold
            assert len(a.placement.nodes) == j.nodes == len(set(a.placement.nodes))  # all ranks, distinct nodes
            for name, gpus in zip(a.placement.nodes, a.placement.gpus):
                assert len(gpus) == j.gpus_per_node
                for g in gpus:
                    assert g not in by_name[name].used_gpus  # never a GPU already in use
                    assert (name, g) not in taken  # never the same GPU twice in one plan
                    assert g < len(by_name[name].gpus)
                    taken.add((name, g))
    assert decided == {j.id for j in jobs}  # every pending job gets a start or a reason


def test_jobs_that_need_a_runtime_go_only_where_it_exists():
    from dataclasses import replace as with_
    from hai_cluster.core.resources import could_ever_fit
    plain = node("plain")
    boxed = with_(node("boxed"), runtimes=("none", "bwrap", "runc"), container_runtime="bwrap")
    runc_job = with_(job(1), runtime="runc")
    image_job = with_(job(2, t=2), runtime="container")
    plan = decide(Snapshot(now=0, nodes=(plain, boxed), jobs=(runc_job, image_job, job(3, gpus=4, t=3))))
    assert {s.job_id: s.placement.nodes for s in plan.starts} == {1: ("boxed",), 2: ("boxed",), 3: ("plain",)}
    fit = could_ever_fit(with_(job(4), runtime="podman"), (plain, boxed))
    assert not fit and "the podman runtime" in fit.reason
