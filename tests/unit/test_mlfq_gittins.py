"""The MLFQ's Gittins order (scheduling/gittins.py over core/sizemodel.py): ranks on known
distributions, cost-aware preemption, and the simulator feeding the model as the controller will."""
from dataclasses import replace

import pytest

from hai_cluster.core.model import Snapshot
from hai_cluster.core.sizemodel import FinishedJob, SizeModel, rebuild
from hai_cluster.core.states import JobState
from hai_cluster.scheduling.gittins import Ranker, RankSettings, explain, rank_table
from hai_cluster.scheduling.mlfq import MlfqConfig, MlfqPass, MlfqPolicy
from hai_cluster.scheduling.plan import Preempt, Start
from hai_cluster.sim.cluster import Cluster
from hai_cluster.sim.engine import simulate
from hai_cluster.sim.traces import TraceJob

from .test_mlfq import node, pending, running, snapshot

GITTINS = MlfqConfig(order="gittins", restart_cost=30.0)


def with_sizes(snap: Snapshot, model: SizeModel) -> Snapshot:
    return replace(snap, sizes=model)


def test_gittins_prefers_a_job_near_its_known_end_where_las_prefers_the_new_one():
    # Every job of this kind runs ~1000 s (an increasing hazard): at 700 s of service a job is
    # nearly done, so its rank is far below a fresh job's. LAS would rank it behind.
    model = rebuild([FinishedJob(1, 1000.0)] * 200)
    r = Ranker(model, RankSettings())
    old, new = running(1, [("a", [0])], start=0.0), pending(2)
    assert r.rank(old, now=700.0) < r.rank(new, now=700.0) / 2
    snap = with_sizes(snapshot(700.0, [node("a", gpus=1)], [old, new]), model)
    assert not MlfqPolicy(GITTINS).decide(snap).preempts
    las = MlfqConfig(order="las", thresholds=(100.0,), quanta=(10.0, 10.0))
    assert [p.job_id for p in MlfqPolicy(las).decide(snap).preempts] == [1]


def test_gittins_is_least_attained_service_on_a_decreasing_hazard():
    # No data: the log-uniform prior; its rank grows with service received, as LAS orders.
    table = rank_table(SizeModel().distribution(1).probs)[1:36]  # 10 s to ~2 years
    assert all(a <= b for a, b in zip(table, table[1:]))
    # A learned heavy tail: 90 % end at ~100 s, 10 % at ~100,000 s. Past the short mode a job is
    # one of the long ones: its rank jumps by orders of magnitude.
    model = rebuild([FinishedJob(1, 100.0)] * 90 + [FinishedJob(1, 100000.0)] * 10)
    r = Ranker(model, RankSettings())
    assert r.rank(running(1, [("a", [0])], start=0.0), now=400.0) > 50 * r.rank(pending(2), now=400.0)


def test_order_by_expected_gpu_time_learned_per_gpu_count():
    a, b = pending(1, gpus=1, t=0.0), pending(2, gpus=4, t=1.0)
    snap = snapshot(10.0, [node("a", gpus=4, used=(0, 1, 2))], [a, b])
    # No data: GPU-time scales with GPUs, so the 1-GPU job goes first (here: the only one that fits).
    queue = [j.id for j, _, _ in MlfqPass(GITTINS, snap).queue()]
    assert queue == [1, 2]
    # Learned: 1-GPU jobs run for days, 4-GPU jobs a minute: the 4-GPU job goes first.
    model = rebuild([FinishedJob(1, 300000.0)] * 30 + [FinishedJob(4, 60.0)] * 30)
    queue = [j.id for j, _, _ in MlfqPass(GITTINS, with_sizes(snap, model)).queue()]
    assert queue == [2, 1]


def test_no_preemption_of_a_run_likely_to_end_within_the_restart_cost():
    # Jobs of this kind end at 1,000-1,090 s; the run has 1,050 s: likely to end within 2 x 100 s.
    model = rebuild([FinishedJob(1, 1000.0 + 10 * (k % 10)) for k in range(100)])
    victim = running(1, [("a", [0])], start=0.0)
    cfg = replace(GITTINS, restart_cost=100.0)
    snap = with_sizes(snapshot(1050.0, [node("a", gpus=1)], [victim, pending(2)]), model)
    assert MlfqPass(cfg, snap).likely_done(victim)
    assert not MlfqPass(replace(cfg, finish_likely=1.0), snap).likely_done(victim)
    assert not MlfqPolicy(cfg).decide(snap).preempts


def test_a_long_run_yields_only_after_its_minimum_run_and_to_a_much_better_rank():
    model = rebuild([FinishedJob(1, 60.0)] * 90 + [FinishedJob(1, 200000.0)] * 10)
    victim = running(1, [("a", [0])], start=0.0)
    jobs = [victim, pending(2, t=1.0)]
    fresh = with_sizes(snapshot(200.0, [node("a", gpus=1)], jobs), model)  # 200 s < 10 x 30 s
    assert not MlfqPolicy(GITTINS).decide(fresh).preempts
    ripe = with_sizes(snapshot(400.0, [node("a", gpus=1)], jobs), model)
    plan = MlfqPolicy(GITTINS).decide(ripe)
    assert [(p.job_id, p.for_job) for p in plan.preempts] == [(1, 2)]
    assert "Gittins rank" in next(a for a in plan.actions if isinstance(a, Preempt)).reason
    # a wider margin asks for more levels between them than there are
    assert not MlfqPolicy(replace(GITTINS, preempt_margin=40)).decide(ripe).preempts


def test_explain_says_why_a_job_sits_where_it_does():
    model = rebuild([FinishedJob(8, 7200.0, user="ann")] * 20)
    job = replace(pending(1, gpus=8), user="ann")
    e = explain(model, job, now=0.0)
    assert e["source"] == "g8/u:ann" and e["samples"] == pytest.approx(20, rel=0.05)
    assert e["level"] >= 0 and e["rank_gpu_s"] > 0 and e["median_remaining_s"] > 3600
    assert "Gittins rank" in e["text"] and "g8/u:ann" in e["text"]
    assert "no finished jobs yet" in explain(SizeModel(), job, now=0.0)["text"]


def test_start_reasons_carry_the_rank():
    plan = MlfqPolicy(GITTINS).decide(snapshot(0.0, [node("a")], [pending(1)]))
    start = next(a for a in plan.actions if isinstance(a, Start))
    assert "Gittins rank" in start.reason


class Recorder:
    """A policy that records what the model in each snapshot had seen, around the real MLFQ."""
    name = "mlfq"

    def __init__(self):
        self.inner, self.seen = MlfqPolicy(MlfqConfig()), []

    def decide(self, snap):
        self.seen.append((snap.now, snap.sizes.seen))
        return self.inner.decide(snap)


def test_the_simulator_feeds_only_jobs_that_ended_and_starts_empty():
    jobs = [TraceJob(f"j{i}", float(10 * i), 100.0 + i, 1) for i in range(6)]  # one GPU: they queue
    rec = Recorder()
    res = simulate(rec, jobs, Cluster(1, 1), restart_cost=0.0)
    ends = sorted(r.end for r in res.records)
    assert rec.seen[0] == (0.0, 0)
    for now, seen in rec.seen:
        assert seen == sum(1 for e in ends if e <= now)
    rec2 = Recorder()
    simulate(rec2, jobs, Cluster(1, 1), restart_cost=0.0)
    assert rec2.seen == rec.seen  # a fresh model in each run: the same replay twice


@pytest.mark.parametrize("order", ["gittins", "las"])
def test_a_pass_tells_at_most_max_preemptions_runs_to_leave(order):
    # Six old 1-GPU runs fill six nodes; six new jobs outrank them. With a bound of 4, the first
    # pass takes 4 runs (and never splits a job's victims), the next pass takes the rest.
    nodes = [node(f"n{i}", gpus=1) for i in range(6)]
    runs = [running(i + 1, [(f"n{i}", [0])], start=0.0, attained=1e6) for i in range(6)]
    new = [pending(10 + i, t=5000.0) for i in range(6)]
    cfg = MlfqConfig(order=order, max_preemptions=4, thresholds=(100.0,), quanta=(10.0, 10.0))
    plan = MlfqPolicy(cfg).decide(snapshot(10_000.0, nodes, runs + new))
    assert len(plan.preempts) == 4
    taken = {p.job_id for p in plan.preempts}
    leaving = [replace(j, state=JobState.PREEMPTING) if j.id in taken else j for j in runs]
    plan2 = MlfqPolicy(cfg).decide(snapshot(10_000.0, nodes, leaving + new))
    assert len(plan2.preempts) == 2 and not {p.job_id for p in plan2.preempts} & taken
    unbounded = MlfqPolicy(replace(cfg, max_preemptions=0)).decide(snapshot(10_000.0, nodes, runs + new))
    assert len(unbounded.preempts) == 6
    with pytest.raises(ValueError):
        MlfqConfig(max_preemptions=-1)


def test_an_old_job_goes_first_preempts_a_young_run_and_is_not_preempted_when_running():
    # Every job of this kind runs ~1000 s: with lift_factor 3 a job is old 3000 s after submission.
    model = rebuild([FinishedJob(1, 1000.0)] * 200)
    cfg = replace(GITTINS, lift_factor=3.0, lift_floor=0.0)
    # 2000 s of service, past the kind's ~1000 s: one of the rare long ones, far down the order
    young_run = replace(running(1, [("a", [0])], start=1700.0), submit_time=1600.0)
    old_job, new_job = pending(2, t=0.0, attained=900.0), pending(3, t=3600.0)
    snap = with_sizes(snapshot(3700.0, [node("a", gpus=1)], [young_run, old_job, new_job]), model)
    assert [j.id for j, _, _ in MlfqPass(cfg, snap).queue()][0] == 2
    plan = MlfqPolicy(cfg).decide(snap)
    assert [p.job_id for p in plan.preempts] == [1]
    # Running, an old job is not a victim (the young one would outrank it in the Gittins order).
    old_run = replace(running(2, [("a", [0])], start=1700.0), submit_time=0.0)
    snap = with_sizes(snapshot(3700.0, [node("a", gpus=1)], [old_run, pending(3, t=3600.0)]), model)
    assert not MlfqPolicy(cfg).decide(snap).preempts
    assert MlfqPolicy(replace(cfg, lift_factor=0.0)).decide(snap).preempts


@pytest.mark.parametrize("order", ["gittins", "las"])
def test_the_level_hqueue_shows_is_the_level_a_pass_serves(order):
    # hqueue's LEVEL (learned.level_now, from the job table's columns) is the level the pass
    # orders and preempts by, in either order; the default order is gittins.
    from hai_cluster.scheduling.learned import level_now
    assert MlfqConfig().order == "gittins"
    cfg = MlfqConfig(order=order, thresholds=(100.0, 1000.0), quanta=(10.0, 50.0, 100.0))
    model = rebuild([FinishedJob(1, 20.0)] * 30 + [FinishedJob(4, 5000.0, user="u")] * 10)
    jobs = [pending(1, gpus=1), pending(2, gpus=4, attained=800.0), pending(3, gpus=2, attained=40_000.0),
            running(4, [("a", [0, 1])], start=0.0, attained=0.0), running(5, [("b", [0])], start=500.0, attained=30.0)]
    snap = with_sizes(snapshot(2000.0, [node("a"), node("b")], jobs), model)
    p = MlfqPass(cfg, snap)
    served = {j.id: level for j, level, _ in p.queue()}
    served.update({j.id: p.level(j) for j in p.running})
    shown = {j.id: level_now(cfg, model, j.gpus, j.user, j.name, j.attained(2000.0)) for j in jobs}
    assert shown == served
    assert len(set(shown.values())) > 1  # (levels that differ: the comparison means something)


@pytest.mark.parametrize("key", ["restart_cost", "level_ratio", "min_run_restarts", "finish_window"])
def test_settings_that_are_not_finite_numbers_are_refused(key):
    with pytest.raises(ValueError, match=f"mlfq {key} must be a finite number"):
        MlfqConfig(**{key: float("nan")})


def test_hai_dev_refuses_a_restart_cost_that_is_not_a_finite_number_before_touching_anything(tmp_path):
    from click.testing import CliRunner

    from hai_cluster.dev import main
    target = tmp_path / "dev"
    for bad in ("nan", "inf", "-1"):
        got = CliRunner().invoke(main, ["up", "--dir", str(target), "--restart-cost", bad])
        assert got.exit_code == 2 and "--restart-cost" in got.output, got.output
        assert not target.exists()
