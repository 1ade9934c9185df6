"""Idle reclamation's store: each running run's idle clock survives a controller restart, and the
reason an idle job is cancelled with is not overwritten by a later cancel (salloc letting go)."""
from hai_cluster.core.model import Placement
from hai_cluster.scheduling.idle import IdleClock
from hai_cluster.store import idle as store

from .test_store import engine, ended, repo, spec  # noqa: F401 - fixtures (both databases)


def test_clocks_of_running_runs_are_kept_and_read_back(repo):
    a = repo.submit(spec(gpus_per_node=1), user="u", uid=1, gid=1, partition="gpu", now=1)
    b = repo.submit(spec(gpus_per_node=1), user="u", uid=1, gid=1, partition="gpu", now=1)
    c = repo.submit(spec(gpus_per_node=1), user="u", uid=1, gid=1, partition="gpu", now=1)
    for job, node in ((a, "a"), (b, "b"), (c, "a")):
        repo.start_run(job, Placement((node,), ((0 if job != c else 1,),)), now=2)
    store.save_clocks(repo.engine, [((a, 0), IdleClock(since=100.0, last=150.0, warned=None)),
                                    ((b, 0), IdleClock(since=90.0, last=200.0, warned=190.0)),
                                    ((c, 0), IdleClock(since=50.0))])
    assert store.running_clocks(repo.engine) == {(a, 0): IdleClock(since=100.0), (b, 0): IdleClock(90.0, None, 190.0),
                                                 (c, 0): IdleClock(since=50.0)}
    store.save_clocks(repo.engine, [((a, 0), IdleClock())])  # busy again: nothing kept
    repo.rank_ended(c, 0, "a", ended(exit_code=0), now=5)  # ended: not a running run's clock
    assert store.running_clocks(repo.engine) == {(b, 0): IdleClock(90.0, None, 190.0)}


def test_a_second_cancel_keeps_the_first_reason(repo):
    j = repo.submit(spec(), user="u", uid=1, gid=1, partition="gpu", now=1)
    repo.start_run(j, Placement(("a",), ((),)), now=2)
    assert repo.request_end(j, "cancel", "IdleReclaimed: GPUs under 5% for 00:30:00")
    assert repo.request_end(j, "cancel", "cancelled by 1000")  # still acknowledged
    res = repo.rank_ended(j, 0, "a", ended(exit_code=0, signal=15), now=4)
    assert res.job_state.value == "CANCELLED"
    assert repo.job(j)["reason"] == "IdleReclaimed: GPUs under 5% for 00:30:00"
