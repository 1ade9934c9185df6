"""A pass's starts recorded in one transaction: each is re-checked after those before it in the
batch, exactly as one start_run call after another would be."""
from hai_cluster.core.model import Placement
from hai_cluster.core.states import JobState

from .test_store import engine, repo, spec  # noqa: F401 (fixtures: SQLite and PostgreSQL)


def test_start_runs_checks_each_after_the_ones_before(repo):  # noqa: F811
    ids = [repo.submit(spec(gpus_per_node=1), user="u", uid=1, gid=1, partition="gpu", now=i) for i in range(4)]
    held = repo.submit(spec(gpus_per_node=1, hold=True), user="u", uid=1, gid=1, partition="gpu", now=5)
    out = repo.start_runs([
        (ids[0], Placement(("a",), ((0,),))),
        (ids[1], Placement(("a",), ((0,),))),  # the GPU the start before took: refused
        (ids[0], Placement(("b",), ((0,),))),  # started above: no longer pending
        (ids[2], Placement(("a",), ((1,),))),
        (held, Placement(("b",), ((1,),))),  # held
        (ids[3], Placement(("b",), ((1,),))),
    ], now=10)
    assert [None if not r else (r.job.id, r.attempt) for r in out] == [
        (ids[0], 0), None, None, (ids[2], 0), None, (ids[3], 0)]
    states = {j.id: j.state for j in repo.load_snapshot(now=11).jobs}
    assert [states[i] for i in ids] == [JobState.RUNNING, JobState.PENDING, JobState.RUNNING, JobState.RUNNING]
    used = {n.name: n.used_gpus for n in repo.load_snapshot(now=11).nodes}
    assert used == {"a": {0, 1}, "b": {1}}
    assert repo.start_runs([], now=12) == []


def test_a_batch_counts_the_cpus_and_memory_of_the_starts_before(repo):  # noqa: F811
    """The applier reads the nodes once per batch and counts each start it records in them."""
    cpus = [repo.submit(spec(cpus_per_task=5), user="u", uid=1, gid=1, partition="gpu", now=i) for i in range(2)]
    mem = [repo.submit(spec(mem_mb=600), user="u", uid=1, gid=1, partition="gpu", now=i) for i in range(2)]
    out = repo.start_runs([(cpus[0], Placement(("a",), ((),))), (cpus[1], Placement(("a",), ((),))),
                           (mem[0], Placement(("b",), ((),))), (mem[1], Placement(("b",), ((),)))], now=3)
    assert [bool(r) for r in out] == [True, False, True, False]
    assert out[1].reason == "a has 3 free CPUs" and out[3].reason == "b has 400 MiB free memory"
