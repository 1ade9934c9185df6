"""The store against both databases: migrations up and down, submit, start, end, requeue."""
import pytest
from sqlalchemy import inspect

from hai_cluster.core.model import JobSpec, Placement
from hai_cluster.core.states import JobState
from hai_cluster.protocol.runspec import RunStatus
from hai_cluster.store.engine import current_revision, downgrade, head_revision, make_engine, upgrade
from hai_cluster.store import repository
from hai_cluster.store.applier import Refused
from hai_cluster.store.repository import RankRef, Repository
from hai_cluster.store.schema import metadata


def ended(**kw) -> RunStatus:
    """A rank's final status as its agent reports it."""
    return RunStatus(job_id=0, attempt=0, rank=0, state="ended", **kw)


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request, tmp_path):
    url = f"sqlite:///{tmp_path}/hai.db" if request.param == "sqlite" else request.getfixturevalue("postgres_url")
    eng = make_engine(url)
    upgrade(eng)
    yield eng
    eng.dispose()


@pytest.fixture
def repo(engine):
    r = Repository(engine)
    r.register_nodes([("a", "10.0.0.1", ["gpu"]), ("b", "10.0.0.2", ["gpu"])], now=0.0)
    for name in ("a", "b"):
        r.update_inventory(name, {"cpus": 8, "mem_mb": 1000, "gpu_backend": "simulated",
                                  "gpus": [{"index": i, "uuid": f"{name}{i}", "name": "sim", "memory_mb": 10}
                                           for i in range(2)]}, now=1.0)
        r.set_responding(name, True, now=1.0)
    return r


def spec(**kw):
    return JobSpec(script="#!/bin/sh\ntrue\n", workdir="/tmp", **kw)


def test_migrations_match_the_schema_and_go_down_and_up(engine):
    assert current_revision(engine) == head_revision() == "0031"
    insp = inspect(engine)
    for table in metadata.sorted_tables:
        assert {c["name"] for c in insp.get_columns(table.name)} == {c.name for c in table.columns}
    downgrade(engine, "base")
    assert not [t for t in inspect(engine).get_table_names() if t != "alembic_version"]
    upgrade(engine)
    assert current_revision(engine) == head_revision()


def test_snapshot_reflects_allocations(repo):
    a = repo.submit(spec(gpus_per_node=2), user="u", uid=1000, gid=1000, partition="gpu", now=10)
    repo.submit(spec(gpus_per_node=1), user="u", uid=1000, gid=1000, partition="gpu", now=11)
    started = repo.start_run(a, Placement(("a",), ((0, 1),)), now=12)
    assert started.attempt == 0 and started.job.state == "RUNNING" and started.job.nodelist == "a"  # as it now is
    snap = repo.load_snapshot(now=13)
    nodes = {n.name: n for n in snap.nodes}
    assert nodes["a"].used_gpus == {0, 1} and nodes["b"].used_gpus == frozenset()
    assert {j.id: j.state for j in snap.jobs}[a] == JobState.RUNNING


def refused(result, why: str) -> bool:
    """The applier refused a start, saying `why`."""
    return isinstance(result, Refused) and not result and why in result.reason


def test_start_is_rechecked_against_current_state(repo):
    a = repo.submit(spec(gpus_per_node=1), user="u", uid=1, gid=1, partition="gpu", now=1)
    b = repo.submit(spec(gpus_per_node=1), user="u", uid=1, gid=1, partition="gpu", now=2)
    assert repo.start_run(a, Placement(("a",), ((0,),)), now=3)
    assert refused(repo.start_run(a, Placement(("b",), ((0,),)), now=3), "RUNNING, not pending")
    assert refused(repo.start_run(b, Placement(("a",), ((0,),)), now=3), "a: GPU 0 is in use")
    repo.set_responding("b", False, now=3)
    assert refused(repo.start_run(b, Placement(("b",), ((1,),)), now=3), "b is not responding")
    assert repo.start_run(b, Placement(("a",), ((1,),)), now=3)


def test_start_is_refused_when_cpus_or_memory_were_taken_after_the_snapshot(repo):
    """The applier checks with the policy's fits(): CPUs and memory too, not only GPUs."""
    cpu_hog = repo.submit(spec(cpus_per_task=6), user="u", uid=1, gid=1, partition="gpu", now=1)
    mem_hog = repo.submit(spec(mem_mb=700), user="u", uid=1, gid=1, partition="gpu", now=1)
    wants_cpus = repo.submit(spec(gpus_per_node=1, cpus_per_task=4), user="u", uid=1, gid=1, partition="gpu", now=2)
    wants_mem = repo.submit(spec(gpus_per_node=1, mem_mb=400), user="u", uid=1, gid=1, partition="gpu", now=2)
    snap = repo.load_snapshot(now=3)  # the policy sees both nodes empty: all four fit
    seen = {j.id: j.version for j in snap.jobs}
    assert repo.start_run(cpu_hog, Placement(("a",), ((),)), now=4)
    assert repo.start_run(mem_hog, Placement(("b",), ((),)), now=4)
    assert refused(repo.start_run(wants_cpus, Placement(("a",), ((0,),)), now=5, version=seen[wants_cpus]),
                   "a has 2 free CPUs")
    assert refused(repo.start_run(wants_mem, Placement(("b",), ((0,),)), now=5, version=seen[wants_mem]),
                   "b has 300 MiB free memory")
    assert repo.start_run(wants_cpus, Placement(("b",), ((0,),)), now=5, version=seen[wants_cpus])
    states = {j.id: j.state for j in repo.load_snapshot(now=6).jobs}
    assert states[wants_mem] == JobState.PENDING and states[wants_cpus] == JobState.RUNNING


def test_a_job_of_several_tasks_a_node_holds_each_tasks_cpus(repo):
    """-n/--ntasks-per-node reach the snapshot and the applier: a rank takes tasks x -c CPUs."""
    four = repo.submit(spec(cpus_per_task=2, ntasks_per_node=4), user="u", uid=1, gid=1, partition="gpu", now=1)
    two = repo.submit(spec(cpus_per_task=1, ntasks=2), user="u", uid=1, gid=1, partition="gpu", now=1)
    views = {j.id: j for j in repo.load_snapshot(now=2).jobs}
    assert (views[four].tasks_per_node, views[four].cpus_per_node) == (4, 8)
    assert (views[two].tasks_per_node, views[two].cpus_per_node) == (2, 2)
    assert repo.start_run(four, Placement(("a",), ((),)), now=3)
    assert refused(repo.start_run(two, Placement(("a",), ((),)), now=3), "a has 0 free CPUs")
    assert {n.name: n.used_cpus for n in repo.load_snapshot(now=4).nodes} == {"a": 8, "b": 0}
    assert repo.start_run(two, Placement(("b",), ((),)), now=5)


def test_start_is_refused_for_a_job_changed_since_the_snapshot(repo):
    j = repo.submit(spec(gpus_per_node=1), user="u", uid=1, gid=1, partition="gpu", now=1)
    version = {v.id: v.version for v in repo.load_snapshot(now=2).jobs}[j]
    assert repo.update_pending(j, {"time_limit": 60}) is None  # hcontrol update after the pass read the job
    assert refused(repo.start_run(j, Placement(("a",), ((0,),)), now=3, version=version), "changed since the snapshot")
    assert refused(repo.start_run(j, Placement(("a",), ((0, 1),)), now=3), "GPUs [0, 1] given, job")
    assert repo.start_run(j, Placement(("a",), ((0,),)), now=3, version=version + 1)


def test_start_is_refused_off_partition_or_with_a_missing_runtime(repo):
    other = repo.submit(spec(partition="cpu"), user="u", uid=1, gid=1, partition="cpu", now=1)
    boxed = repo.submit(spec(runtime="bwrap"), user="u", uid=1, gid=1, partition="gpu", now=1)
    gang = repo.submit(spec(nodes=2, gpus_per_node=1), user="u", uid=1, gid=1, partition="gpu", now=1)
    assert refused(repo.start_run(other, Placement(("a",), ((),)), now=2), "a is not in partition cpu")
    assert refused(repo.start_run(boxed, Placement(("a",), ((),)), now=2), "a has no bwrap runtime")
    assert refused(repo.start_run(gang, Placement(("a", "a"), ((0,), (1,))), now=2), "two ranks of job")
    assert refused(repo.start_run(gang, Placement(("a",), ((0,),)), now=2), "1 rank(s), job")
    assert refused(repo.start_run(gang, Placement(("a", "zz"), ((0,), (0,))), now=2), "zz is not a node")
    assert repo.start_run(gang, Placement(("a", "b"), ((0,), (1,))), now=2)


def test_gang_run_ends_when_every_rank_has_ended(repo):
    j = repo.submit(spec(nodes=2, gpus_per_node=1, every_node=True), user="u", uid=1, gid=1, partition="gpu", now=1)
    repo.start_run(j, Placement(("a", "b"), ((0,), (0,))), now=2)
    repo.mark_rank_running(j, 0, "a")
    first = repo.rank_ended(j, 0, "a", ended(exit_code=0, signal=None, reason=None, end_time=5), now=5)
    assert first.recorded and first.run_state is None and first.stop_ranks == ()
    assert repo.rank_ended(j, 0, "a", ended(exit_code=0), now=6).recorded is False  # duplicate report
    last = repo.rank_ended(j, 0, "b", ended(exit_code=0, signal=None, reason=None, end_time=7), now=7)
    assert last.run_state == JobState.COMPLETED and last.job_state == JobState.COMPLETED
    job = repo.job(j)
    assert job["state"] == "COMPLETED" and job["attained_gpu_seconds"] == pytest.approx(10.0)
    assert repo.live_ranks() == []


def test_the_batch_scripts_end_stops_the_step_servers_and_is_the_jobs(repo):
    j = repo.submit(spec(nodes=2, gpus_per_node=1), user="u", uid=1, gid=1, partition="gpu", now=1)
    repo.start_run(j, Placement(("a", "b"), ((0,), (0,))), now=2)
    assert repo.rank_ended(j, 0, "b", ended(exit_code=0, signal=None, reason=None), now=3).stop_ranks == ()
    k = repo.submit(spec(nodes=2, gpus_per_node=1), user="u", uid=1, gid=1, partition="gpu", now=4)
    repo.start_run(k, Placement(("a", "b"), ((1,), (1,))), now=5)
    first = repo.rank_ended(k, 0, "a", ended(exit_code=0, signal=None, reason=None, end_time=6), now=6)
    assert [r.node for r in first.stop_ranks] == ["b"]  # rank 0 ran the script: the job is over
    last = repo.rank_ended(k, 0, "b", ended(exit_code=None, signal=15, reason="cancel", end_time=7), now=7)
    assert last.run_state == JobState.COMPLETED and repo.job(k)["exit_code"] == 0


def test_steps_are_numbered_per_run_ended_by_their_node_and_closed_with_the_run(repo):
    j = repo.submit(spec(nodes=2, gpus_per_node=1), user="u", uid=1, gid=1, partition="gpu", now=1)
    repo.start_run(j, Placement(("a", "b"), ((0,), (0,))), now=2)
    book = repo.steps

    def begin(name, origin="a"):
        return book.begin(j, 0, name=name, nodes=("a", "b"), counts=(1, 1), cpus=2, origin=origin, now=3)

    assert [begin("hostname"), begin("python"), begin("sleep")] == [0, 1, 2]
    assert book.begin(j, 7, name="x", nodes=("a",), counts=(1,), cpus=1, origin="a", now=3) is None  # no such run
    # only srun's node ends a step, once
    assert not book.end(j, 0, 1, origin="b", state="FAILED", exit_code=3, exit_signal=None, now=4)
    assert book.end(j, 0, 1, origin="a", state="FAILED", exit_code=3, exit_signal=None, now=4)
    assert not book.end(j, 0, 1, origin="a", state="COMPLETED", exit_code=0, exit_signal=None, now=5)
    assert [s["step_id"] for s in book.open_of([j])] == [0, 2]
    assert book.open_step(j, 2) == {"attempt": 0, "origin": "a", "nodelist": "a,b", "counts": "1,1"}
    assert book.open_step(j, 1) is None  # ended
    repo.rank_ended(j, 0, "a", ended(exit_code=0, signal=None, reason=None, end_time=6), now=6)
    repo.rank_ended(j, 0, "b", ended(exit_code=None, signal=15, reason="cancel", end_time=7), now=7)
    run_id = repo.runs(job_ids=[j])[0]["id"]
    rows = book.of_runs([run_id])
    assert [(s["step_id"], s["name"], s["state"], s["exit_code"]) for s in rows] == [
        (0, "hostname", "CANCELLED", None), (1, "python", "FAILED", 3), (2, "sleep", "CANCELLED", None)]
    assert all(s["end_time"] is not None for s in rows) and book.open_of([j]) == [] and book.open_step(j, 0) is None
    k = repo.submit(spec(), user="u", uid=1, gid=1, partition="gpu", now=8)
    assert repo.start_run(k, Placement(("b",), ((),)), now=9)
    assert book.begin(k, 0, name="x", nodes=("b",), counts=(1,), cpus=1, origin="b", now=9) == 0  # its own count


def test_failed_rank_asks_to_stop_peers_and_node_fail_requeues(repo):
    j = repo.submit(spec(nodes=2), user="u", uid=1, gid=1, partition="gpu", now=1)
    repo.start_run(j, Placement(("a", "b"), ((), ())), now=2)
    res = repo.rank_ended(j, 0, "a", ended(exit_code=3), now=3)
    assert [r.node for r in res.stop_ranks] == ["b"]
    res = repo.rank_ended(j, 0, "b", ended(exit_code=None, signal=15, reason="cancel"), now=4)
    assert res.run_state == JobState.FAILED and repo.job(j)["exit_code"] == 3
    k = repo.submit(spec(), user="u", uid=1, gid=1, partition="gpu", now=5)
    repo.start_run(k, Placement(("a",), ((),)), now=6)
    res = repo.rank_ended(k, 0, "a", ended(reason="lost"), now=7)
    assert res.run_state == JobState.NODE_FAIL and res.job_state == JobState.PENDING
    job = repo.job(k)
    assert job["restart_count"] == 1 and job["reason"] == "Requeued"
    assert repo.start_run(k, Placement(("a",), ((),)), now=8).attempt == 1
    assert [r["state"] for r in repo.runs(job_ids=[k])] == ["NODE_FAIL", "RUNNING"]


def test_cancel_paths(repo):
    p = repo.submit(spec(), user="u", uid=1, gid=1, partition="gpu", now=1)
    assert repo.cancel_pending(p, now=2) and repo.job(p)["state"] == "CANCELLED"
    assert not repo.cancel_pending(p, now=3)
    r = repo.submit(spec(), user="u", uid=1, gid=1, partition="gpu", now=1)
    repo.start_run(r, Placement(("a",), ((),)), now=2)
    assert repo.request_end(r, "cancel") and repo.job(r)["state"] == "COMPLETING"
    res = repo.rank_ended(r, 0, "a", ended(exit_code=0), now=4)  # even a clean exit after cancel
    assert res.job_state == JobState.CANCELLED


def test_cancel_pendings_cancels_only_pending_jobs_in_one_go(repo, monkeypatch):
    monkeypatch.setattr(repository, "CANCEL_CHUNK", 2)  # several IN (...) chunks in one transaction
    ids = [repo.submit(spec(), user="u", uid=1, gid=1, partition="gpu", now=1) for _ in range(5)]
    repo.start_run(ids[1], Placement(("a",), ((),)), now=2)
    assert repo.cancel_pending(ids[4], now=2)
    done = repo.cancel_pendings([ids[0], ids[1], ids[2], 9999, ids[3], ids[4]], now=3, by_uid=7)
    assert sorted(done) == [ids[0], ids[2], ids[3]]  # not the running one, the unknown, the cancelled
    assert [repo.job(j)["state"] for j in ids] == ["CANCELLED", "RUNNING", "CANCELLED", "CANCELLED", "CANCELLED"]
    assert repo.job(ids[0])["reason"] == "cancelled by 7" and repo.job(ids[0])["end_time"] == 3
    assert repo.job(ids[4])["end_time"] == 2  # cancelled before: untouched
    assert repo.cancel_pendings([], now=4) == []


def test_migration_0002_keeps_jobs_and_fills_pending_since(engine):
    from sqlalchemy import text
    downgrade(engine, "0001")
    with engine.begin() as c:
        c.execute(text("INSERT INTO jobs (name, \"user\", uid, gid, partition, state, reason, priority, submit_time, "
                       "nodes, gpus_per_node, cpus_per_task, hold, spec, restart_count, attempts, nodelist, "
                       "attained_gpu_seconds, version) VALUES ('old', 'u', 1, 1, 'gpu', 'PENDING', 'None', 'normal', "
                       "42.0, 1, 1, 1, false, '{}', 0, 0, '', 0.0, 1)"))
    upgrade(engine)
    job = Repository(engine).jobs()[0]
    assert (job["name"], job["pending_since"], job["preemptible"], job["hold_admin"]) == ("old", 42.0, True, False)


def test_nodes_go_down_after_silence_and_come_back(repo):
    repo.set_responding("a", False, now=10.0)
    assert repo.nodes_unreachable_since(15.0) == ["a"]
    j = repo.submit(spec(), user="u", uid=1, gid=1, partition="gpu", now=1)
    repo.start_run(j, Placement(("b",), ((),)), now=2)
    assert repo.mark_down("b", "Not responding for more than 5 s") == [RankRef(j, 0, 0, "b", (), "starting")]
    assert repo.nodes_unreachable_since(15.0) == ["a"]  # b is down already, not counted again
    repo.set_responding("b", True, now=20.0)
    row = {n["name"]: n for n in repo.nodes()}["b"]
    assert (row["state"], row["reason"], row["responding"]) == ("up", None, True)
    repo.set_node_state("a", "drain", "maintenance")
    repo.set_responding("a", True, now=21.0)
    assert {n["name"]: n for n in repo.nodes()}["a"]["state"] == "drain"  # an admin's drain stays


def test_set_reasons_writes_only_what_changed(repo):
    a = repo.submit(spec(), user="u", uid=1, gid=1, partition="gpu", now=1)
    b = repo.submit(spec(), user="u", uid=1, gid=1, partition="gpu", now=2)
    repo.set_reasons({a: "Resources", b: "Priority", 999: "Resources"})
    repo.set_reasons({a: "Resources", b: "Resources"})
    assert [(j["id"], j["reason"]) for j in repo.jobs()] == [(a, "Resources"), (b, "Resources")]
    assert "spec" not in repo.jobs()[0] and "spec" in repo.job(a)


def test_a_reason_decided_on_a_job_that_changed_since_is_not_written(repo):
    """CI: a pass that read a held job, then wrote JobHeldUser after its release, told the job's
    history "released", then "waiting reason=JobHeldUser". Reasons go only to jobs as seen."""
    a = repo.submit(spec(hold=True), user="u", uid=1, gid=1, partition="gpu", now=1)
    b = repo.submit(spec(), user="u", uid=1, gid=1, partition="gpu", now=2)
    seen = {j.id: j.version for j in repo.load_snapshot(now=3).jobs}
    assert repo.set_hold(a, False, admin=False) is None  # released while the pass ran
    assert repo.set_reasons({a: "JobHeldUser", b: "Priority"}, seen) == {b: "Priority"}
    assert repo.job(a)["reason"] != "JobHeldUser" and repo.job(b)["reason"] == "Priority"


def test_live_ranks_are_read_from_their_own_index_not_the_whole_history(tmp_path):
    """Seventh audit: with 2,000,000 ended ranks every pass and every cancelled job's lookup took
    0.17 s, a scan of all ranks. The partial index holds the live ones; the queries say its
    predicate as it is (a bound parameter there would keep SQLite off it)."""
    from hai_cluster.store import statements as st
    eng = make_engine(f"sqlite:///{tmp_path}/hai.db")
    upgrade(eng)
    with eng.connect() as c:
        plan = " ".join(str(r[-1]) for r in c.exec_driver_sql("EXPLAIN QUERY PLAN " + str(st.LIVE_RANKS.compile(eng))))
    eng.dispose()
    assert "USING INDEX ix_run_ranks_live" in plan, plan


def test_the_job_record_has_the_job_tables_columns():
    """store/records.JobRecord is the typed job row: every column but the spec's bytes, the spec parsed."""
    from hai_cluster.store.records import COLUMNS
    from hai_cluster.store.schema import jobs
    assert set(COLUMNS) == {c.name for c in jobs.c} - {"spec", "spec_bytes"}


def test_an_update_rewrites_the_spec_and_the_columns_derived_from_it(repo):
    """The job's columns copy its spec through views.spec_columns alone, at submission and update."""
    from hai_cluster.store.views import spec_columns
    j = repo.submit(spec(gpus_per_node=1, time_limit=600, partition="gpu"), user="u", uid=1, gid=1,
                    partition="gpu", now=1)
    assert repo.update_pending(j, {"time_limit": 60, "partition": "cpu", "dependency": "afterok:7"}) is None
    job = repo.job(j)
    derived = spec_columns(JobSpec.from_wire(job["spec"]))
    assert {k: job[k] for k in derived} == derived
    assert (job["time_limit"], job["partition"], job["dependency"]) == (60, "cpu", "afterok:7")
    assert job["spec"]["partition"] == "cpu" and job["version"] == 2


def test_events_name_their_nodes_on_both_databases(engine):
    """add_events gets the ids of the events that name nodes back in order (RETURNING) for their
    rows in event_nodes; a node's history is read through them."""
    from hai_cluster.store.events import add_events, prune_events, read_events
    add_events(engine, [{"time": float(i), "kind": "started", "job_id": i, "node": ",".join(names), "detail": {}}
                        if names else {"time": float(i), "kind": "submitted", "job_id": i, "node": None, "detail": {}}
                        for i, names in enumerate([("a", "b"), (), ("b",), ("c", "a")])])
    assert [e["job_id"] for e in read_events(engine, node="a")] == [0, 3]
    assert [e["job_id"] for e in read_events(engine, node="b", limit=1)] == [2]
    assert read_events(engine, node="nosuch") == []
    assert prune_events(engine, before=3.0) == 3
    assert [e["job_id"] for e in read_events(engine, node="a")] == [3]


def test_listings_filtered_by_name_partition_or_end_read_indexes(repo, tmp_path):
    """Eighth audit, follow-up: `squeue -n X -t all`, `-p X` and `hacct -S` read every job ever run
    when few or none matched. They now go through ix_jobs_name, ix_jobs_partition and
    ix_jobs_end_time; the first job that can match hacct's -S is found in the index first."""
    from sqlalchemy import func, select
    from hai_cluster.store.schema import jobs
    old = repo.submit(spec(), user="u", uid=1, gid=1, partition="gpu", now=1)  # pending: never ended
    done = [repo.submit(spec(), user="u", uid=1, gid=1, partition="cpu", now=2 + i) for i in range(3)]
    for i, j in enumerate(done):
        repo.cancel_pending(j, now=10.0 + i)
    assert [j["id"] for j in repo.jobs(ended_since=11.0, limit=100)] == [old, done[1], done[2]]
    assert [j["id"] for j in repo.jobs(ended_since=11.0, after_id=old, limit=1)] == [done[1]]
    assert [j["id"] for j in repo.jobs(ended_since=99.0, limit=100)] == [old]
    eng = make_engine(f"sqlite:///{tmp_path}/plans.db")
    upgrade(eng)
    queries = {
        "ix_jobs_name": select(jobs.c.id).where(jobs.c.name.in_(["x"])).order_by(jobs.c.id).limit(10),
        "ix_jobs_partition": select(jobs.c.id).where(jobs.c.partition.in_(["x"])).order_by(jobs.c.id).limit(10),
        "ix_jobs_end_time": select(func.min(jobs.c.id + 0)).where(jobs.c.end_time >= 5.0),
    }
    with eng.connect() as c:
        for index, q in queries.items():
            sql = str(q.compile(eng, compile_kwargs={"literal_binds": True}))
            plan = " ".join(str(r[-1]) for r in c.exec_driver_sql("EXPLAIN QUERY PLAN " + sql))
            assert index in plan, (index, plan)
    eng.dispose()


def test_listings_by_user_name_or_partition_are_merged_walks_with_the_plain_answer(repo):
    """store/listing.py: one walk per (value, state) pair, merged in id order, gives exactly what
    the plain filters give, page by page."""
    import random
    from hai_cluster.store import listing
    rng = random.Random(3)
    for i in range(120):
        j = repo.submit(spec(), user=rng.choice(["u1", "u2", "u3"]), uid=1, gid=1,
                        partition=rng.choice(["gpu", "cpu"]), now=i)
        if rng.random() < 0.6:
            repo.cancel_pending(j, now=200.0 + i)
    every = repo.jobs(limit=None)
    for _ in range(40):
        users = rng.sample(["u1", "u2", "u3", "nobody"], rng.randint(0, 2))
        parts = rng.sample(["gpu", "cpu"], rng.randint(0, 1))
        states = rng.sample(["PENDING", "CANCELLED", "COMPLETED"], rng.randint(0, 2))
        expected = [j["id"] for j in every if (not users or j["user"] in users) and (not parts or j["partition"] in parts)
                    and (not states or j["state"] in states)]
        got = followed(repo, 7, users=users, partitions=parts, states=states)
        assert got == expected, (users, parts, states)
    with pytest.raises(listing.TooManyValues, match="at most 64 users"):
        repo.jobs(users=[f"u{i}" for i in range(65)])


def followed(repo, limit, **filters) -> list[int]:
    """Every id of a listing, a page at a time as the CLI follows them (api_jobs._page_and_next)."""
    after, got = None, []
    for _ in range(10_000):
        page = repo.jobs_page(after_id=after, limit=limit, **filters)
        got += [j["id"] for j in page.rows]
        assert page.resume_after is None or (after or -1) < page.resume_after, "a short page moves on"
        if len(page.rows) == limit:
            after = page.rows[-1]["id"]
        elif page.resume_after is not None:
            after = page.resume_after
        else:
            return got
    raise AssertionError("the listing never ended")


def test_a_listing_that_matches_little_examines_a_budget_of_rows_a_page(repo):
    """Tenth audit: 64 users and a name nobody uses made every walk read its whole history for one
    page (2.65 s at 2,000,000 jobs). A page now examines about EXAMINED_PER_ROW rows per row asked
    (beyond each walk's first window) and ends short with where the next starts."""
    from hai_cluster.store import listing
    ids = [repo.submit(spec(name=f"n{i % 2}"), user=f"u{i % 3}", uid=1, gid=1, partition="gpu", now=i)
           for i in range(600)]
    for j in ids[:300]:
        repo.cancel_pending(j, now=1000.0)
    limit = 5  # a budget of 20 rows, windows of MIN_WINDOW (16) at first
    page = repo.jobs_page(users=["u0", "u1", "u2"], names=["nope"], limit=limit)
    assert page.rows == [] and page.resume_after is not None and page.resume_after < ids[-1]
    assert page.resume_after < 6 * listing.MIN_WINDOW * limit  # the ids of a few windows, not all 600
    assert followed(repo, limit, users=["u0", "u1", "u2"], names=["nope"]) == []
    assert followed(repo, limit, users=["u0", "u2"], names=["n1"]) == [
        j for i, j in enumerate(ids) if i % 3 in (0, 2) and i % 2 == 1]
    assert followed(repo, limit, users=["u1"], names=["n0"], states=["PENDING"]) == [
        j for i, j in enumerate(ids) if i >= 300 and i % 3 == 1 and i % 2 == 0]
    # No residual filter: a walk that keeps matching reads further, and a page is full.
    assert len(repo.jobs_page(users=["u0"], limit=limit).rows) == limit
    # hacct -S with an old job still open: the few open or ended since come from ix_jobs_end_time;
    # when many do, the primary key is walked a budget of rows at a time from the first of them.
    assert followed(repo, limit, ended_since=1000.0) == ids
    assert followed(repo, limit, ended_since=1001.0) == ids[300:]
    assert followed(repo, 50, ended_since=1001.0) == ids[300:]
    assert followed(repo, 200, ended_since=1001.0) == ids[300:]
    assert repo.jobs(users=["u0"]) == repo.jobs(users=["u0"], limit=None)  # no limit: every row


def test_a_listing_walk_reads_its_index_in_order(tmp_path):
    """Each walk of a merged listing is an index seek in id order: no scan, no sort."""
    from sqlalchemy import select
    from hai_cluster.store.schema import jobs
    eng = make_engine(f"sqlite:///{tmp_path}/plans.db")
    upgrade(eng)
    for column, index in ((jobs.c.user, "ix_jobs_user_state"), (jobs.c.name, "ix_jobs_name"),
                          (jobs.c.partition, "ix_jobs_partition")):
        q = (select(jobs.c.id).where(column == "x", jobs.c.state == "COMPLETED", jobs.c.id > 5)
             .order_by(jobs.c.id).limit(20))
        sql = str(q.compile(eng, compile_kwargs={"literal_binds": True}))
        with eng.connect() as c:
            plan = " ".join(str(r[-1]) for r in c.exec_driver_sql("EXPLAIN QUERY PLAN " + sql))
        assert index in plan and "TEMP B-TREE" not in plan and "SCAN" not in plan, (index, plan)
    eng.dispose()


def test_events_keep_their_order_whether_they_name_nodes_or_not(engine):
    """A run's end names its node and the requeue that follows names none: a job's history keeps
    them in the order they happened (they are written in one insert, in order)."""
    from hai_cluster.store.events import add_events, read_events
    add_events(engine, [{"time": 1.0, "kind": "ended", "job_id": 9, "node": "a", "detail": {}},
                        {"time": 1.0, "kind": "requeued", "job_id": 9, "node": None, "detail": {}},
                        {"time": 2.0, "kind": "started", "job_id": 9, "node": "b", "detail": {}}])
    assert [e["kind"] for e in read_events(engine, job_id=9)] == ["ended", "requeued", "started"]
    assert [e["kind"] for e in read_events(engine, node="b")] == ["started"]


def test_a_filtered_listing_walks_only_the_states_its_values_hold(repo, engine):
    """Eleventh audit (medium): 64 names nobody uses, all states, were 768 walks of two queries
    each (0.33 s for no row). states_held finds each value's states by a loose index scan, and
    only the pairs some job holds are walked."""
    from sqlalchemy import event
    from hai_cluster.store import listing
    from hai_cluster.store.schema import jobs
    a = repo.submit(spec(), user="u1", uid=1, gid=1, partition="gpu", now=1)
    repo.submit(spec(), user="u1", uid=1, gid=1, partition="gpu", now=2)
    repo.cancel_pending(a, now=3)
    repo.submit(spec(), user="u2", uid=1, gid=1, partition="gpu", now=4)
    with engine.connect() as c:
        assert listing.states_held(c, jobs.c.user, "u1") == ["CANCELLED", "PENDING"]
        assert listing.states_held(c, jobs.c.user, "nobody") == []
    statements = []

    def note(conn, cursor, statement, params, context, executemany):
        statements.append(statement)
    event.listen(engine, "before_cursor_execute", note)
    try:
        assert repo.jobs_page(users=[f"x{i}" for i in range(64)], limit=10).rows == []
    finally:
        event.remove(engine, "before_cursor_execute", note)
    assert len(statements) == 64  # one loose scan per user, no walk
    assert [j["id"] for j in repo.jobs_page(users=["u1", "x"], limit=10).rows] == [a, a + 1]
    assert [j["id"] for j in repo.jobs_page(users=["u1"], states=["PENDING"], limit=10).rows] == [a + 1]


def test_a_snapshot_reuses_the_views_of_unchanged_pending_jobs_only(repo):
    """Each pass rebuilds only what changed (store/views.py JobViews): an untouched pending job's
    view is the last pass's object, a held, updated or started one's is built anew and says so."""
    a = repo.submit(spec(gpus_per_node=1), user="u", uid=1000, gid=1000, partition="gpu", now=10)
    b = repo.submit(spec(gpus_per_node=1), user="u", uid=1000, gid=1000, partition="gpu", now=11)
    c = repo.submit(spec(gpus_per_node=1), user="u", uid=1000, gid=1000, partition="gpu", now=12)
    first = {j.id: j for j in repo.load_snapshot(20).jobs}
    assert repo.set_hold(b, True, admin=False) is None
    assert repo.update_pending(c, {"nice": 5}) is None
    repo.start_run(a, Placement(("a",), ((0,),)), now=21)
    second = {j.id: j for j in repo.load_snapshot(22).jobs}
    assert second[b] is not first[b] and second[b].hold and not first[b].hold
    assert second[c] is not first[c] and second[c].nice == 5
    assert second[a].state == JobState.RUNNING and second[a].allocation == (("a", (0,)),)
    third = {j.id: j for j in repo.load_snapshot(23).jobs}
    assert third[b] is second[b] and third[c] is second[c]  # unchanged: the same objects
    assert third[a] is not second[a]  # a running job's view is built with its ranks each pass
