"""Arrays and dependencies in the store, on both databases: an array is submitted in one
transaction, and the snapshot carries each pending job's dependency verdict."""
import pytest
from sqlalchemy import event

from hai_cluster.core.dependency import NEVER, WAITING
from hai_cluster.core.model import JobSpec, Placement

from .test_store import engine, repo  # noqa: F401  (fixtures on SQLite and PostgreSQL)


def spec(**kw):
    return JobSpec(script="#!/bin/sh\ntrue\n", workdir="/tmp", **kw)


def submit(repo, **kw):
    return repo.submit(spec(**kw), user="u", uid=1, gid=1, partition="gpu", now=1.0)


def test_array_rows_share_the_first_tasks_id(repo):
    array_id = submit(repo, array="0-15:4%2")
    rows = repo.jobs(ids=[array_id])
    assert [(r["array_job_id"], r["array_task_id"], r["array_task_limit"]) for r in rows] == \
        [(array_id, t, 2) for t in (0, 4, 8, 12)]
    assert rows[0]["id"] == array_id
    assert [r["array_task_id"] for r in repo.jobs(tasks=[(array_id, 8), (array_id, 4)])] == [4, 8]


def test_array_submission_is_one_transaction(repo, engine):
    inserts = []

    def fail_on_third_task(conn, cursor, statement, params, context, executemany):
        if statement.lstrip().upper().startswith("INSERT INTO JOBS"):
            inserts.append(statement)
            if len(inserts) == 3:
                raise RuntimeError("the store failed in the middle of the array")
    event.listen(engine, "before_cursor_execute", fail_on_third_task)
    try:
        with pytest.raises(RuntimeError):
            submit(repo, array="0-7")
    finally:
        event.remove(engine, "before_cursor_execute", fail_on_third_task)
    assert len(inserts) == 3
    assert repo.jobs() == []


def verdicts(repo):
    return {j.id: j.dependency for j in repo.load_snapshot(now=5.0).jobs}


def finish(repo, job_id, exit_code):
    repo.start_run(job_id, Placement(("a",), ((0,),)), now=2.0)
    repo.rank_ended(job_id, 0, "a", {"exit_code": exit_code, "signal": None}, now=3.0)


def test_snapshot_evaluates_dependencies(repo):
    first = submit(repo)
    array_id = submit(repo, array="0-1")
    ok = submit(repo, dependency=f"afterok:{first}")
    notok = submit(repo, dependency=f"afternotok:{first}")
    on_array = submit(repo, dependency=f"afterok:{array_id}")
    on_task = submit(repo, dependency=f"afterok:{array_id}_0")
    v = verdicts(repo)
    assert (v[ok], v[notok], v[on_array], v[on_task]) == (WAITING, WAITING, WAITING, WAITING)
    finish(repo, first, 1)
    finish(repo, array_id, 0)
    v = verdicts(repo)
    assert (v[ok], v[notok], v[on_array], v[on_task]) == (NEVER, None, WAITING, None)
    assert repo.missing_targets([(first, None), (array_id, 1), (array_id, 7), (999999, None)]) == \
        [(array_id, 7), (999999, None)]


def test_singleton_waits_for_earlier_jobs_of_the_same_name_and_user(repo):
    a = submit(repo, name="s", dependency="singleton")
    b = submit(repo, name="s", dependency="singleton")
    other = repo.submit(spec(name="s", dependency="singleton"), user="v", uid=2, gid=2, partition="gpu", now=1.0)
    v = verdicts(repo)
    assert (v[a], v[b], v[other]) == (None, WAITING, None)
    finish(repo, a, 0)
    assert verdicts(repo)[b] is None
