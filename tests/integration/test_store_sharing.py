"""The store with fractional GPUs: requests kept, shares recorded, re-checked, and in the snapshot."""
import pytest

from hai_cluster.controller.dispatch import rank_spec
from hai_cluster.core.model import JobSpec, Placement
from hai_cluster.core.sharing import GpuShare
from hai_cluster.protocol.runspec import RunStatus
from hai_cluster.store.engine import make_engine, upgrade
from hai_cluster.store.repository import Repository


def ended(**kw) -> RunStatus:
    """A rank's final status as its agent reports it."""
    return RunStatus(job_id=0, attempt=0, rank=0, state="ended", **kw)


@pytest.fixture(params=["sqlite", "postgresql"])
def repo(request, tmp_path):
    url = f"sqlite:///{tmp_path}/hai.db" if request.param == "sqlite" else request.getfixturevalue("postgres_url")
    eng = make_engine(url)
    upgrade(eng)
    r = Repository(eng)
    r.register_nodes([("a", "10.0.0.1", ["gpu"])], now=0.0)
    r.update_inventory("a", {"cpus": 8, "mem_mb": 1000, "gpu_backend": "simulated", "gpus": [
        {"index": 0, "uuid": "a0", "name": "sim", "memory_mb": 81920, "shareable": True, "isolation": "mps",
         "links": [[1, 4, 10]]},
        {"index": 1, "uuid": "a1", "name": "sim", "memory_mb": 81920, "links": [[0, 4, 10]]}]}, now=1.0)
    r.set_responding("a", True, now=1.0)
    yield r
    eng.dispose()


def submit(repo, **kw):
    return repo.submit(JobSpec(script="#!/bin/sh\ntrue\n", workdir="/tmp", **kw), user="u", uid=1, gid=1,
                       partition="gpu", now=1)


def test_inventory_and_snapshot_carry_shares(repo):
    j = submit(repo, gpu_fraction=0.5, gpu_qos="best-effort")
    w = submit(repo, gpu_mem_mb=8192, gpu_compute=30)
    snap = repo.load_snapshot(now=2)
    (node,) = snap.nodes
    assert [(g.shareable, g.isolation, g.links) for g in node.gpus] == [(True, "mps", ((1, 4, 10),)),
                                                                       (False, "none", ((0, 4, 10),))]
    views = {v.id: v for v in snap.jobs}
    assert views[j].gpu_share == GpuShare(fraction=0.5, qos="best-effort")
    assert views[w].gpu_share == GpuShare(mem_mb=8192, compute=30) and views[w].gpus_per_node == 0
    assert repo.start_run(j, Placement(("a",), ((0,),), shares=((40960, 0),)), now=3)
    assert repo.start_run(w, Placement(("a",), ((0,),), shares=((8192, 30),)), now=3)
    (node,) = repo.load_snapshot(now=4).nodes
    assert node.shared == ((0, 49152, 30, 2),) and node.used_gpus == {0}
    ranks = repo.runs(job_ids=[w])
    assert ranks[0]["gpus"] == 0  # no whole GPU held


def test_start_of_a_share_is_rechecked(repo):
    a, b, c, d = (submit(repo, gpu_mem_mb=40960) for _ in range(4))
    assert repo.start_run(a, Placement(("a",), ((0,),), shares=((40960, 0),)), now=2)
    assert repo.start_run(b, Placement(("a",), ((0,),), shares=((40960, 0),)), now=2)
    assert not repo.start_run(c, Placement(("a",), ((0,),), shares=((40960, 0),)), now=2)  # memory full
    assert not repo.start_run(c, Placement(("a",), ((1,),), shares=((40960, 0),)), now=2)  # not shareable
    whole = submit(repo, gpus_per_node=1)
    assert not repo.start_run(whole, Placement(("a",), ((0,),)), now=2)  # holds shares
    assert repo.start_run(whole, Placement(("a",), ((1,),)), now=2)
    repo.update_inventory("a", {"cpus": 8, "mem_mb": 1000, "gpu_backend": "simulated", "gpus": [
        {"index": i, "uuid": f"a{i}", "name": "sim", "memory_mb": 81920, "shareable": True} for i in (0, 1)]},
        now=3)
    assert not repo.start_run(d, Placement(("a",), ((1,),), shares=((40960, 0),)), now=3)  # held whole


def test_an_agent_without_sharing_fields_is_understood(repo):
    repo.update_inventory("a", {"cpus": 8, "mem_mb": 1000, "gpu_backend": "simulated", "gpus": [
        {"index": 0, "uuid": "a0", "name": "sim", "memory_mb": 10, "isolation": "weird", "links": [[1]]}]}, now=2)
    (node,) = repo.load_snapshot(now=3).nodes
    assert [(g.shareable, g.isolation, g.links) for g in node.gpus] == [(False, "none", ())]


def test_sharing_runs_are_charged_their_share(repo):
    from hai_cluster.store.accounts import usage_runs
    half = submit(repo, gpu_fraction=0.5)  # half the card: 0.5
    small = submit(repo, gpu_mem_mb=8192, gpu_compute=30)  # 8/80 of the memory, 30 % compute: 0.3
    assert repo.start_run(half, Placement(("a",), ((0,),), shares=((40960, 50),)), now=10)
    assert repo.start_run(small, Placement(("a",), ((0,),), shares=((8192, 30),)), now=10)
    views = {v.id: v for v in repo.load_snapshot(now=110).jobs}
    assert views[half].gpu_charge == 0.5 and views[half].attained(110) == pytest.approx(50.0)
    assert views[small].gpu_charge == 0.3 and views[small].attained(110) == pytest.approx(30.0)
    listed = {j["id"]: j for j in repo.jobs(ids=[half, small])}
    assert listed[small]["gpu_charge"] == 0.3
    assert sorted((u, g) for _a, u, g, _s, _e in usage_runs(repo.engine, 0)) == [("u", 0.3), ("u", 0.5)]
    # The run ends at 410: 400 s x 0.5 = 200 GPU-seconds attained; hacct's row carries the charge.
    end = repo.rank_ended(half, 0, "a", ended(exit_code=0), now=410)
    assert end.job_state is not None
    assert repo.job(half)["attained_gpu_seconds"] == pytest.approx(200.0)
    run = repo.runs(job_ids=[half])[0]
    assert run["gpus"] == 0 and run["gpu_charge"] == 0.5


def test_mig_instances_in_the_store(repo):
    layout = [["MIG-a", "3g.40gb", 40960, 42], ["MIG-b", "2g.20gb", 20480, 28]]
    repo.update_inventory("a", {"cpus": 8, "mem_mb": 1000, "gpu_backend": "simulated", "gpus": [
        {"index": 0, "uuid": "a0", "name": "sim", "memory_mb": 81920, "shareable": True, "isolation": "mig",
         "mig": layout}]}, now=2)
    one, two, three = (submit(repo, gpu_fraction=0.25) for _ in range(3))
    assert repo.start_run(one, Placement(("a",), ((0,),), shares=((20480, 28),), mig=("MIG-b",)), now=3)
    # The instance is taken, or its amounts differ from the layout's, or no instance is named: refused.
    assert not repo.start_run(two, Placement(("a",), ((0,),), shares=((20480, 28),), mig=("MIG-b",)), now=3)
    assert not repo.start_run(two, Placement(("a",), ((0,),), shares=((20480, 28),), mig=("MIG-a",)), now=3)
    assert not repo.start_run(two, Placement(("a",), ((0,),), shares=((20480, 25),)), now=3)
    started = repo.start_run(two, Placement(("a",), ((0,),), shares=((40960, 42),), mig=("MIG-a",)), now=3)
    assert started.mig == ("MIG-a",)
    # What a re-sent start is built from (the dispatcher's retry): the rank keeps its instance.
    (rank,) = [r for r in repo.live_ranks() if r.job_id == two]
    assert rank.mig == "MIG-a"
    resent = rank_spec(repo.job_record(two), rank.attempt, rank.rank, ["a"], rank.gpus, {}, rank.mig)
    assert resent.gpu_share["mig"] == "MIG-a" and resent.gpus == (0,)
    snap = repo.load_snapshot(now=4)
    (node,) = snap.nodes
    assert node.gpus[0].mig == tuple(tuple(m) for m in layout) and node.mig_used == {"MIG-a", "MIG-b"}
    views = {v.id: v for v in snap.jobs}
    assert views[one].mig == ("MIG-b",) and views[three].mig == ()
    assert views[two].gpu_charge == 0.5  # the whole 3g.40gb: half the memory beats 42 % compute
    assert repo.job(one)["gpu_mig"] == ["MIG-b"]
