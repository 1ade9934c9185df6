"""The accounts side of the store on both databases: live limit overrides (upsert), job counts
for submission limits, and the runs fair share is computed from."""
import pytest

from hai_cluster.core.model import Placement
from hai_cluster.store import accounts
from hai_cluster.store.repository import spec_size

from .test_store import engine, repo, spec  # noqa: F401 (fixtures)


def test_overrides_upsert(engine):  # noqa: F811
    assert accounts.overrides(engine) == {}
    accounts.set_override(engine, "account", "lab", {"max_gpus": 8}, "root", 1.0)
    accounts.set_override(engine, "account", "lab", {"shares": 3}, "root", 2.0)
    accounts.set_override(engine, "user", "ann", {"max_pending": 5}, "root", 3.0)
    assert accounts.overrides(engine) == {
        ("account", "lab"): {"shares": 3, "max_gpus": 8, "max_pending": None, "max_jobs": None},
        ("user", "ann"): {"shares": None, "max_gpus": None, "max_pending": 5, "max_jobs": None}}


def test_counts_usage_and_members(repo):  # noqa: F811
    a = repo.submit(spec(gpus_per_node=2), user="ann", uid=1, gid=1, partition="gpu", now=10, account="lab")
    repo.submit(spec(), user="ann", uid=1, gid=1, partition="gpu", now=11, account="lab")
    repo.submit(spec(), user="bob", uid=2, gid=2, partition="gpu", now=12)
    repo.start_run(a, Placement(("a",), ((0, 1),)), now=20)
    pending_bytes = spec_size(spec().to_wire())  # ann's one pending job's spec, as stored
    assert accounts.job_counts(repo.engine, "ann", "lab") == {
        "user_pending": 1, "user_jobs": 2, "user_pending_bytes": pending_bytes, "account_pending": 1,
        "account_jobs": 2}
    assert accounts.job_counts(repo.engine, "bob", "default")["account_pending"] == 1
    assert accounts.usage_runs(repo.engine, since=0.0) == [("lab", "ann", 2, 20.0, None)]
    assert sorted(accounts.open_members(repo.engine)) == [("default", "bob"), ("lab", "ann")]


def test_usage_tracker_reads_what_changed_and_agrees_with_the_full_read(repo, monkeypatch):  # noqa: F811
    """Ninth audit: fair share read every run of the lookback (4 s at 2,000,000 runs) every 10 s
    and for every hshare. UsageTracker reads the runs after the last id it read (a few at a time
    while it catches up) and the runs it knew live; the usage is the full read's."""
    from hai_cluster.controller import usage
    from hai_cluster.core.fairshare import decayed_usage
    from hai_cluster.protocol.runspec import RunStatus
    monkeypatch.setattr(usage, "CHUNK", 2)
    cpu_only = repo.submit(spec(), user="dan", uid=1, gid=1, partition="gpu", now=1, account="lab")
    assert repo.start_run(cpu_only, Placement(("a",), ((),)), now=5)  # charged nothing: read, not counted
    jobs = [repo.submit(spec(gpus_per_node=1), user=u, uid=1, gid=1, partition="gpu", now=1, account="lab")
            for u in ("ann", "bob", "ann", "cy")]
    slots = [("a", 0), ("a", 1), ("b", 0), ("b", 1)]
    for i, j in enumerate(jobs[:3]):
        assert repo.start_run(j, Placement((slots[i][0],), ((slots[i][1],),)), now=10 + i)
    repo.rank_ended(jobs[0], 0, "a", RunStatus(jobs[0], 0, 0, state="ended", exit_code=0, end_time=50.0), now=50)
    tracker = usage.UsageTracker(half_life=100.0)

    def full(now):
        return decayed_usage(accounts.usage_runs(repo.engine, 0.0), now, 100.0)

    first = tracker.refresh(repo.engine, 60.0)  # two runs of four (one charged nothing): more to read
    assert tracker.behind and len(first) <= 1
    tracker.refresh(repo.engine, 65.0)
    got = tracker.refresh(repo.engine, 70.0)
    assert not tracker.behind and got == pytest.approx(full(70.0))
    # a live run ends, a new one starts and ends before the next refresh
    repo.rank_ended(jobs[1], 0, "a", RunStatus(jobs[1], 0, 0, state="ended", exit_code=0, end_time=80.0), now=80)
    assert repo.start_run(jobs[3], Placement(("b",), ((1,),)), now=82)
    repo.rank_ended(jobs[3], 0, "b", RunStatus(jobs[3], 0, 0, state="ended", exit_code=1, end_time=90.0), now=90)
    got = tracker.refresh(repo.engine, 95.0)
    assert set(got) == {("lab", "ann"), ("lab", "bob"), ("lab", "cy")} and got == pytest.approx(full(95.0))
    assert list(tracker.ledger.live) == [4]  # only jobs[2]'s run is still going (run id 4)
