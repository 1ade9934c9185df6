"""The one fit test (core.resources): a whole placement checked rank by rank, as the applier and
the simulator check the policy's starts, and a waiting job's per-node explanation."""
from dataclasses import replace

from hai_cluster.core.model import GpuInfo, JobView, NodeView, Placement
from hai_cluster.core.resources import could_ever_fit, placement_misfit, why_waiting
from hai_cluster.core.sharing import GpuShare
from hai_cluster.core.states import JobState

CARD = 81920


def node(name, gpus=4, cpus=16, mem=64000, partitions=("gpu",), **kw):
    return NodeView(name=name, gpus=tuple(GpuInfo(i, f"{name}{i}", "sim", CARD, **kw) for i in range(gpus)),
                    cpus=cpus, mem_mb=mem, partitions=partitions)


def job(nodes=1, gpus=1, cpus=1, mem=None, share=None, partition="gpu"):
    return JobView(id=7, user="u", state=JobState.PENDING, submit_time=0.0, nodes=nodes,
                   gpus_per_node=0 if share else gpus, cpus_per_task=cpus, mem_mb=mem, partition=partition,
                   gpu_share=share)


def test_a_placement_fits_only_with_its_own_gpus_cpus_and_memory_free():
    a, b = node("a"), node("b")
    nodes = {"a": a, "b": b}
    assert placement_misfit(job(nodes=2, gpus=2), Placement(("a", "b"), ((0, 1), (2, 3))), nodes) is None
    taken = {"a": replace(a, used_gpus=frozenset({1})), "b": b}
    assert placement_misfit(job(gpus=2), Placement(("a",), ((0, 1),)), taken) == "a: GPU 1 is in use"
    assert placement_misfit(job(gpus=2), Placement(("a",), ((2, 3),)), taken) is None
    busy = {"a": replace(a, used_cpus=14, used_mem_mb=60000)}
    assert placement_misfit(job(cpus=4), Placement(("a",), ((0,),)), busy) == "a has 2 free CPUs"
    assert placement_misfit(job(mem=8000), Placement(("a",), ((0,),)), busy) == "a has 4000 MiB free memory"
    assert placement_misfit(job(gpus=2), Placement(("a",), ((0, 0),)), nodes).endswith("needs 2 distinct ones")
    assert placement_misfit(job(gpus=1), Placement(("a",), ((9,),)), nodes) == "a has no GPU 9"
    assert placement_misfit(job(nodes=2), Placement(("a", "a"), ((0,), (1,))), nodes).startswith("the placement puts two")
    assert placement_misfit(job(partition="cpu"), Placement(("a",), ((0,),)), nodes) == "a is not in partition cpu"
    drained = {"a": replace(a, state="drain")}
    assert placement_misfit(job(), Placement(("a",), ((0,),)), drained) == "a is drain"


def test_card_shares_are_checked_against_what_the_card_holds():
    a = node("a", shareable=True, isolation="mps")
    half = GpuShare(fraction=0.5)
    held = replace(a, used_gpus=frozenset({0}), shared=((0, 61440, 75, 2),))
    fits_half = Placement(("a",), ((0,),), shares=((40960, 50),))
    assert placement_misfit(job(share=half), fits_half, {"a": a}) is None
    assert "GPU 0 has 20480 MiB unshared" in placement_misfit(job(share=half), fits_half, {"a": held})
    whole_held = replace(a, used_gpus=frozenset({1}))
    on_whole = Placement(("a",), ((1,),), shares=((40960, 50),))
    assert placement_misfit(job(share=half), on_whole, {"a": whole_held}) == "a: GPU 1 is in use"
    assert placement_misfit(job(share=half), Placement(("a",), ((0, 1),), shares=((1, 1),)), {"a": a}).startswith(
        "a: a card share needs one GPU")


def test_mig_instances_are_given_once():
    mig = (("MIG-a", "3g.40gb", 40960, 42), ("MIG-b", "3g.40gb", 40960, 42))
    a = NodeView(name="a", gpus=(GpuInfo(0, "a0", "H200 MIG", CARD, shareable=True, isolation="mig", mig=mig),),
                 cpus=16, mem_mb=64000, partitions=("gpu",))
    share = GpuShare(mem_mb=30000)
    p = Placement(("a",), ((0,),), shares=((40960, 42),), mig=("MIG-b",))
    assert placement_misfit(job(share=share), p, {"a": a}) is None
    used = replace(a, used_gpus=frozenset({0}), shared=((0, 40960, 42, 1),), mig_used=frozenset({"MIG-b"}))
    assert placement_misfit(job(share=share), p, {"a": used}) == "a: MIG instance MIG-b is in use"
    wrong_size = replace(p, shares=((20480, 28),))
    assert "no MIG instance 'MIG-b' of that size" in placement_misfit(job(share=share), wrong_size, {"a": a})


def test_a_waiting_job_says_what_each_node_lacks():
    nodes = (replace(node("n1"), used_gpus=frozenset({0, 1})), replace(node("n2"), state="drain"),
             node("n3", cpus=2), node("cpu1", gpus=0, partitions=("cpu",)))
    text = why_waiting(job(gpus=4, cpus=4), nodes)
    assert text == "n1 has 2 of 4 GPUs free; n2 is drain; n3 has 2 CPUs, job needs 4; 1 node(s) outside partition gpu"
    gang = why_waiting(job(nodes=3, gpus=1), nodes[:1] + (node("n4"),))
    assert gang == "2 node(s) can take a rank now (n1, n4); it needs 3"
    many = why_waiting(job(gpus=8), tuple(node(f"x{i:02d}") for i in range(12)))
    assert many.count("has 4 GPUs, job needs 8") == 8 and many.endswith("4 more node(s) refuse it")
    assert why_waiting(job(), ()) == "the cluster has no nodes"


def test_an_impossible_request_names_the_resource_that_is_short():
    nodes = (node("a", gpus=4, cpus=48), node("b", gpus=8, cpus=16), node("c", partitions=("cpu",), cpus=128))
    fit = could_ever_fit(job(cpus=64), nodes)  # CPUs, not GPUs: every node has the one GPU asked for
    assert not fit and fit.reason.startswith("no node has 64 CPUs (the largest has 48):")  # c is not in gpu
    fit = could_ever_fit(job(gpus=16, mem=100000), nodes)
    assert fit.reason.startswith("no node has 16 GPUs (the largest has 8); no node has 100000 MiB of memory "
                                 "(the largest has 64000)")
    assert could_ever_fit(job(partition="big"), nodes).reason.startswith("no node is in partition big")
    # each resource exists, not all on enough nodes: the count is told
    fit = could_ever_fit(job(nodes=2, gpus=8), nodes)
    assert not fit and "1 node(s) qualify" in fit.reason
