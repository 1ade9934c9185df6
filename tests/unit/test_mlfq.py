from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hai_cluster.core.model import GpuInfo, JobView, NodeView, Snapshot
from hai_cluster.core.states import JobState
from hai_cluster.scheduling.mlfq import MlfqConfig, MlfqPolicy
from hai_cluster.scheduling.plan import Preempt, Start, Wait

# The level machinery on attained service (order "las"); the Gittins order: test_mlfq_gittins.py.
CFG = MlfqConfig(thresholds=(100.0, 1000.0), quanta=(10.0, 50.0, 100.0), starvation_factor=2.0,
                 starvation_floor=500.0, reservation_after=300.0, order="las")


def node(name, gpus=4, used=()):
    return NodeView(name=name, gpus=tuple(GpuInfo(i, f"{name}{i}", "sim", 1) for i in range(gpus)), cpus=64,
                    mem_mb=10**6, partitions=("gpu",), used_gpus=frozenset(used))


def pending(id, gpus=1, nodes=1, t=0.0, priority="normal", attained=0.0, preemptible=True, hold=False,
            pending_since=None, last_run_end=None):
    return JobView(id=id, user="u", state=JobState.PENDING, submit_time=t, nodes=nodes, gpus_per_node=gpus,
                   partition="gpu", priority=priority, attained_gpu_seconds=attained, preemptible=preemptible,
                   hold=hold, pending_since=pending_since, last_run_end=last_run_end)


def running(id, alloc, start, attained=0.0, priority="normal", preemptible=True, state=JobState.RUNNING):
    per_node = len(alloc[0][1])
    return JobView(id=id, user="u", state=state, submit_time=0, nodes=len(alloc), gpus_per_node=per_node,
                   partition="gpu", priority=priority, attained_gpu_seconds=attained, run_start=start,
                   nodelist=tuple(n for n, _ in alloc), allocation=tuple((n, tuple(g)) for n, g in alloc),
                   preemptible=preemptible)


def snapshot(now, nodes, jobs):
    used: dict[str, set] = {}
    for j in jobs:
        if j.state.holds_resources:
            for n, g in j.allocation:
                used.setdefault(n, set()).update(g)
    return Snapshot(now=now, jobs=tuple(jobs), nodes=tuple(replace(n, used_gpus=frozenset(used.get(n.name, ())))
                                                           for n in nodes))


def decide(snap):
    return MlfqPolicy(CFG).decide(snap)


def test_levels_follow_attained_service():
    assert [CFG.level_of(x) for x in (0, 99, 100, 999, 1000, 10**9)] == [0, 0, 1, 1, 2, 2]
    with pytest.raises(ValueError, match="one quantum per level"):
        MlfqConfig(thresholds=(1.0,), quanta=(1.0,))
    with pytest.raises(ValueError, match="increasing"):
        MlfqConfig(thresholds=(5.0, 1.0), quanta=(1.0, 1.0, 1.0))


def test_new_job_preempts_a_demoted_run_after_its_quantum():
    # job 1: 4 GPUs for 60 s = 240 GPU-s -> level 1 (quantum 50 s); job 2 is new (level 0).
    long = running(1, [("a", [0, 1, 2, 3])], start=0.0)
    plan = decide(snapshot(60.0, [node("a")], [long, pending(2, t=59)]))
    assert plan.preempts == (Preempt(1, plan.preempts[0].reason, for_job=2),)
    assert "GPUs go to level 0 job 2" in plan.preempts[0].reason
    assert plan.waits == (Wait(2, "WaitingForCheckpoint"),)
    assert plan.starts == ()


def test_quantum_protects_a_fresh_run_and_same_level_never_preempts():
    # Level 1 run started 30 s ago with 200 GPU-s from earlier runs: quantum (50 s) not used up.
    fresh = running(1, [("a", [0, 1, 2, 3])], start=30.0, attained=200.0)
    plan = decide(snapshot(60.0, [node("a")], [fresh, pending(2)]))
    assert plan.preempts == () and plan.waits == (Wait(2, "Resources"),)
    assert plan.wake_at == 80.0  # the quantum ends at 30 + 50
    # A level-0 run is never preempted for another level-0 job, however long it ran.
    small = running(1, [("a", [0])], start=0.0)
    full = snapshot(20.0, [node("a", gpus=1)], [small, pending(2)])
    assert decide(full).preempts == ()


def test_urgent_preempts_lower_classes_at_once_but_not_its_own():
    fresh = running(1, [("a", [0, 1])], start=99.0)
    plan = decide(snapshot(100.0, [node("a", gpus=2)], [fresh, pending(2, gpus=2, priority="urgent")]))
    assert [p.job_id for p in plan.preempts] == [1]
    # Within the urgent class the usual rule holds: no preemption before the quantum (100 s) is up.
    urgent_run = running(1, [("a", [0, 1])], start=50.0, attained=10**6, priority="urgent")
    plan = decide(snapshot(100.0, [node("a", gpus=2)], [urgent_run, pending(2, gpus=2, priority="urgent")]))
    assert plan.preempts == ()


def test_non_preemptible_runs_are_never_victims():
    pinned = running(1, [("a", [0, 1, 2, 3])], start=0.0, preemptible=False)
    plan = decide(snapshot(10_000.0, [node("a")], [pinned, pending(2, priority="urgent")]))
    assert plan.preempts == () and plan.waits == (Wait(2, "Resources"),)


def test_a_run_that_cannot_resume_is_never_time_sliced_only_an_urgent_job_takes_it():
    # job 1 is long past its quantum at level 1, but it never said it can resume: time-slicing
    # leaves it (its work would be lost); an urgent job still takes it, at once.
    legacy = replace(running(1, [("a", [0, 1, 2, 3])], start=0.0), resumable=False)
    plan = decide(snapshot(60.0, [node("a")], [legacy, pending(2, t=59)]))
    assert plan.preempts == () and plan.waits == (Wait(2, "Resources"),)
    plan = decide(snapshot(60.0, [node("a")], [legacy, pending(2, t=59, priority="urgent")]))
    assert [p.job_id for p in plan.preempts] == [1]
    # the same run, resumable, is taken at its quantum's end as usual
    resumable = running(1, [("a", [0, 1, 2, 3])], start=0.0)
    assert [p.job_id for p in decide(snapshot(60.0, [node("a")], [resumable, pending(2, t=59)])).preempts] == [1]


def test_non_preemptible_job_does_not_take_gpus_a_higher_level_job_waits_for():
    # Job 2 (level 0, 2 nodes) cannot fit; job 3 (level 1, --no-requeue) could start on node a.
    jobs = [running(1, [("b", [0, 1, 2, 3])], start=0.0, attained=0.0, preemptible=False),
            pending(2, gpus=4, nodes=2), pending(3, gpus=1, attained=500.0, preemptible=False),
            pending(4, gpus=1, attained=500.0)]
    plan = decide(snapshot(5.0, [node("a"), node("b")], jobs))
    assert dict((w.job_id, w.reason) for w in plan.waits) == {2: "Resources", 3: "Priority"}
    assert [s.job_id for s in plan.starts] == [4]  # a preemptible one may use the idle GPUs
    # one that cannot resume is held back the same way
    jobs[3] = replace(jobs[3], resumable=False)
    plan = decide(snapshot(5.0, [node("a"), node("b")], jobs))
    assert dict((w.job_id, w.reason) for w in plan.waits) == {2: "Resources", 3: "Priority", 4: "Priority"}


def test_preempting_runs_are_waited_for_not_preempted_again():
    leaving = running(1, [("a", [0, 1, 2, 3])], start=0.0, state=JobState.PREEMPTING)
    other = running(3, [("b", [0, 1, 2, 3])], start=0.0)
    plan = decide(snapshot(500.0, [node("a"), node("b")], [leaving, other, pending(2, gpus=4)]))
    assert plan.preempts == () and plan.waits == (Wait(2, "WaitingForCheckpoint"),)
    # The GPUs that will come back are claimed: a second big job preempts elsewhere instead.
    plan = decide(snapshot(500.0, [node("a"), node("b")], [leaving, other, pending(2, gpus=4), pending(4, gpus=4, t=1)]))
    assert [p.job_id for p in plan.preempts] == [3] and {w.job_id for w in plan.waits} == {2, 4}


def test_gang_victims_and_fewest_victims():
    # Node a has two 2-GPU runs, node b one 4-GPU run: a 4-GPU job preempts the single run.
    jobs = [running(1, [("a", [0, 1])], 0.0), running(2, [("a", [2, 3])], 0.0), running(3, [("b", [0, 1, 2, 3])], 0.0),
            pending(4, gpus=4)]
    assert [p.job_id for p in decide(snapshot(1000.0, [node("a"), node("b")], jobs)).preempts] == [3]
    # A 2-node gang needs both nodes: all three runs go.
    jobs[-1] = pending(4, gpus=4, nodes=2)
    assert sorted(p.job_id for p in decide(snapshot(1000.0, [node("a"), node("b")], jobs)).preempts) == [1, 2, 3]


def test_order_within_levels_and_round_robin_at_the_bottom():
    jobs = [pending(1, t=5, attained=5000.0, last_run_end=50.0, pending_since=50.0),
            pending(2, t=9, attained=5000.0, last_run_end=10.0, pending_since=10.0),
            pending(3, t=20, priority="high"), pending(4, t=1)]
    plan = decide(snapshot(60.0, [node("a", gpus=1)], jobs))
    assert [s.job_id for s in plan.starts] == [3]  # level 0 first, high before normal
    plan = decide(snapshot(60.0, [node("a", gpus=1)], jobs[:2]))
    assert [s.job_id for s in plan.starts] == [2]  # bottom level: least recently run first


def test_starvation_guard_promotes_and_reservation_holds_nodes():
    # Job 1 ran 100 s on 2 GPUs (200 GPU-s, level 1) and has waited 600 s > max(2 x 100, 500).
    starving = pending(1, gpus=2, attained=200.0, pending_since=0.0, t=0.0)
    victim = running(2, [("a", [0, 1])], start=100.0, attained=300.0)  # level 1 past its quantum
    plan = decide(snapshot(600.0, [node("a", gpus=2)], [starving, victim]))
    assert [p.job_id for p in plan.preempts] == [2]  # promoted to level 0, so it may preempt level 1
    # A starving 2-node gang (promoted, waited > reservation_after) holds both nodes: the small job
    # that would fit on node b waits instead of taking the GPU the gang needs.
    busy = running(3, [("b", [0, 1, 2])], start=590.0)  # level 0, within its quantum: no victim
    gang = pending(4, gpus=4, nodes=2, attained=200.0, pending_since=0.0, t=0.0)
    small = pending(5, gpus=1, t=10.0)
    plan = decide(snapshot(600.0, [node("a"), node("b")], [busy, gang, small]))
    assert plan.starts == () and dict((w.job_id, w.reason) for w in plan.waits) == {4: "Resources", 5: "Priority"}
    # The same gang not yet starving reserves nothing: the small job starts.
    young = replace(gang, pending_since=500.0)
    plan = decide(snapshot(600.0, [node("a"), node("b")], [busy, young, small]))
    assert [s.job_id for s in plan.starts] == [5]


def test_held_jobs_wait():
    plan = decide(snapshot(0.0, [node("a")], [pending(1, hold=True), pending(2)]))
    assert plan.waits == (Wait(1, "JobHeldUser"),) and [s.job_id for s in plan.starts] == [2]


# ---- properties ------------------------------------------------------------------------------
job_st = st.tuples(st.integers(1, 2), st.integers(0, 4), st.sampled_from(["low", "normal", "urgent"]),
                   st.booleans(), st.floats(0, 5000), st.integers(0, 3))


@settings(max_examples=200, deadline=None)
@given(st.lists(job_st, min_size=1, max_size=20), st.floats(0, 1000))
def test_plan_invariants(specs, now):
    nodes = [node(f"n{i}") for i in range(3)]
    jobs, free = [], {n.name: [0, 1, 2, 3] for n in nodes}
    for i, (nn, g, prio, preemptible, attained, kind) in enumerate(specs):
        if kind == 0:  # try to make it a running job
            names = [n for n in free if len(free[n]) >= g][:nn]
            if len(names) == nn and g > 0:
                alloc = [(n, [free[n].pop(0) for _ in range(g)]) for n in names]
                state = JobState.PREEMPTING if i % 5 == 0 else JobState.RUNNING
                jobs.append(running(i, alloc, start=max(0.0, now - 200), attained=attained, priority=prio,
                                    preemptible=preemptible, state=state))
                continue
        jobs.append(pending(i, gpus=g, nodes=nn, t=i, priority=prio, attained=attained, preemptible=preemptible))
    snap = snapshot(now, nodes, jobs)
    plan = MlfqPolicy(CFG).decide(snap)
    assert plan == MlfqPolicy(CFG).decide(snap)  # same snapshot, same plan
    by_id = {j.id: j for j in jobs}
    held = {(n, g) for j in jobs if j.state.holds_resources for n, gs in j.allocation for g in gs}
    taken = set()
    for a in plan.actions:
        j = by_id[a.job_id]
        if isinstance(a, Start):
            assert j.state == JobState.PENDING and len(set(a.placement.nodes)) == j.nodes
            for n, gs in zip(a.placement.nodes, a.placement.gpus):
                assert len(gs) == j.gpus_per_node
                for g in gs:
                    assert (n, g) not in held and (n, g) not in taken
                    taken.add((n, g))
        elif isinstance(a, Preempt):
            assert j.state == JobState.RUNNING and j.preemptible
            assert by_id[a.for_job].state == JobState.PENDING
        else:
            assert j.state == JobState.PENDING
    pending_ids = [j.id for j in jobs if j.state == JobState.PENDING]
    decided = [a.job_id for a in plan.actions if not isinstance(a, Preempt)]
    assert sorted(decided) == sorted(pending_ids)  # each pending job exactly one start or reason


def test_begin_time_keeps_a_job_waiting_and_wakes_the_policy():
    later = replace(pending(1), begin_time=500.0)
    plan = decide(snapshot(100.0, [node("a")], [later, pending(2)]))
    assert plan.waits == (Wait(1, "BeginTime"),) and [s.job_id for s in plan.starts] == [2]
    assert plan.wake_at == 500.0
    assert [s.job_id for s in decide(snapshot(500.0, [node("a")], [later])).starts] == [1]


def test_prefer_idle_victims_picks_idle_runs_first_when_enabled():
    # Two eligible 2-GPU victims on one node; job 1 has received more service (cheaper victim by
    # default), job 2 sits idle. A 2-GPU job needs one of them.
    jobs = [replace(running(1, [("a", [0, 1])], 0.0, attained=5000.0)),
            replace(running(2, [("a", [2, 3])], 0.0), idle=True), pending(3, gpus=2)]
    snap = snapshot(1000.0, [node("a")], jobs)
    assert [p.job_id for p in decide(snap).preempts] == [1]
    prefer = MlfqPolicy(replace(CFG, prefer_idle_victims=True))
    assert [p.job_id for p in prefer.decide(snap).preempts] == [2]
    # Across nodes too: the node whose victim is idle wins over the one with the cheaper busy victim.
    jobs = [running(1, [("a", [0, 1, 2, 3])], 0.0, attained=5000.0),
            replace(running(2, [("b", [0, 1, 2, 3])], 0.0), idle=True), pending(3, gpus=4)]
    snap = snapshot(1000.0, [node("a"), node("b")], jobs)
    assert [p.job_id for p in prefer.decide(snap).preempts] == [2]
    # Idle is a preference, not a licence: a run the job may not preempt stays, idle or not.
    fresh_idle = replace(running(2, [("a", [2, 3])], 995.0), idle=True)
    jobs = [running(1, [("a", [0, 1])], 0.0, attained=5000.0), fresh_idle, pending(3, gpus=2)]
    assert [p.job_id for p in prefer.decide(snapshot(1000.0, [node("a")], jobs)).preempts] == [1]
