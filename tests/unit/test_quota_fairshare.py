"""Running-GPU limits (core/quota.py, applied around every policy by make_policy) and Slurm's
classic fair share (core/fairshare.py), including its effect on the MLFQ's order."""
from __future__ import annotations

import math
import re
from dataclasses import replace

import pytest

from hai_cluster.config import ConfigError, load_controller_config
from hai_cluster.core.fairshare import decayed_usage, factors, share_tree
from hai_cluster.core.model import GpuInfo, JobView, NodeView, Snapshot
from hai_cluster.core.quota import Quotas
from hai_cluster.core.states import JobState
from hai_cluster.scheduling.plan import Preempt, Start, Wait
from hai_cluster.scheduling.registry import POLICIES, make_policy


def node(name="a", gpus=8, used=()):
    return NodeView(name=name, gpus=tuple(GpuInfo(i, f"{name}{i}", "sim", 1) for i in range(gpus)), cpus=64,
                    mem_mb=10**6, partitions=("gpu",), used_gpus=frozenset(used))


def job(id, user="u", account="default", gpus=1, state=JobState.PENDING, t=0.0, alloc=(), priority="normal",
        start=None):
    return JobView(id=id, user=user, state=state, submit_time=t, nodes=1, gpus_per_node=gpus, partition="gpu",
                   account=account, allocation=alloc, run_start=start, priority=priority,
                   nodelist=tuple(n for n, _ in alloc), time_limit=100)


def snap(jobs, quotas=None, fairshare=None, now=1000.0, gpus=8):
    used = {g for j in jobs if j.state.holds_resources for _, gs in j.allocation for g in gs}
    return Snapshot(now=now, jobs=tuple(jobs), nodes=(node(gpus=gpus, used=used),), quotas=quotas,
                    fairshare=fairshare or {})


def outcome(plan):
    return {a.job_id: ("start" if isinstance(a, Start) else a.reason if isinstance(a, Wait) else "preempt")
            for a in plan.actions}


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_user_gpu_limit_holds_for_every_policy(policy):
    quotas = Quotas(user_gpus={"u": 3})
    jobs = [job(1, gpus=2, state=JobState.RUNNING, alloc=(("a", (0, 1)),), start=0.0),
            job(2, gpus=2, t=1), job(3, gpus=1, t=2), job(4, gpus=1, t=3), job(5, user="v", gpus=4, t=4)]
    plan = make_policy(policy).decide(snap(jobs, quotas))
    got = outcome(plan)
    # u holds 2 of 3: the 2-GPU job waits (QuotaLimit), one 1-GPU job starts, the next would pass it
    assert got[2] == "QuotaLimit" and got[5] == "start"
    assert sorted([got[3], got[4]]) == ["QuotaLimit", "start"]
    # without quotas (and GPUs enough) the same jobs all start
    got = outcome(make_policy(policy).decide(snap(jobs, gpus=16)))
    assert got == {2: "start", 3: "start", 4: "start", 5: "start"}


def test_account_limit_and_per_user_override():
    quotas = Quotas(default_user_gpus=4, user_gpus={"big": 8}, account_gpus={"lab": 6})
    jobs = [job(1, user="a", account="lab", gpus=4, t=1), job(2, user="b", account="lab", gpus=4, t=2),
            job(3, user="big", gpus=8, t=3, account="other")]
    got = outcome(make_policy("fifo").decide(snap(jobs, quotas, gpus=16)))
    assert got == {1: "start", 2: "QuotaLimit", 3: "start"}
    jobs = [job(1, user="a", gpus=5)]  # over the default per-user limit alone
    assert outcome(make_policy("fifo").decide(snap(jobs, quotas))) == {1: "QuotaLimit"}


def test_a_job_over_its_quota_preempts_nobody():
    quotas = Quotas(user_gpus={"boss": 2})
    victim = job(1, user="v", gpus=8, state=JobState.RUNNING, alloc=(("a", tuple(range(8))),), start=0.0)
    urgent = job(2, user="boss", gpus=4, priority="urgent", t=5)
    policy = make_policy("mlfq")
    assert outcome(policy.decide(snap([victim, urgent], quotas))) == {2: "QuotaLimit"}
    plan = policy.decide(snap([victim, urgent]))
    assert any(isinstance(a, Preempt) and a.job_id == 1 for a in plan.actions)


def test_held_jobs_keep_their_own_reason():
    quotas = Quotas(user_gpus={"u": 1})
    held = replace(job(1, gpus=4), hold=True)
    assert outcome(make_policy("fifo").decide(snap([held], quotas))) == {1: "JobHeldUser"}


def test_decayed_usage_halves_per_half_life():
    h = 100.0
    # 2 GPUs for one half-life, ended now: 2 * h/ln2 * (1 - 1/2)
    usage = decayed_usage([("acct", "u", 2, 900.0, 1000.0)], now=1000.0, half_life=h)
    assert usage[("acct", "u")] == pytest.approx(2 * h / math.log(2) * 0.5)
    # the same run, one half-life later, counts half; a running run (end None) counts up to now
    later = decayed_usage([("acct", "u", 2, 900.0, 1000.0)], now=1100.0, half_life=h)
    assert later[("acct", "u")] == pytest.approx(usage[("acct", "u")] / 2)
    running = decayed_usage([("acct", "u", 2, 900.0, None)], now=1000.0, half_life=h)
    assert running == pytest.approx(usage)


def test_classic_fair_share_factors():
    # Two accounts, shares 3:1; a has users x (all of a's use) and y; b has z.
    rows = share_tree({"a": 3, "b": 1}, {"a": ["x", "y"], "b": ["z"]},
                      {("a", "x"): 300.0, ("b", "z"): 100.0})
    by = {(r.account, r.user): r for r in rows}
    assert by[("a", None)].norm_shares == pytest.approx(0.75)
    assert by[("a", None)].effective_usage == pytest.approx(0.75)
    # x: U = 0.75, E = 0.75 + (0.75 - 0.75)/2 = 0.75, S = 0.375 -> F = 2^-2
    assert by[("a", "x")].factor == pytest.approx(0.25)
    # y used nothing: E = 0 + 0.75/2 = 0.375, S = 0.375 -> F = 0.5
    assert by[("a", "y")].factor == pytest.approx(0.5)
    # z: the whole of b's usage, at exactly its share: E = 0.25, S = 0.25 -> F = 0.5
    assert by[("b", "z")].factor == pytest.approx(0.5)
    # nobody used anything: every factor is 1
    assert set(factors(share_tree({"a": 1}, {"a": ["x", "y"]}, {})).values()) == {1.0}


def test_mlfq_orders_a_level_by_fair_share_before_age():
    early = job(1, user="heavy", gpus=8, t=1)
    late = job(2, user="light", gpus=8, t=2)
    shares = {("default", "heavy"): 0.2, ("default", "light"): 0.9}
    got = outcome(make_policy("mlfq").decide(snap([early, late], fairshare=shares)))
    assert got[2] == "start" and got[1] != "start"
    got = outcome(make_policy("mlfq").decide(snap([early, late])))  # no factors: by age
    assert got[1] == "start" and got[2] != "start"
    # fair share never lifts a job above a higher level or class
    demoted = replace(late, attained_gpu_seconds=10**6)
    got = outcome(make_policy("mlfq").decide(snap([early, demoted], fairshare=shares)))
    assert got[1] == "start"


def test_accounts_limits_and_access_config(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[controller]\nadmins = ["ann"]\n[access]\noperators = ["@ops", "otto"]\n'
                    'max_connections_per_uid = 4\n[limits]\nmax_gpus = 8\nmax_pending = 100\n'
                    '[fairshare]\nhalf_life = 3600\n'
                    '[[accounts]]\nname = "vision"\nusers = ["alice", "@cv"]\nshares = 30\nmax_gpus = 16\n'
                    '[[accounts]]\nname = "nlp"\n')
    cfg = load_controller_config(path)
    assert cfg.access.admins == ("ann", "root") and cfg.access.operators == ("@ops", "otto")
    assert cfg.access.max_connections_per_uid == 4
    assert (cfg.user_limits.max_gpus, cfg.user_limits.max_pending, cfg.user_limits.max_jobs) == (8, 100, 0)
    assert [(a.name, a.shares, a.limits.max_gpus, a.users) for a in cfg.accounts] == [
        ("vision", 30, 16, ("alice", "@cv")), ("nlp", 1, 0, ())]
    assert cfg.fairshare.half_life == 3600.0
    for text, message in [('[limits]\nmax_gpus = -1\n', "limits.max_gpus must be >= 0"),
                          ('[[accounts]]\nname = "a b"\n', "accounts[0].name is required"),
                          ('[[accounts]]\nname = "a"\n[[accounts]]\nname = "a"\n', "account names must be unique"),
                          ('[[accounts]]\nname = "a"\nshares = 0\n', "shares must be >= 1"),
                          ('[access]\nadmin = ["x"]\n', "unknown key(s) in [access]: admin"),
                          ('[fairshare]\nhalf_life = 0\n', "fairshare.half_life must be positive")]:
        path.write_text(text)
        with pytest.raises(ConfigError, match=re.escape(message)):
            load_controller_config(path)


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_priority_class_limit_per_user(policy):
    """[limits.classes] urgent = { max_gpus = 4 }: one user's running urgent jobs hold at most 4
    GPUs; their normal jobs and another user's urgent jobs are not counted against it."""
    quotas = Quotas(class_user_gpus={"urgent": 4})
    assert quotas and not Quotas(class_user_gpus={"urgent": 0})
    jobs = [job(1, gpus=2, priority="urgent", state=JobState.RUNNING, alloc=(("a", (0, 1)),), start=0.0),
            job(2, gpus=2, priority="normal", state=JobState.RUNNING, alloc=(("a", (2, 3)),), start=0.0),
            job(3, gpus=2, priority="urgent", t=1), job(4, gpus=2, priority="urgent", t=2),
            job(5, user="v", gpus=4, priority="urgent", t=3), job(6, gpus=1, priority="normal", t=4)]
    got = outcome(make_policy(policy).decide(snap(jobs, quotas, gpus=16)))
    # u's urgent jobs: 2 running + 2 (job 3) = 4; job 4 would make 6 (of one size with job 3, so
    # that the MLFQ's Gittins order, which puts smaller jobs first, keeps submit order here)
    assert got[3] == "start" and got[4] == "QuotaLimit", got
    assert got[5] == "start" and got[6] == "start", got
    # a single urgent job over the class limit waits even on an empty cluster
    assert outcome(make_policy(policy).decide(snap([job(7, gpus=5, priority="urgent")], quotas))) == {7: "QuotaLimit"}


def test_priority_class_limits_config(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[limits]\nmax_gpus = 8\n[limits.classes]\nurgent = { max_gpus = 4 }\nhigh = { max_gpus = 6 }\n')
    cfg = load_controller_config(path)
    assert cfg.class_limits == (("urgent", 4), ("high", 6)) and cfg.user_limits.max_gpus == 8
    for text, message in [('[limits.classes]\nvip = { max_gpus = 1 }\n', "limits.classes.vip: no such priority class"),
                          ('[limits.classes]\nurgent = 3\n', "limits.classes.urgent must be a table"),
                          ('[limits.classes]\nurgent = { max_gpus = -1 }\n', "max_gpus must be >= 0"),
                          ('[limits.classes]\nurgent = { max_jobs = 1 }\n',
                           "unknown key(s) in [limits.classes.urgent]: max_jobs")]:
        path.write_text(text)
        with pytest.raises(ConfigError, match=re.escape(message)):
            load_controller_config(path)


def test_the_ledger_gives_what_decayed_usage_gives_over_the_same_runs():
    """UsageLedger (controller/usage.py feeds it what changed) against the full recomputation:
    runs told live and later ended, runs told already ended, refreshes at random times."""
    import random
    from hai_cluster.core.fairshare import UsageLedger
    rng = random.Random(7)
    h = 3600.0
    ledger, told, now = UsageLedger(h), {}, 0.0
    runs: dict[int, list] = {}
    for step in range(300):
        now += rng.uniform(0, 900)
        for run_id, r in list(runs.items()):  # some live runs end (a little before now)
            if r[4] is None and rng.random() < 0.2:
                r[4] = now - rng.uniform(0, 60)
                told[run_id] = "ended"
                ledger.advance(now)
                ledger.ended_run(run_id, tuple(r))
        for _ in range(rng.randint(0, 3)):  # new runs: some already ended when first seen
            run_id = len(runs) + 1
            start = now - rng.uniform(0, 1200)
            end = None if rng.random() < 0.5 else min(now, start + rng.uniform(1, 600))
            runs[run_id] = [rng.choice(["a", "b"]), rng.choice(["x", "y", "z"]), rng.choice([1, 2, 0.25]), start, end]
            ledger.advance(now)
            if end is None:
                ledger.live[run_id] = tuple(runs[run_id])
            else:
                ledger.ended_run(run_id, tuple(runs[run_id]))
        if step % 10 == 0:
            expected = decayed_usage([tuple(r) for r in runs.values()], now, h)
            got = ledger.usage(now)
            assert set(got) == set(expected)
            for key, value in expected.items():
                assert got[key] == pytest.approx(value, rel=1e-9, abs=1e-9)
