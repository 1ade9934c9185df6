"""The simulator's clock and bookkeeping, on tiny traces with answers computed by hand."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hai_cluster.core.model import Placement
from hai_cluster.core.states import JobState
from hai_cluster.scheduling.plan import Plan, Preempt, Start, Wait
from hai_cluster.scheduling.registry import POLICIES, make_policy
from hai_cluster.sim.cluster import Cluster
from hai_cluster.sim.engine import PolicyError, SimulationError, simulate
from hai_cluster.sim.metrics import summarize
from hai_cluster.sim.traces import TraceJob


def jobs(*specs):
    """(submit, duration, gpus) tuples -> trace jobs named j1, j2, ..."""
    return [TraceJob(f"j{i + 1}", float(s), float(d), g) for i, (s, d, g) in enumerate(specs)]


def jct(result):
    return {r.trace_id: r.jct for r in result.records}


class Scripted:
    """A policy driven by a function of the snapshot (for engine semantics, not scheduling)."""
    name = "scripted"

    def __init__(self, fn):
        self.fn, self.snapshots = fn, []

    def decide(self, snap):
        self.snapshots.append(snap)
        return self.fn(snap)


def first_free(snap, gpus=1):
    for n in snap.nodes:
        free = n.free_gpus
        if len(free) >= gpus:
            return Placement((n.name,), (free[:gpus],))
    return None


def test_fifo_on_one_gpu_hand_computed():
    res = simulate(make_policy("fifo"), jobs((0, 10, 1), (1, 5, 1), (2, 3, 1)), Cluster(1, 1))
    assert jct(res) == {"j1": 10, "j2": 14, "j3": 16}
    s = summarize(res)
    assert s.mean_jct == pytest.approx(40 / 3)
    assert s.mean_queue_delay == pytest.approx((0 + 9 + 13) / 3)
    assert s.makespan == 18 and s.utilization == 1.0 and s.preemptions == 0


def test_sjf_beats_fifo_by_exactly_the_expected_amount():
    trace = jobs((0, 100, 1), (1, 50, 1), (1, 10, 1))
    fifo = simulate(make_policy("fifo"), trace, Cluster(1, 1))
    sjf = simulate(make_policy("sjf"), trace, Cluster(1, 1))
    assert jct(fifo) == {"j1": 100, "j2": 149, "j3": 159}
    assert jct(sjf) == {"j1": 100, "j2": 159, "j3": 109}  # the 10 s job jumps the 50 s one
    assert summarize(fifo).mean_jct - summarize(sjf).mean_jct == pytest.approx(40 / 3)


@pytest.mark.parametrize("restart_cost, expected_long_jct", [(0, 1010), (890, 1900)])
def test_a_restart_cost_that_exactly_offsets_the_gain_of_preempting(restart_cost, expected_long_jct):
    # One GPU; a long job sinks below the 50 GPU-s threshold, a short one arrives at t=100 and
    # preempts it. FIFO: 1000 and 910 (mean 955). Tiresias: 10 and 1010 + restart cost, so at a
    # restart cost of 890 the preemption gains exactly nothing.
    trace = jobs((0, 1000, 1), (100, 10, 1))
    fifo = simulate(make_policy("fifo"), trace, Cluster(1, 1))
    las = simulate(make_policy("tiresias", thresholds=[50]), trace, Cluster(1, 1), restart_cost=restart_cost)
    assert jct(fifo) == {"j1": 1000, "j2": 910}
    assert jct(las) == {"j1": expected_long_jct, "j2": 10}
    assert las.preemptions == 1
    assert summarize(las).lost_gpu_s == restart_cost
    if restart_cost == 890:
        assert summarize(las).mean_jct == summarize(fifo).mean_jct == 955


def test_preemption_bookkeeping_restart_cost_per_gpu_and_a_preempted_redo():
    # A 2-GPU job of 100 s: preempted at t=10 (10 s done), restarted at t=20 with a redo of
    # 5 + 2 x 1 = 7 s, preempted again at t=23 (inside the redo: nothing gained, 3 s lost),
    # restarted at t=30 with a fresh 7 s redo: ends at 30 + 7 + 90 = 127. (A second job stays
    # pending until t=200 so that there is something to decide about all along.)
    events = {10: "preempt", 20: "start", 23: "preempt", 30: "start", 200: "other"}

    def fn(snap):
        big = next(j for j in snap.jobs if j.id == 1) if any(j.id == 1 for j in snap.jobs) else None
        other = next(j for j in snap.jobs if j.id == 2)
        what = events.get(snap.now)
        wake = min((t for t in events if t > snap.now), default=None)
        actions = []
        if big is not None and big.state == JobState.RUNNING and what == "preempt":
            actions.append(Preempt(big.id, "test"))
        elif big is not None and big.state == JobState.PENDING and (snap.now == 0 or what == "start"):
            actions.append(Start(big.id, first_free(snap, 2), "test"))
        if what == "other" and first_free(snap):
            actions.append(Start(other.id, first_free(snap), "test"))
        return Plan(tuple(actions), wake_at=wake)
    res = simulate(Scripted(fn), jobs((0, 100, 2), (0, 1, 1)), Cluster(1, 2), restart_cost=5, restart_cost_per_gpu=1)
    rec = res.records[0]
    assert rec.end == 127 and rec.preemptions == 2
    assert rec.lost_gpu_s == pytest.approx((3 + 7) * 2)
    assert rec.busy_gpu_s == pytest.approx((10 + 3 + 97) * 2)
    assert rec.busy_gpu_s - rec.lost_gpu_s == pytest.approx(100 * 2)  # useful work is the duration
    assert res.records[1].first_start == 200


def test_snapshot_contents_time_limit_allocation_and_history():
    seen = []

    def fn(snap):
        seen.extend((snap.now, j) for j in snap.jobs)
        pending = sorted((j for j in snap.jobs if j.state == JobState.PENDING), key=lambda j: j.id)
        running = [j for j in snap.jobs if j.state == JobState.RUNNING]
        if snap.now == 5 and running and running[0].restart_count == 0:
            return Plan((Preempt(running[0].id, "test"),))
        starts = [Start(j.id, first_free(snap), "t") for j in pending[:1] if first_free(snap)]
        return Plan(tuple(starts), wake_at=5 if snap.now < 5 else None)
    simulate(Scripted(fn), jobs((0, 10.2, 1), (0, 1, 1)), Cluster(1, 1), restart_cost=1)
    views = [j for t, j in seen if j.id == 1]
    first = views[0]
    assert first.state == JobState.PENDING and first.time_limit == 11 and first.pending_since == 0
    running = next(j for t, j in seen if t == 5 and j.id == 1)
    assert running.state == JobState.RUNNING and running.run_start == 0 and running.attained(5) == 5
    assert running.allocation == (("node01", (0,)),) and running.nodelist == ("node01",)
    again = [j for t, j in seen if t == 5 and j.id == 1 and j.state == JobState.PENDING]
    assert again and again[0].restart_count == 1 and again[0].attained_gpu_seconds == 5
    assert again[0].last_run_end == 5 and again[0].pending_since == 5 and again[0].run_start is None


def test_big_jobs_span_whole_nodes_with_gpus_split_evenly():
    c = Cluster(3, 8)
    assert c.shape(8) == (1, 8) and c.shape(16) == (2, 8) and c.shape(12) == (2, 6) and c.shape(9) == (2, 5)
    assert c.can_run(24) and not c.can_run(25)
    res = simulate(make_policy("fifo"), jobs((0, 10, 12), (0, 10, 9)), c)
    assert [(r.gpus, r.gpus_alloc) for r in res.records] == [(12, 12), (9, 10)]
    assert jct(res) == {"j1": 10, "j2": 20}  # j2 needs 2 nodes with 5 free GPUs; j1 leaves only 1
    with pytest.raises(ValueError, match="more than the 3x8 cluster"):
        simulate(make_policy("fifo"), jobs((0, 1, 32)), c)


def test_wake_at_is_honoured():
    def fn(snap):
        (job,) = snap.jobs
        if snap.now < 50:
            return Plan((Wait(job.id, "later"),), wake_at=50)
        return Plan((Start(job.id, first_free(snap), "now"),))
    res = simulate(Scripted(fn), jobs((0, 10, 1)), Cluster(1, 1))
    assert res.records[0].first_start == 50


@pytest.mark.parametrize("plan_for, message", [
    (lambda s, jid: Plan((Start(jid, Placement(("node01",), ((0,),)), "x"),
                          Start(jid + 1, Placement(("node01",), ((0,),)), "x"))), "GPU 0 is in use"),
    (lambda s, jid: Plan((Start(jid, Placement(("nodeX",), ((0,),)), "x"),)), "unknown node"),
    (lambda s, jid: Plan((Start(jid, Placement(("node01",), ((0, 1),)), "x"),)), "needs 1 distinct"),
    (lambda s, jid: Plan((Preempt(jid, "x"),)), "which is PENDING"),
    (lambda s, jid: Plan((Start(jid, Placement(("node01",), ((0,),)), "x"),
                          Start(jid, Placement(("node01",), ((1,),)), "x"))), "two actions"),
])
def test_a_bad_plan_fails_loudly(plan_for, message):
    policy = Scripted(lambda s: plan_for(s, min(j.id for j in s.jobs)))
    with pytest.raises(PolicyError, match=message):
        simulate(policy, jobs((0, 10, 1), (0, 10, 1)), Cluster(1, 2))


def test_a_policy_that_never_starts_anything_is_reported():
    with pytest.raises(SimulationError, match="left 1 job"):
        simulate(Scripted(lambda s: Plan((Wait(1, "never"),))), jobs((0, 10, 1)), Cluster(1, 1))


def test_a_preemption_loop_is_reported():
    def fn(snap):  # always swap the running job for the waiting one
        running = [j for j in snap.jobs if j.state == JobState.RUNNING]
        pending = [j for j in snap.jobs if j.state == JobState.PENDING]
        if not running:
            return Plan((Start(pending[0].id, first_free(snap), "x"),), wake_at=1)
        return Plan((Preempt(running[0].id, "swap"), Start(pending[0].id, Placement(("node01",), ((0,),)), "x")))
    with pytest.raises(SimulationError, match="preemption loop"):
        simulate(Scripted(fn), jobs((0, 10, 1), (0, 10, 1)), Cluster(1, 1), max_rounds=20)


def test_same_input_same_result():
    trace = jobs(*[(i % 7, 10 + (i * 37) % 90, 1 + i % 4) for i in range(40)])
    a = simulate(make_policy("tiresias", thresholds=[20, 200]), trace, Cluster(2, 4))
    b = simulate(make_policy("tiresias", thresholds=[20, 200]), trace, Cluster(2, 4))
    assert a.records == b.records and a.timeline == b.timeline and a.preemptions > 0


trace_st = st.lists(st.tuples(st.integers(0, 60), st.integers(0, 120), st.sampled_from([1, 1, 2, 3, 4, 6, 8])),
                    min_size=1, max_size=14)


class Checked:
    """Wraps a policy and checks every snapshot: no node holds more GPUs than it has, and the
    running jobs' allocations are exactly the nodes' used GPUs."""

    def __init__(self, policy):
        self.policy, self.name = policy, policy.name

    def decide(self, snap):
        held: dict[str, list[int]] = {}
        for j in snap.jobs:
            if j.state == JobState.RUNNING:
                for node, gpus in j.allocation:
                    held.setdefault(node, []).extend(gpus)
        for n in snap.nodes:
            assert len(n.used_gpus) <= len(n.gpus)
            assert sorted(held.get(n.name, [])) == sorted(n.used_gpus)
        return self.policy.decide(snap)


@settings(max_examples=40, deadline=None)
@given(trace_st, st.sampled_from([0, 30]))
def test_every_policy_finishes_every_job_exactly_once_without_overbooking(specs, restart_cost):
    trace = jobs(*specs)
    for name in sorted(POLICIES):
        res = simulate(Checked(make_policy(name)), trace, Cluster(2, 4), restart_cost=restart_cost)
        assert sorted(r.trace_id for r in res.records) == sorted(j.id for j in trace)
        for r in res.records:
            assert r.first_start >= r.submit and r.end >= r.first_start + r.duration - 1e-6
            assert r.busy_gpu_s - r.lost_gpu_s == pytest.approx(r.duration * r.gpus_alloc, abs=1e-6)
        assert max(b for _, b in res.timeline) <= 8
        if name in ("fifo", "sjf", "backfill"):
            assert res.preemptions == 0


def test_known_sizes_give_the_policy_the_traces_own_distribution_and_learn_nothing():
    trace = jobs((0, 10, 1), (0, 1000, 2), (5, 20, 1))
    spied = []

    def fn(snap):
        spied.append(snap.sizes)
        pending = sorted((j for j in snap.jobs if j.state == JobState.PENDING), key=lambda j: j.id)
        return Plan(tuple(Start(j.id, first_free(snap, j.gpus), "t") for j in pending[:1] if first_free(snap, j.gpus)))
    simulate(Scripted(fn), trace, Cluster(1, 2), known_sizes=True)
    assert spied and all(s is spied[0] for s in spied)  # the same model throughout: nothing learned
    assert spied[0].seen == 3 and spied[0].hists["g1"].total == pytest.approx(2)
    assert spied[0].distribution(2).source == "g2"
    spied.clear()
    simulate(Scripted(fn), trace, Cluster(1, 2))
    assert spied[0].seen == 0 and spied[-1].seen == 2  # learned as jobs end (the last one's end is not decided on)


def test_mlfq_knowing_that_every_job_runs_1000_s_lets_the_oldest_finish():
    """Jobs that all run 1000 s: learned from nothing (the log-uniform prior, attained-service
    order) each newcomer preempts the run; knowing the distribution, a run closer to its end
    keeps its GPU and the jobs finish in arrival order."""
    trace = jobs(*((100 * i, 1000, 1) for i in range(20)))

    def replay(known):
        return simulate(make_policy("mlfq", restart_cost=0.0, level_ratio=1.1), trace, Cluster(1, 1),
                        restart_cost=0, known_sizes=known)
    learned, known = replay(False), replay(True)
    assert learned.preemptions >= 10
    assert known.preemptions == 0 and [jct(known)[f"j{i + 1}"] for i in range(3)] == [1000, 1900, 2800]
