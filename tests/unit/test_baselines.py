"""SJF, Tiresias 2D-LAS and EASY backfill: decisions on hand-made snapshots, and replays."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hai_cluster.core.model import GpuInfo, JobView, NodeView, Snapshot
from hai_cluster.core.states import JobState
from hai_cluster.scheduling.baselines.backfill import reservation
from hai_cluster.scheduling.baselines.workspace import Workspace
from hai_cluster.scheduling.plan import Preempt, Start, Wait
from hai_cluster.scheduling.registry import make_policy
from hai_cluster.sim.cluster import Cluster
from hai_cluster.sim.engine import simulate
from hai_cluster.sim.traces import TraceJob


def node(name, gpus=4, used=()):
    return NodeView(name=name, gpus=tuple(GpuInfo(i, f"GPU-{name}-{i}", "sim", 1000) for i in range(gpus)),
                    cpus=64, mem_mb=100_000, used_gpus=frozenset(used))


def pending(id, gpus=1, t=None, limit=None, attained=0.0, nodes=1):
    return JobView(id=id, user="u", state=JobState.PENDING, submit_time=t if t is not None else id, nodes=nodes,
                   gpus_per_node=gpus, time_limit=limit, attained_gpu_seconds=attained)


def running(id, on, gpus, start=0.0, t=None, limit=None, attained=0.0, preemptible=True):
    """A job running on node `on` holding GPU indices `gpus` since `start`."""
    return JobView(id=id, user="u", state=JobState.RUNNING, submit_time=t if t is not None else id, nodes=1,
                   gpus_per_node=len(gpus), run_start=start, nodelist=(on,), allocation=((on, tuple(gpus)),),
                   time_limit=limit, attained_gpu_seconds=attained, preemptible=preemptible)


def snap(now, sizes, jobs):
    """A snapshot whose nodes' used GPUs are exactly what the running jobs hold."""
    used = {}
    for j in jobs:
        for name, gpus in j.allocation:
            used.setdefault(name, set()).update(gpus)
    return Snapshot(now=now, nodes=tuple(node(n, g, used.get(n, ())) for n, g in sizes.items()), jobs=tuple(jobs))


def by_type(plan):
    return ({a.job_id for a in plan.actions if isinstance(a, Start)},
            {a.job_id for a in plan.actions if isinstance(a, Preempt)},
            {a.job_id: a.reason for a in plan.actions if isinstance(a, Wait)})


def test_registry_knows_the_baselines():
    for name in ("fifo", "sjf", "tiresias", "backfill"):
        assert make_policy(name).name == name
    assert make_policy("tiresias", thresholds=[10, 20]).thresholds == (10.0, 20.0)
    with pytest.raises(ValueError):
        make_policy("tiresias", thresholds=[20, 10])


# ---- SJF ------------------------------------------------------------------------------------
def test_sjf_picks_the_shortest_and_skips_what_does_not_fit():
    snap = Snapshot(now=0, nodes=(node("a", used=(0, 1)),), jobs=(
        pending(1, limit=100), pending(2, limit=5, gpus=4), pending(3, limit=50), pending(4, limit=60),
        pending(5, limit=None)))
    starts, preempts, waits = by_type(make_policy("sjf").decide(snap))
    assert starts == {3, 4} and not preempts  # 2 is shorter but needs 4 GPUs; 2 GPUs are free
    assert waits == {1: "Resources", 2: "Resources", 5: "Resources"}


# ---- Tiresias -------------------------------------------------------------------------------
def test_tiresias_queues_by_attained_gpu_seconds_not_time():
    las = make_policy("tiresias", thresholds=[100, 1000])
    assert [las.level(x) for x in (0, 99, 100, 999, 1000, 10**9)] == [0, 0, 1, 1, 2, 2]
    # 30 s on 4 GPUs = 120 GPU-s (queue 1) while 60 s on 1 GPU = 60 GPU-s (queue 0): the 4-GPU job
    # is preempted for a new job although it has run for less time.
    plan = las.decide(snap(60, {"a": 5}, (
        running(1, "a", (0, 1, 2, 3), start=30), running(2, "a", (4,), start=0), pending(3, gpus=1, t=60))))
    starts, preempts, waits = by_type(plan)
    assert preempts == {1} and waits == {3: "WaitingForCheckpoint"} and not starts
    assert next(a for a in plan.actions if isinstance(a, Preempt)).for_job == 3


def test_tiresias_never_preempts_for_the_same_queue():
    las = make_policy("tiresias", thresholds=[100])
    starts, preempts, waits = by_type(las.decide(snap(10, {"a": 1}, (running(1, "a", (0,), start=0), pending(2, t=5)))))
    assert not starts and not preempts and waits == {2: "Resources"}


def test_tiresias_victims_lowest_queue_newest_first_and_only_as_many_as_needed():
    las = make_policy("tiresias", thresholds=[100, 1000])
    jobs = (running(1, "a", (0,), start=1000, t=1),  # 1000 GPU-s: queue 2, oldest
            running(2, "a", (1,), start=1000, t=2),  # queue 2, newest: the first victim
            running(3, "a", (2,), start=1800, t=3),  # 200 GPU-s: queue 1
            running(4, "a", (3,), start=1999, t=4, preemptible=False))
    starts, preempts, waits = by_type(las.decide(snap(2000, {"a": 4}, jobs + (pending(5, gpus=1, t=1999),))))
    assert preempts == {2} and waits == {5: "WaitingForCheckpoint"}
    # both queue-2 jobs go; the queue-1 one keeps running
    assert by_type(las.decide(snap(2000, {"a": 4}, jobs + (pending(5, gpus=2, t=1999),))))[1] == {1, 2}


def test_tiresias_skips_a_job_that_does_not_fit_and_does_not_preempt_the_unpreemptible():
    las = make_policy("tiresias", thresholds=[100])
    starts, preempts, waits = by_type(las.decide(snap(500, {"a": 2}, (
        running(1, "a", (0,), start=0, preemptible=False), pending(2, gpus=2, t=1), pending(3, gpus=1, t=2)))))
    assert starts == {3} and not preempts and waits == {2: "Resources"}


def test_tiresias_wakes_when_a_running_job_crosses_below_a_waiting_one():
    las = make_policy("tiresias", thresholds=[100])
    plan = las.decide(snap(10, {"a": 2}, (running(1, "a", (0, 1), start=0), pending(2, gpus=1, t=5))))
    assert plan.wake_at == pytest.approx(50)  # 2 GPUs reach 100 GPU-s at t=50


def test_tiresias_replay_preempts_and_restarts():
    jobs = [TraceJob("long", 0, 1000, 1), TraceJob("short", 100, 10, 1)]
    res = simulate(make_policy("tiresias", thresholds=[50]), jobs, Cluster(1, 1), restart_cost=0)
    assert {r.trace_id: (r.first_start, r.end, r.preemptions) for r in res.records} == {
        "long": (0, 1010, 1), "short": (100, 110, 0)}


# ---- EASY backfill --------------------------------------------------------------------------
def test_backfill_reserves_for_the_head_and_backfills_around_it():
    # 2 nodes x 4 GPUs. Running: job 1 holds 3 GPUs of a until t=100; job 2 holds all of b until 50.
    # Head (job 3) needs 4 GPUs: it gets node b at t=50 (shadow time).
    nodes = (node("a", used=(0, 1, 2)), node("b", used=(0, 1, 2, 3)))
    base = (running(1, "a", (0, 1, 2), start=0, limit=100), running(2, "b", (0, 1, 2, 3), start=0, limit=50),
            pending(3, gpus=4, t=1, limit=10))
    snap = Snapshot(now=10, nodes=nodes, jobs=base)
    shadow, spare = reservation(snap, Workspace(nodes), base[2], [])
    assert shadow == 50 and spare == {"a": 1, "b": 0}
    policy = make_policy("backfill")
    # a 1-GPU job on a: a's spare GPU is outside the reservation, any length backfills
    starts, _, waits = by_type(policy.decide(Snapshot(now=10, nodes=nodes, jobs=base + (pending(4, t=2, limit=1000),))))
    assert starts == {4} and waits == {3: "Resources"}


def test_backfill_never_takes_the_heads_reserved_gpus_past_the_shadow_time():
    # One node, 4 GPUs, 2 free now; job 1 holds the other 2 until t=100. The head needs all 4 at 100.
    nodes = (node("a", used=(0, 1)),)
    jobs = (running(1, "a", (0, 1), start=0, limit=100), pending(2, gpus=4, t=1, limit=10))
    policy = make_policy("backfill")
    short = pending(3, gpus=2, t=2, limit=90)  # ends at 100: fine
    long = pending(4, gpus=1, t=3, limit=91)  # ends at 101: would delay the head
    starts, _, waits = by_type(policy.decide(Snapshot(now=10, nodes=nodes, jobs=jobs + (long, short))))
    assert starts == {3} and waits == {2: "Resources", 4: "Priority"}


def test_backfill_is_fifo_without_runtime_estimates():
    nodes = (node("a", used=(0, 1)),)
    jobs = (running(1, "a", (0, 1), start=0, limit=None), pending(2, gpus=4, t=1), pending(3, gpus=1, t=2, limit=5))
    starts, _, waits = by_type(make_policy("backfill").decide(Snapshot(now=10, nodes=nodes, jobs=jobs)))
    assert not starts and waits == {2: "Resources", 3: "Priority"}


class RecordReservations:
    """Backfill, recording the first shadow time computed for each head job."""
    name = "backfill"

    def __init__(self):
        self.policy, self.promised = make_policy("backfill"), {}

    def decide(self, snap):
        plan = self.policy.decide(snap)
        heads = [a.job_id for a in plan.actions if isinstance(a, Wait) and a.reason == "Resources"]
        if heads:
            head = next(j for j in snap.jobs if j.id == heads[0])
            ws = Workspace(snap.nodes)
            started = []
            for a in plan.actions:
                if isinstance(a, Start) and a.reason == "first in priority order that fits":
                    job = next(j for j in snap.jobs if j.id == a.job_id)
                    ws.take(job, a.placement)
                    started.append((job, a.placement))
            shadow, _ = reservation(snap, ws, head, started)
            if shadow is not None:
                self.promised.setdefault(head.id, shadow)
        return plan


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(1, 80), st.sampled_from([1, 1, 2, 3, 4, 8])),
                min_size=1, max_size=14))
def test_backfill_never_delays_the_heads_reservation(specs):
    jobs = [TraceJob(f"j{i}", s, d, g) for i, (s, d, g) in enumerate(specs)]
    rec = RecordReservations()
    res = simulate(rec, jobs, Cluster(2, 4))
    start = {r.id: r.first_start for r in res.records}
    for job_id, shadow in rec.promised.items():
        assert start[job_id] <= shadow + 1e-9
