"""Fractional GPUs in the pure core: per-card accounting, packing, QoS preemption, topology."""
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hai_cluster.core.model import GpuInfo, JobView, NodeView, Snapshot
from hai_cluster.core.resources import could_ever_fit, fits
from hai_cluster.core.sharing import GpuShare, card_use
from hai_cluster.core.states import JobState
from hai_cluster.core.topology import choose_cards
from hai_cluster.scheduling.fifo import decide as fifo_decide
from hai_cluster.scheduling.mlfq import MlfqConfig, MlfqPolicy
from hai_cluster.scheduling.placement import place, release, reserve
from hai_cluster.scheduling.plan import Preempt, Start, Wait

CARD = 81920  # MiB, an 80 GB card


def node(name="a", cards=2, shareable=True, used=(), memory=CARD):
    return NodeView(name=name, gpus=tuple(GpuInfo(i, f"{name}{i}", "sim", memory, shareable=shareable, isolation="mps")
                                          for i in range(cards)),
                    cpus=64, mem_mb=10**6, partitions=("gpu",), used_gpus=frozenset(used))


def sharing(id, fraction=None, mem=None, compute=None, qos="guaranteed", nodes=1, state=JobState.PENDING,
            alloc=(), start=None):
    return JobView(id=id, user="u", state=state, submit_time=float(id), nodes=nodes, gpus_per_node=0,
                   partition="gpu", gpu_share=GpuShare(fraction, mem, compute, qos),
                   allocation=tuple(alloc), run_start=start, nodelist=tuple(n for n, _ in alloc))


def whole(id, gpus=1):
    return JobView(id=id, user="u", state=JobState.PENDING, submit_time=float(id), nodes=1, gpus_per_node=gpus,
                   partition="gpu")


def test_share_amounts():
    quarter = GpuShare(fraction=0.25)
    card = GpuInfo(0, "u", "sim", CARD)
    assert quarter.mem_on(card) == 20480 and quarter.compute_percent == 25 and quarter.reserved_compute == 25
    assert GpuShare(fraction=0.3).mem_on(card) == 24576  # floor(81920 x 0.3)
    mem_only = GpuShare(mem_mb=8192)
    assert mem_only.mem_on(card) == 8192 and mem_only.compute_percent == 0
    best_effort = GpuShare(mem_mb=8192, compute=30, qos="best-effort")
    assert best_effort.compute_percent == 30 and best_effort.reserved_compute == 0
    assert quarter.label() == "gpu:0.25" and quarter.label(20480) == "gpu:0.25(20G)"
    assert GpuShare(mem_mb=8192, compute=30).label() == "gpu:8G,30%"
    assert best_effort.label() == "gpu:8G,30%:best-effort"
    for bad in (dict(fraction=1.0), dict(fraction=0.0), dict(mem_mb=0), dict(fraction=0.5, compute=101),
                dict(fraction=0.5, qos="gold"), dict()):
        with pytest.raises(ValueError):
            GpuShare(**bad)


def test_binpack_fills_a_card_and_spread_separates_jobs():
    # Two empty cards score the same: (20480/81920 + 25/100) = 0.5 each -> the lowest index.
    # Once card 0 holds a quarter it scores (20480+20480)/81920 + 50/100 = 1.0, card 1 still 0.5.
    for pack, second in (("binpack", 0), ("spread", 1)):
        nodes = {"a": node()}
        first = place(sharing(1, 0.25), nodes, pack=pack)
        assert first.gpus == ((0,),) and first.shares == ((20480, 25),)
        reserve(sharing(1, 0.25), first, nodes)
        assert card_use(nodes["a"])[0].mem_mb == 20480 and nodes["a"].used_gpus == {0}
        p = place(sharing(2, 0.25), nodes, pack=pack)
        assert p.gpus == ((second,),), pack


def test_node_level_binpack_and_spread():
    busy = node("a")
    nodes = {"a": busy, "b": node("b")}
    reserve(sharing(1, 0.5), place(sharing(1, 0.5), nodes, only=["a"]), nodes)
    # Node a: (40960 + 20480) / 163840 + (50 + 25) / 200 = 0.75; node b: 0.125 + 0.125 = 0.25.
    assert place(sharing(2, 0.25), nodes, pack="binpack").nodes == ("a",)
    assert place(sharing(2, 0.25), nodes, pack="spread").nodes == ("b",)


def test_memory_is_never_overcommitted():
    nodes = {"a": node(cards=1)}
    placed = []
    for i in range(1, 5):  # 30 GiB each, no compute asked: two fit in 80 GiB, the third does not
        job = sharing(i, mem=30720)
        p = place(job, nodes)
        if p is None:
            break
        reserve(job, p, nodes)
        placed.append(job)
    assert len(placed) == 2 and card_use(nodes["a"])[0].mem_mb == 61440
    assert "GPU 0 has 20480 MiB unshared" in fits(sharing(9, mem=30720), nodes["a"]).reason
    # Compute too: three 0.3 shares reserve 90 %, a fourth would need 120 %.
    nodes = {"a": node(cards=1)}
    for i in range(3):
        reserve(sharing(i, 0.3), place(sharing(i, 0.3), nodes), nodes)
    assert place(sharing(4, 0.3), nodes) is None
    assert place(sharing(5, mem=1024, qos="best-effort"), nodes) is not None  # reserves no compute


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([None, 0.1, 0.25, 0.5, 0.75]), st.integers(1, 60000),
                          st.sampled_from(["guaranteed", "burstable", "best-effort"]), st.booleans()),
                min_size=1, max_size=25), st.sampled_from(["binpack", "spread"]))
def test_packing_never_exceeds_a_card(requests, pack):
    nodes = {"a": node(cards=2), "b": node("b", cards=1, memory=40960)}
    held = []
    for i, (fraction, mem, qos, leave) in enumerate(requests):
        job = sharing(i, fraction, None if fraction else mem, qos=qos)
        p = place(job, nodes, pack=pack)
        if p is not None:
            reserve(job, p, nodes)
            held.append((job, p))
        if leave and held:  # free the oldest share again
            old, op = held.pop(0)
            release(old, op.nodes[0], op.gpus[0], nodes)
        for n in nodes.values():
            for g in n.gpus:
                u = card_use(n).get(g.index)
                if u is not None:
                    assert u.mem_mb <= g.memory_mb and u.compute <= 100
        assert sum(u.jobs for n in nodes.values() for u in card_use(n).values()) == len(held)


def test_shared_and_whole_cards_exclude_each_other():
    nodes = {"a": node(cards=2)}
    reserve(sharing(1, 0.25), place(sharing(1, 0.25), nodes), nodes)
    assert place(whole(2, 2), nodes) is None  # card 0 holds a share
    assert place(whole(2, 1), nodes).gpus == ((1,),)
    held_whole = {"a": node(cards=2, used=(0, 1))}
    assert place(sharing(3, 0.25), held_whole) is None
    assert "GPU 0 is in use" in fits(sharing(3, 0.25), held_whole["a"]).reason


def test_only_shareable_cards_take_shares():
    plain = node(shareable=False)
    assert not fits(sharing(1, 0.25), plain, ignore_usage=True)
    verdict = could_ever_fit(sharing(1, 0.25), (plain,))
    assert not verdict and "shared GPU" in verdict.reason
    assert not could_ever_fit(sharing(1, mem=100000), (node(),))  # more than a card has


def test_fifo_starts_sharing_jobs_side_by_side():
    snap = Snapshot(now=0.0, jobs=tuple(sharing(i, 0.25) for i in range(1, 6)), nodes=(node(cards=1),))
    plan = fifo_decide(snap)
    assert [s.job_id for s in plan.starts] == [1, 2, 3, 4]
    assert all(s.placement.gpus == ((0,),) for s in plan.starts)
    assert [(w.job_id, w.reason) for w in plan.waits] == [(5, "Resources")]


def test_guaranteed_job_preempts_best_effort_shares_first():
    # Card 0 holds two best-effort shares of 40 GiB; a guaranteed half-card job needs 40 GiB.
    be = [sharing(i, mem=40960, qos="best-effort", state=JobState.RUNNING, alloc=[("a", (0,))], start=0.0)
          for i in (1, 2)]
    n = replace(node(cards=1), used_gpus=frozenset({0}), shared=((0, 81920, 0, 2),))
    snap = Snapshot(now=1.0, jobs=(*be, sharing(3, 0.5)), nodes=(n,))
    plan = MlfqPolicy(MlfqConfig()).decide(snap)
    preempts = plan.preempts
    assert len(preempts) == 1 and preempts[0].job_id == 1 and preempts[0].for_job == 3
    assert "best-effort share of a GPU 0" in preempts[0].reason
    assert Wait(3, "WaitingForCheckpoint") in plan.actions
    # A best-effort or burstable job waits instead; nothing is preempted for it.
    for qos in ("best-effort", "burstable"):
        plan = MlfqPolicy(MlfqConfig()).decide(replace(snap, jobs=(*be, sharing(3, 0.5, qos=qos))))
        assert not plan.preempts and plan.waits[0].reason == "Resources"


def test_mlfq_uses_the_configured_pack():
    snap = Snapshot(now=0.0, jobs=(sharing(1, 0.25), sharing(2, 0.25)), nodes=(node(cards=2),))
    binpack = MlfqPolicy(MlfqConfig(gpu_pack="binpack")).decide(snap)
    spread = MlfqPolicy(MlfqConfig(gpu_pack="spread")).decide(snap)
    assert [s.placement.gpus for s in binpack.starts] == [((0,),), ((0,),)]
    assert [s.placement.gpus for s in spread.starts] == [((0,),), ((1,),)]
    with pytest.raises(ValueError, match="gpu_sharing pack"):
        MlfqConfig(gpu_pack="fill")


@pytest.mark.parametrize("order", ["gittins", "las"])
def test_mlfq_starts_memory_only_and_compute_requests_in_either_order(order):
    """A memory-only request has no charge before a card is given: the Gittins order ranks it all
    the same (it crashed the pass once), beside a fraction and a compute request."""
    jobs = (sharing(1, mem=30 * 1024), sharing(2, compute=30, mem=8192), sharing(3, 0.25))
    plan = MlfqPolicy(MlfqConfig(order=order)).decide(Snapshot(now=0.0, jobs=jobs, nodes=(node(cards=1),)))
    assert sorted(s.job_id for s in plan.starts) == [1, 2, 3]


# ---- topology ------------------------------------------------------------------------------------

def topo_node(used=()):
    # Pair scores (NVLinks x 100 + (50 - level) // 10): 0-1 = 204, 0-2 = 1-2 = 103, 2-3 = 1, 0-3 = 1-3 = 0.
    links = {(0, 1): (2, 10), (0, 2): (1, 20), (1, 2): (1, 20), (0, 3): (0, 50), (1, 3): (0, 50), (2, 3): (0, 40)}
    gpus = []
    for i in range(4):
        mine = tuple((b if a == i else a, nv, lvl) for (a, b), (nv, lvl) in links.items() if i in (a, b))
        gpus.append(GpuInfo(i, f"g{i}", "sim", CARD, links=mine))
    return NodeView(name="t", gpus=tuple(gpus), cpus=64, mem_mb=10**6, used_gpus=frozenset(used))


def test_one_gpu_job_takes_the_worst_linked_card():
    # Sums to the other free cards: 0 -> 307, 1 -> 307, 2 -> 207, 3 -> 1.
    assert choose_cards(topo_node(), 1) == (3,)
    # With 3 held: 0 -> 307, 1 -> 307, 2 -> 206.
    assert choose_cards(topo_node(used=(3,)), 1) == (2,)
    assert place(whole(1, 1), {"t": topo_node()}).gpus == ((3,),)


def test_multi_gpu_job_takes_the_best_linked_group():
    assert choose_cards(topo_node(), 2) == (0, 1)
    assert choose_cards(topo_node(used=(1,)), 2) == (0, 2)  # 103 beats 0-3 (0) and 2-3 (1)
    assert choose_cards(topo_node(used=(0,)), 2) == (1, 2)
    # Three of four: {0,1,2} = 204 + 103 + 103 beats any group with 3.
    assert choose_cards(topo_node(), 3) == (0, 1, 2)
    assert choose_cards(topo_node(), 4) == (0, 1, 2, 3)


def test_without_topology_the_lowest_free_indices():
    n = node(cards=8, shareable=False, used=(1, 4))
    assert [choose_cards(n, k) for k in (1, 2, 4)] == [(0,), (0, 2), (0, 2, 3, 5)]
    # Uniform links (every pair on one switch, NVSwitch-style) also tie to the lowest indices.
    uniform = replace(n, gpus=tuple(replace(g, links=tuple((p, 18, 0) for p in range(8) if p != g.index))
                                    for g in n.gpus))
    assert [choose_cards(uniform, k) for k in (1, 2, 4)] == [(0,), (0, 2), (0, 2, 3, 5)]


# ---- charging ------------------------------------------------------------------------------------

def test_share_charge_is_the_larger_of_memory_and_compute():
    from hai_cluster.core.sharing import share_charge
    assert share_charge(GpuShare(fraction=0.25), CARD) == 0.25
    assert share_charge(GpuShare(fraction=0.3), CARD) == 0.3  # compute ceil(30.0) = 30 %
    assert share_charge(GpuShare(mem_mb=40960), CARD) == 0.5  # 40 of 80 GiB, no compute asked
    assert share_charge(GpuShare(mem_mb=8192, compute=30), CARD) == 0.3  # 0.1 memory, 0.3 compute
    assert share_charge(GpuShare(mem_mb=8192, compute=5, qos="best-effort"), CARD) == 0.1  # memory wins
    assert share_charge(GpuShare(mem_mb=8192), 40960) == 0.2  # the same memory on a 40 GiB card


def test_a_sharing_run_attains_service_by_its_share():
    job = replace(sharing(1, 0.25, state=JobState.RUNNING, alloc=[("a", (0,))], start=100.0),
                  attained_gpu_seconds=50.0, gpu_charge=0.25)
    assert job.gpu_rate == 0.25 and job.attained(500.0) == 50.0 + 0.25 * 400
    assert whole(2, 2).gpu_rate == 2  # whole GPUs unchanged


def test_mlfq_demotes_a_long_sharing_job():
    # A 0.5 share that has run 7300 s has 3650 GPU-seconds: past the first threshold (3600), level 1.
    long = replace(sharing(1, 0.5, state=JobState.RUNNING, alloc=[("a", (0,))], start=0.0), gpu_charge=0.5)
    n = replace(node(cards=1), used_gpus=frozenset({0}), shared=((0, 40960, 50, 1),))
    from hai_cluster.scheduling.mlfq import MlfqPass
    assert MlfqPass(MlfqConfig(order="las"), Snapshot(now=7100.0, jobs=(long,), nodes=(n,))).level(long) == 0  # 3550
    assert MlfqPass(MlfqConfig(order="las"), Snapshot(now=7300.0, jobs=(long,), nodes=(n,))).level(long) == 1
    # At 7100 the policy wakes when the share crosses 3600: (3600 - 3550) / 0.5 = 100 s later.
    assert MlfqPolicy(MlfqConfig(order="las")).decide(Snapshot(now=7100.0, jobs=(long,), nodes=(n,))).wake_at == 7200.0
    # Requeued after that run, it waits behind a new sharing job when the card has room for one.
    requeued = sharing(3, 0.5, state=JobState.PENDING)
    requeued = replace(requeued, attained_gpu_seconds=3650.0, submit_time=0.0)
    other = replace(node(cards=1), used_gpus=frozenset({0}), shared=((0, 40960, 50, 1),))
    plan = MlfqPolicy(MlfqConfig(starvation_factor=0)).decide(
        Snapshot(now=8000.0, jobs=(requeued, sharing(4, 0.5)), nodes=(other,)))
    assert [s.job_id for s in plan.starts] == [4] and plan.waits[0].job_id == 3


# ---- MIG -----------------------------------------------------------------------------------------

LAYOUT = (("MIG-a", "3g.40gb", 40960, 42), ("MIG-b", "2g.20gb", 20480, 28), ("MIG-c", "2g.20gb", 20480, 28))


def mig_node(cards=1):
    return NodeView(name="m", gpus=tuple(GpuInfo(i, f"m{i}", "sim", CARD, shareable=True, isolation="mig",
                                                 mig=LAYOUT if i == 0 else ()) for i in range(cards)),
                    cpus=64, mem_mb=10**6, partitions=("gpu",))


def test_a_share_takes_the_smallest_mig_instance_that_holds_it():
    nodes = {"m": mig_node()}
    # 0.25 of 80 GiB = 20 GiB and 25 % compute: a 2g.20gb instance (28 %), the first of the two.
    quarter = place(sharing(1, 0.25), nodes)
    assert quarter.mig == ("MIG-b",) and quarter.shares == ((20480, 28),) and quarter.gpus == ((0,),)
    reserve(sharing(1, 0.25), quarter, nodes)
    assert nodes["m"].mig_used == {"MIG-b"} and place(sharing(2, 0.25), nodes).mig == ("MIG-c",)
    # 30 GiB only fits the 3g.40gb; 35 % compute too (2g has 28 %).
    assert place(sharing(3, mem=30720), nodes).mig == ("MIG-a",)
    assert place(sharing(4, mem=8192, compute=35), nodes).mig == ("MIG-a",)
    # One job per instance: three jobs fill the layout, a fourth (however small) waits.
    for i, job in enumerate((sharing(5, 0.25), sharing(6, mem=1024)), start=5):
        p = place(job, nodes)
        reserve(job, p, nodes)
    assert nodes["m"].mig_used == {"MIG-a", "MIG-b", "MIG-c"}
    assert place(sharing(7, mem=1024), nodes) is None
    assert "no free MIG instance" in fits(sharing(7, mem=1024), nodes["m"]).reason
    # Nothing on the layout holds 50 GiB: refused at submission (could never fit).
    assert not could_ever_fit(sharing(8, mem=51200), (mig_node(),))


def test_releasing_a_mig_share_frees_its_instance():
    nodes = {"m": mig_node()}
    job = sharing(1, mem=30720)
    p = place(job, nodes)
    reserve(job, p, nodes)
    running = replace(job, state=JobState.RUNNING, allocation=(("m", (0,)),), mig=p.mig)
    release(running, "m", (0,), nodes)
    assert nodes["m"].mig_used == frozenset() and card_use(nodes["m"]) == {} and nodes["m"].used_gpus == set()


def test_mig_cards_are_not_given_whole_while_instances_are_held():
    nodes = {"m": mig_node(cards=2)}
    reserve(sharing(1, 0.25), place(sharing(1, 0.25), nodes), nodes)
    assert place(whole(2, 2), nodes) is None and place(whole(2, 1), nodes).gpus == ((1,),)


def test_a_preempted_best_effort_share_does_not_take_the_card_back():
    # Job 1 (best-effort, 60 GiB) was preempted for job 2 (guaranteed, 40 GiB) and is pending again,
    # older than job 2: the freed card goes to job 2 and job 1 waits, instead of the two trading places.
    be = replace(sharing(1, mem=61440, qos="best-effort"), restart_count=1)
    snap = Snapshot(now=5.0, jobs=(be, sharing(2, mem=40960)), nodes=(node(cards=1),))
    plan = MlfqPolicy(MlfqConfig(order="las")).decide(snap)  # one level for both (the rule is within a level)
    assert [s.job_id for s in plan.starts] == [2] and [(w.job_id, w.reason) for w in plan.waits] == [(1, "Resources")]


def test_a_whole_gpu_job_does_not_preempt_a_card_share():
    # A 0.5 share has sunk to level 2 (4 h of half a card) and is past its quantum; a new whole-GPU
    # job at level 0 finds the only card shared. Preempting the share would free no whole card while
    # others may share it, so the job waits and nothing is preempted.
    long = replace(sharing(1, 0.5, state=JobState.RUNNING, alloc=[("a", (0,))], start=0.0), gpu_charge=0.5)
    n = replace(node(cards=1), used_gpus=frozenset({0}), shared=((0, 40960, 50, 1),))
    plan = MlfqPolicy(MlfqConfig()).decide(Snapshot(now=80000.0, jobs=(long, whole(2)), nodes=(n,)))
    assert not plan.preempts and [(w.job_id, w.reason) for w in plan.waits] == [(2, "Resources")]
