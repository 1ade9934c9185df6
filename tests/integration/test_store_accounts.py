"""The accounts side of the store on both databases: live limit overrides (upsert), job counts
for submission limits, and the runs fair share is computed from."""
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
