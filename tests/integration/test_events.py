"""The event log on a real controller and agent: a job's history and a node's, as hcontrol shows
them and as the controller logs them; bad requests change nothing."""
from __future__ import annotations

import pytest
from sqlalchemy import insert, select

from hai_cluster.cli.client import ClientError
from hai_cluster.controller.events import EventLog
from hai_cluster.store.engine import make_engine, upgrade
from hai_cluster.store.events import add_events, events_query, prune_events, read_events
from hai_cluster.store.schema import event_nodes, events

from ..e2e.harness import OTHER_USER, TEST_USER, start_local_cluster, wait_for


@pytest.fixture(scope="module")
def cluster():
    c = start_local_cluster(gpus=2)
    yield c
    c.close()


def kinds(cluster, *argv, user=TEST_USER) -> list[str]:
    out = cluster.cli("hcontrol", "show", "events", *argv, user=user).stdout.splitlines()
    return [line.split()[1] for line in out]


def test_a_jobs_history_says_why_it_waited_who_released_it_and_how_it_ended(cluster):
    job = cluster.submit("--hold", "--gpus-per-node=1", "--wrap", "exit 0")
    wait_for(lambda: cluster.job(job)["reason"] == "JobHeldUser", 10, what="held reason")
    cluster.cli("hcontrol", "release", str(job), user="root")
    cluster.wait_state(job, "COMPLETED", "FAILED")
    wait_for(lambda: "event=ended" in cluster.cli("hcontrol", "show", "events", str(job)).stdout, 10,
             what="the end in the history")
    every = cluster.cli("hcontrol", "show", "events", str(job)).stdout.splitlines()
    # Once released it may wait again, for the GPU an earlier test's job still holds: the
    # history says so (a second "waiting"), which is right, but not what this test is about.
    lines = every[:3] + [line for line in every[3:] if line.split()[1] != "event=waiting"]
    assert [line.split()[1] for line in lines] == [
        "event=submitted", "event=waiting", "event=released", "event=started", "event=ended"], every
    assert all("reason=JobHeldUser" not in line for line in every[3:]), every
    assert f"job={job} user={TEST_USER}" in lines[0] and "hold=True" in lines[0]
    assert "reason=JobHeldUser" in lines[1]
    assert "by=root" in lines[2]
    assert "node=local1" in lines[3] and "gpus=local1:0" in lines[3] and "attempt=0" in lines[3]
    assert "state=COMPLETED" in lines[4] and "exit_code=0" in lines[4]
    # The same lines went to the controller's log (journald in production).
    log = (cluster.workdir / "ctl.log").read_text()
    assert f"event=started job={job} node=local1" in log
    # --last N keeps the newest.
    assert kinds(cluster, "--last", "2", str(job)) == ["event=started", "event=ended"]


def test_a_nodes_history_has_admin_state_changes_and_the_jobs_it_ran(cluster):
    job = cluster.submit("--wrap", "true")
    cluster.wait_state(job, "COMPLETED", "FAILED")
    cluster.cli("hcontrol", "update", "NodeName=local1", "State=DRAIN", "Reason=firmware", user="root")
    cluster.cli("hcontrol", "update", "NodeName=local1", "State=RESUME", user="root")
    out = cluster.cli("hcontrol", "show", "events", "--node", "local1").stdout
    assert "event=node_up node=local1" in out
    assert f"event=started job={job} node=local1" in out
    assert "event=node_state node=local1 state=drain by=root reason=firmware" in out
    assert "event=node_state node=local1 state=up by=root" in out


def test_bad_event_requests_are_refused_clearly(cluster):
    job = cluster.submit("--hold", "--wrap", "true")
    for argv, text in [((), "needs a job id or --node"),
                       (("--node", "local1", str(job)), "needs a job id or --node"),
                       (("nojob",), "Invalid job id specified: nojob"),
                       (("987654",), "Invalid job id specified: 987654"),
                       (("--node", "nosuchnode"), "Node nosuchnode not found")]:
        proc = cluster.cli("hcontrol", "show", "events", *argv, check=False)
        assert proc.returncode != 0 and text in proc.stderr, (argv, proc.stderr)
    proc = cluster.cli("hcontrol", "show", "events", str(job), user=OTHER_USER, check=False)
    assert proc.returncode != 0 and "Access/permission denied" in proc.stderr
    for body, text in [({}, "one of them"), ({"job_id": job, "limit": 0}, "limit must be positive"),
                       ({"node": 3}, "wrong type"), ({"node": "y" * 60_000}, "Node name too long")]:
        with pytest.raises(ClientError, match=text):
            cluster.call("events", body)
    cluster.cli("hcancel", str(job))


def test_store_reads_by_job_and_node_and_prunes_by_age(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path}/hai.db")
    upgrade(engine)
    log = EventLog()
    log.record("submitted", 1, now=10.0, user="u")
    log.record("started", 1, "a,b", now=20.0, gpus="a:0 b:0")
    log.record("started", 2, "ab", now=30.0)
    log.record("node_down", None, "b", now=40.0, reason="gone", runs=None)
    add_events(engine, log.take())
    assert log.take() == []
    assert [e["kind"] for e in read_events(engine, job_id=1)] == ["submitted", "started"]
    # A gang start names every node; a node's name is matched whole, not as a prefix.
    assert [(e["job_id"], e["kind"]) for e in read_events(engine, node="b")] == [(1, "started"), (None, "node_down")]
    assert [e["job_id"] for e in read_events(engine, node="a")] == [1]
    assert read_events(engine, node="b")[1]["detail"] == {"reason": "gone"}
    assert [e["kind"] for e in read_events(engine, job_id=1, limit=1)] == ["started"]
    assert prune_events(engine, before=25.0) == 2
    assert [e["time"] for e in read_events(engine, node="b")] == [40.0]
    with engine.connect() as c:  # the pruned events' node rows went with them
        assert sorted(c.execute(select(event_nodes.c.node)).scalars()) == ["ab", "b"]
    engine.dispose()


def test_a_nodes_history_is_read_through_its_index(tmp_path):
    """Eighth audit: a node's history was four LIKE patterns over every event (0.5 s at 2,000,000
    events, on the store's one thread, for a name that matched nothing). Now the nodes of each
    event have rows of their own, and the lookup reads the index of (node, event id)."""
    engine = make_engine(f"sqlite:///{tmp_path}/hai.db")
    upgrade(engine)
    q = events_query(node="nosuch", limit=10_000).compile(engine, compile_kwargs={"literal_binds": True})
    with engine.connect() as c:
        plan = " ".join(str(r[-1]) for r in c.exec_driver_sql(f"EXPLAIN QUERY PLAN {q}"))
    engine.dispose()
    assert "ix_event_nodes_node" in plan and "SCAN events" not in plan, plan


def test_the_migration_copies_the_nodes_of_existing_events(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path}/hai.db")
    upgrade(engine, "0014")
    with engine.begin() as c:
        c.execute(insert(events), [{"time": 1.0, "kind": "started", "job_id": 1, "node": "a,b", "detail": {}},
                                   {"time": 2.0, "kind": "submitted", "job_id": 2, "node": None, "detail": {}},
                                   {"time": 3.0, "kind": "node_down", "job_id": None, "node": "b", "detail": {}}])
    upgrade(engine)
    assert [e["time"] for e in read_events(engine, node="b")] == [1.0, 3.0]
    assert [e["time"] for e in read_events(engine, node="a")] == [1.0]
    engine.dispose()


def test_listings_send_only_the_fields_asked_for(cluster):
    job = cluster.submit("--hold", "--job-name=few", "--wrap", "true")
    full = next(j for j in cluster.call("jobs", {})["jobs"] if j["id"] == job)
    few = next(j for j in cluster.call("jobs", {"fields": ["id", "name", "level", "code"]})["jobs"] if j["id"] == job)
    assert few == {"id": job, "name": "few", "level": full["level"], "code": "PD"}
    with pytest.raises(ClientError, match="unknown job field"):
        cluster.call("jobs", {"fields": ["id", "spec"]})
    assert f"{job} " in cluster.cli("hqueue", "-h", "-o", "%i %j %L %R").stdout
    cluster.cli("hcancel", str(job))

