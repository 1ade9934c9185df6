"""Arrays and dependencies in the store, on both databases: an array is submitted in one
transaction, and the snapshot carries each pending job's dependency verdict."""
import pytest
from sqlalchemy import event, func, select

from hai_cluster.core.dependency import NEVER, WAITING
from hai_cluster.core.model import JobSpec, Placement
from hai_cluster.protocol.runspec import RunStatus
from hai_cluster.store.engine import downgrade, upgrade
from hai_cluster.store import repository
from hai_cluster.store.repository import spec_size
from hai_cluster.store.schema import array_specs, jobs

from .test_store import engine, repo  # noqa: F401  (fixtures on SQLite and PostgreSQL)


def ended(**kw) -> RunStatus:
    """A rank's final status as its agent reports it."""
    return RunStatus(job_id=0, attempt=0, rank=0, state="ended", **kw)


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


def test_an_arrays_spec_is_stored_once(repo, engine):
    """A 256 KiB script with --array=0-1000 used to be copied into every task (252 MB); the spec
    is stored once, each task reads it back whole, and a task's own update stays its own."""
    big = "#!/bin/sh\n" + "# padding\n" * 26_000
    array = JobSpec(script=big, workdir="/tmp", array="0-1000", time_limit=600)
    array_id = repo.submit(array, user="u", uid=1, gid=1, partition="gpu", now=1.0)
    with engine.connect() as c:
        in_tasks = sum(len(str(s)) for s in c.execute(select(jobs.c.spec)).scalars())
        bytes_counted = c.execute(select(func.sum(jobs.c.spec_bytes))).scalar()
    assert in_tasks < 10_000  # the tasks hold "{}" each
    assert bytes_counted == spec_size(array.to_wire())  # one copy, counted once
    tasks = repo.jobs(ids=[array_id])
    assert len(tasks) == 1001
    last = tasks[-1]["id"]
    assert repo.job(last)["spec"]["script"] == big and repo.job(array_id)["spec"]["time_limit"] == 600
    assert repo.update_pending(last, {"time_limit": 60}) is None
    assert repo.job(last)["spec"]["time_limit"] == 60 and repo.job(last)["spec"]["script"] == big
    assert repo.job(array_id)["spec"]["time_limit"] == 600  # the others keep the array's
    started = repo.start_run(last, Placement(("a",), ((),)), now=2.0)
    assert started.job.spec.script == big and started.job.spec.time_limit == 60


def test_a_final_jobs_script_and_environment_leave_the_store(repo, engine):
    """A user submitting and cancelling 4 MiB held jobs in a loop grew the store by 39 MB/s."""
    big = "#!/bin/sh\n" + "#" * 100_000 + "\ntrue\n"
    job = repo.submit(JobSpec(script=big, workdir="/tmp", environment={"SECRET": "x" * 1000}), user="u", uid=1,
                      gid=1, partition="gpu", now=1.0)
    array = repo.submit(JobSpec(script=big, workdir="/tmp", array="0-2"), user="u", uid=1, gid=1, partition="gpu",
                        now=1.0)
    assert repo.cancel_pendings([job, array, array + 1], now=2.0) == [job, array, array + 1]
    spec = repo.job(job)["spec"]
    assert (spec["script"], spec["environment"], spec["workdir"]) == ("", {}, "/tmp")
    assert repo.job(array + 2)["spec"]["script"] == big  # a task of the array still pending needs it
    repo.start_run(array + 2, Placement(("a",), ((),)), now=3.0)
    repo.rank_ended(array + 2, 0, "a", ended(exit_code=0, signal=None), now=4.0)  # the array's last task
    assert repo.job(array + 2)["spec"]["script"] == "" and repo.job(array)["spec"]["script"] == ""
    with engine.connect() as c:
        stored = sum(len(str(s)) for s in c.execute(select(jobs.c.spec)).scalars())
        stored += sum(len(str(s)) for s in c.execute(select(array_specs.c.spec)).scalars())
        counted = c.execute(select(func.sum(jobs.c.spec_bytes))).scalar()
    assert stored < 5000 and counted < 5000


def test_going_down_from_0013_gives_every_task_its_full_spec(repo, engine):
    array_id = submit(repo, array="0-2")
    repo.update_pending(array_id + 2, {"time_limit": 60})
    downgrade(engine, "0012")
    with engine.connect() as c:
        specs = dict(c.execute(select(jobs.c.id, jobs.c.spec)).all())
    assert [specs[array_id + i]["script"] for i in range(3)] == ["#!/bin/sh\ntrue\n"] * 3
    assert specs[array_id + 2]["time_limit"] == 60 and specs[array_id]["time_limit"] is None
    upgrade(engine)


def verdicts(repo):
    return {j.id: j.dependency for j in repo.load_snapshot(now=5.0).jobs}


def finish(repo, job_id, exit_code):
    repo.start_run(job_id, Placement(("a",), ((),)), now=2.0)
    repo.rank_ended(job_id, 0, "a", ended(exit_code=exit_code, signal=None), now=3.0)


def test_after_with_a_delay_turns_with_the_clock_alone(repo):
    first = submit(repo)
    later = submit(repo, dependency=f"after:{first}+2")
    repo.start_run(first, Placement(("a",), ((),)), now=100.0)
    snap = lambda now: {j.id: j.dependency for j in repo.load_snapshot(now=now).jobs}  # noqa: E731
    assert snap(100.0 + 119)[later] == WAITING
    assert snap(100.0 + 120)[later] is None  # nothing about job 1 changed: the book looked again


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


def test_dependencies_are_looked_up_in_chunks_and_not_for_held_jobs(repo, monkeypatch):  # noqa: F811
    """Sixth audit: one IN over every target of every pending job's dependency ran past the
    database's bound parameters and stopped every pass. The lookup goes in chunks (here of 7),
    and a held job's dependency is not looked up at all."""
    monkeypatch.setattr(repository, "CANCEL_CHUNK", 7)
    done = [submit(repo) for _ in range(20)]
    for j in done:
        finish(repo, j, 0)
    array_id = submit(repo, array="0-9")
    waits = submit(repo, dependency="afterok:" + ":".join(map(str, done + [array_id])))
    ready = submit(repo, dependency="afterok:" + ":".join(map(str, done)))
    held = submit(repo, hold=True, dependency="afterok:" + ":".join(map(str, done + [array_id])))
    v = verdicts(repo)
    assert (v[waits], v[ready], v[held]) == (WAITING, None, None)  # the held one: not evaluated


def test_a_pass_looks_up_only_the_dependency_targets_that_can_still_change(repo, monkeypatch):  # noqa: F811
    """Tenth audit: thousands of pending jobs, each after 61 finished jobs, cost every pass
    2.7 s of lookups. What is decided for good is looked up once; a changed dependency anew."""
    wanted: list[set] = []
    lookup = repository.Repository._targets
    monkeypatch.setattr(repository.Repository, "_targets",
                        staticmethod(lambda w, c: wanted.append(set(w)) or lookup(w, c)))
    done = [submit(repo) for _ in range(20)]
    for j in done:
        finish(repo, j, 0)
    running = submit(repo)
    repo.start_run(running, Placement(("a",), ((),)), now=2.0)
    waits = [submit(repo, dependency="afterok:" + ":".join(map(str, done + [running]))) for _ in range(3)]
    never = submit(repo, dependency=f"afterok:{running},afternotok:{done[0]}")
    assert {verdicts(repo)[j] for j in waits} == {WAITING} and verdicts(repo)[never] == NEVER
    assert len(wanted[0]) == 21 and wanted[1] == {(running, None)}
    repo.rank_ended(running, 0, "a", ended(exit_code=0, signal=None), now=3.0)
    assert {verdicts(repo)[j] for j in waits} == {None}
    del wanted[:]
    assert {verdicts(repo)[j] for j in waits} == {None} and not any(wanted)  # nothing left open
    assert repo.update_pending(waits[0], {"dependency": f"afternotok:{running}"}) is None
    del wanted[:]
    assert verdicts(repo)[waits[0]] == NEVER and wanted == [{(running, None)}]
    assert repo.set_hold(waits[1], True, admin=False) is None
    verdicts(repo)
    assert waits[1] not in repo._dependencies._entries  # a held job's is forgotten


def test_a_long_end_message_fits_the_reason_columns_and_runs_are_shown_newest_first_capped(repo, monkeypatch):  # noqa: F811
    """Seventh audit: a launch error of 559 characters went into 200-character columns (PostgreSQL
    refuses that, and the end would never be recorded); a job requeued 100,000 times made one
    reply 34 MB. The reasons are cut to the columns; a reply has each job's newest runs."""
    job = submit(repo, requeue=True)
    message = "chdir to /" + "d" * 540 + " failed: No such file or directory"
    repo.start_run(job, Placement(("a",), ((),)), now=2.0)
    repo.rank_ended(job, 0, "a", ended(exit_code=None, signal=None, reason="launch_failed",
                                  message=message), now=3.0)
    row = repo.job(job)
    assert len(row["reason"]) == 200 and message.startswith(row["reason"])
    monkeypatch.setattr(repository, "RUNS_SHOWN", 2)
    again = submit(repo, requeue=True)
    for attempt in range(4):  # four runs, each requeued
        assert repo.start_run(again, Placement(("a",), ((),)), now=4.0 + attempt)
        assert repo.request_end(again, "requeue", "requeued by u")
        repo.rank_ended(again, attempt, "a", ended(exit_code=None, signal=15, reason="requeue"), now=4.5 + attempt)
    assert repo.job(again)["attempts"] == 4
    assert [r["attempt"] for r in repo.runs(job_ids=[again])] == [2, 3]


def test_known_jobs_answers_for_ids_and_tasks_in_seeks_not_the_arrays_rows(repo, engine):
    """Eleventh audit (high): hcancel naming 1,000 ended arrays looked up every task of them to
    say "already completed" (1,000,000 rows, 4.6 s on the store thread a request). known_jobs
    answers each id and (array, task) from an index seek, however many tasks the arrays hold."""
    arrays = [submit(repo, array="0-599") for _ in range(3)]  # 600 tasks: more than a chunk's ids
    single = submit(repo)
    wanted_tasks = [(a, t) for a in arrays for t in range(0, 600, 3)] + [(arrays[0], 600), (single, 0), (10**9, 1)]
    statements = []

    def note(conn, cursor, statement, params, context, executemany):
        statements.append((statement, params))
    event.listen(engine, "before_cursor_execute", note)
    try:
        ids, tasks = repo.known_jobs(arrays + [single, arrays[0] + 1, 10**9], wanted_tasks)
    finally:
        event.remove(engine, "before_cursor_execute", note)
    assert ids == {*arrays, single, arrays[0] + 1}
    assert tasks == {(a, t) for a in arrays for t in range(0, 600, 3)}
    if engine.dialect.name == "sqlite":  # each statement seeks its indexes; none scans the table
        with engine.connect() as c:
            for statement, params in statements:
                plan = " ".join(r[-1] for r in c.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, params))
                assert "SCAN" not in plan and "SEARCH" in plan, (statement[:80], plan)


def test_task_chunks_keep_each_query_small():
    tasks = [(a, t) for a in range(250) for t in range(3)] + [(999, t) for t in range(1200)]
    chunks = repository._task_chunks(tasks)
    assert sorted((a, t) for chunk in chunks for a, ts in chunk for t in ts) == sorted(tasks)
    for chunk in chunks:
        assert len(chunk) <= 100 and sum(len(ts) for _, ts in chunk) <= repository.CANCEL_CHUNK


def test_a_listing_by_ids_walks_each_array_and_follows_to_the_plain_answer(repo):
    """Eleventh audit (medium): a page of `hqueue -j` / `hacct -j` naming arrays sorted every task
    of them. Each array named is a walk of its own now, the other ids one more: following the
    pages gives what the plain filter gives, and a page that matches little ends short."""
    import random
    from hai_cluster.store import listing
    from .test_store import followed
    arrays = [submit(repo, array="0-39") for _ in range(4)]
    singles = [submit(repo) for _ in range(10)]
    for j in [arrays[1], arrays[1] + 7, singles[2]] + [arrays[2] + k for k in range(0, 40, 2)]:
        repo.cancel_pending(j, now=2.0)
    every = repo.jobs(limit=None)
    rng = random.Random(11)
    for _ in range(30):
        ids = rng.sample(arrays + singles + [arrays[0] + 5, arrays[3] + 39, 10**9], rng.randint(1, 6))
        tasks = [(a, t) for a in rng.sample(arrays, 2) for t in rng.sample(range(45), 3)]
        tasks = tasks if rng.random() < 0.5 else []
        states = rng.sample(["PENDING", "CANCELLED"], rng.randint(0, 1))
        named = set(ids) | {r["id"] for r in every if r["array_job_id"] in ids or
                            (r["array_job_id"], r["array_task_id"]) in set(tasks)}
        expected = [r["id"] for r in every if r["id"] in named and (not states or r["state"] in states)]
        assert followed(repo, 7, ids=ids, tasks=tasks, states=states) == expected, (ids, tasks, states)
    short = repo.jobs_page(ids=arrays, states=["RUNNING"], limit=2)
    assert short.rows == [] and short.resume_after is not None and short.resume_after < arrays[3] + 39
    with pytest.raises(listing.TooManyValues, match="at most 64 arrays in one listing by id, got 65"):
        many = [submit(repo, array="0-1") for _ in range(65)]
        repo.jobs_page(ids=many, limit=10)


def test_jobs_and_runs_named_by_several_tasks_are_seeks(repo, engine):
    """Eleventh audit: a row-value IN of two (array, task) pairs or more (`hqueue -j 12_5,1012_5`,
    hcancel of tasks) was a scan of the whole job table on SQLite. Tasks become ids by seeks."""
    a, b = submit(repo, array="0-9"), submit(repo, array="0-9")
    statements = []

    def note(conn, cursor, statement, params, context, executemany):
        statements.append((statement, params))
    event.listen(engine, "before_cursor_execute", note)
    try:
        listed = repo.jobs(tasks=[(a, 5), (b, 5), (b, 9)])
        runs = repo.runs(tasks=[(a, 5), (b, 5)])
    finally:
        event.remove(engine, "before_cursor_execute", note)
    assert [(r["array_job_id"], r["array_task_id"]) for r in listed] == [(a, 5), (b, 5), (b, 9)] and runs == []
    if engine.dialect.name == "sqlite":
        with engine.connect() as c:
            for statement, params in statements:
                plan = " ".join(r[-1] for r in c.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, params))
                assert "SCAN jobs" not in plan, (statement[:120], plan)
