"""Submissions that cannot be lost or doubled (issue 22's fault findings): a retry with the same
idempotency key returns the job the first attempt made, and a submission's event is written by
the transaction that records the job, so a controller killed right after the replies leaves no
job without its `submitted` event."""
from __future__ import annotations

import signal
import sqlite3

import pytest
from sqlalchemy import func, select

from hai_cluster.cli.client import ClientError
from hai_cluster.core.model import JobSpec
from hai_cluster.store import submit_keys
from hai_cluster.store.engine import make_engine, upgrade
from hai_cluster.store.repository import Repository
from hai_cluster.store.schema import jobs

from ..e2e.harness import TEST_USER, ensure_user, start_local_cluster, wait_for


def spec(**kw) -> JobSpec:
    return JobSpec(script="#!/bin/sh\ntrue\n", workdir="/tmp", gpus_per_node=1, **kw)


def test_the_store_keeps_a_key_per_user_and_prunes_it_after_a_day(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path}/hai.db")
    upgrade(engine)
    repo = Repository(engine)
    key = "k" * 32
    first = repo.submit(spec(), user="u", uid=1000, gid=1000, partition="p", now=100.0, key=key)
    built = []
    again = repo.submit(spec(), user="u", uid=1000, gid=1000, partition="p", now=101.0, key=key,
                        events=lambda job_id: built.append(job_id) or [])
    assert again == first and built == []  # nothing recorded, no events built: the change did not happen
    other = repo.submit(spec(), user="v", uid=1001, gid=1001, partition="p", now=102.0, key=key)
    assert other != first  # keys are per user: another user's same key is another job
    array = repo.submit(spec(array="0-3"), user="u", uid=1000, gid=1000, partition="p", now=103.0, key="a" * 32)
    assert repo.submit(spec(array="0-3"), user="u", uid=1000, gid=1000, partition="p", now=104.0,
                       key="a" * 32) == array
    with engine.connect() as c:
        assert c.execute(select(func.count()).select_from(jobs)).scalar() == 2 + 4
    assert submit_keys.prune(engine, before=100.5) == 1  # the first key is a day old: gone
    assert repo.submit(spec(), user="u", uid=1000, gid=1000, partition="p", now=100.0 + 86400, key=key) not in (
        first, other, array)
    engine.dispose()


@pytest.fixture(scope="module")
def cluster():
    c = start_local_cluster(gpus=1, tick=30.0)  # passes only when woken: no flush by the clock
    yield c
    c.close()


def test_a_key_sent_twice_gives_the_same_job_and_a_bad_key_is_refused(cluster):
    body = {"cwd": "/tmp", "env": {}, "option_args": ["--hold"], "script": "#!/bin/sh\ntrue\n"}
    first = cluster.call("submit", {**body, "key": "retry-0123456789abcdef"})["job_id"]
    second = cluster.call("submit", {**body, "key": "retry-0123456789abcdef"})["job_id"]
    third = cluster.call("submit", {**body, "key": "retry-fedcba9876543210"})["job_id"]
    assert first == second != third
    listed = [j["id"] for j in cluster.call("jobs", {"all": True})["jobs"]]
    assert listed.count(first) == 1
    for bad in ("short", "x" * 65, "has space 0123456789", "ключ-0123456789abcdef"):
        with pytest.raises(ClientError, match="field 'key' must be 16 to 64 letters, digits, '-' or '_'"):
            cluster.call("submit", {**body, "key": bad})
    with pytest.raises(ClientError, match="field 'key'"):
        cluster.call("submit", {**body, "key": 12345678901234567890})
    assert [j["id"] for j in cluster.call("jobs", {"all": True})["jobs"]] == listed  # refusals changed nothing


def test_a_controller_killed_after_the_replies_left_every_job_its_submitted_event(cluster):
    """Held jobs wake no pass, and this controller's tick is 30 s: an event buffered until a flush
    would be lost with the SIGKILL below (6 to 34 per run in the fault experiments)."""
    ensure_user(TEST_USER)
    ids = [cluster.submit("--hold", "--wrap", "true") for _ in range(8)]
    cluster.controller.kill(signal.SIGKILL)
    db = sqlite3.connect(cluster.workdir / "hai.db")
    try:
        submitted = {r[0] for r in db.execute("SELECT job_id FROM events WHERE kind = 'submitted'")}
        held = {r[0] for r in db.execute("SELECT job_id FROM events WHERE kind = 'waiting'")}
    finally:
        db.close()
    assert set(ids) <= submitted and set(ids) <= held
    cluster.controller.start()  # the module's last test: the fixture's close cancels what is left
    wait_for(lambda: _answers(cluster), 30, what="the controller to serve again")
    out = cluster.cli("hcontrol", "show", "events", str(ids[-1])).stdout
    assert "event=submitted" in out and "reason=JobHeldUser" in out


def _answers(cluster) -> bool:
    try:
        cluster.call("jobs", {})
        return True
    except ClientError:
        return False
