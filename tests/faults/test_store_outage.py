"""PostgreSQL goes away under load and comes back: the controller refuses what it cannot record
(with a clear message), makes no decision meanwhile, loses no acknowledged submission, and
carries on by itself once the store is back."""
from __future__ import annotations

import threading
import time

import pytest

from hai_cluster.cli.client import ClientError, ControllerClient
from tests.e2e.harness import start_local_cluster, wait_for
from tests.infra.postgres import PrivatePostgres


@pytest.fixture
def pg():
    server = PrivatePostgres(database="hai")
    server.start()
    yield server
    server.close()


@pytest.fixture
def cluster(pg):
    c = start_local_cluster(database=pg.url("hai"), gpus=4, tick=0.2, agent_toml="allow_root_jobs = true")
    yield c
    c.close()


def submitter(cluster, stop: threading.Event, acked: list, refused: list) -> None:
    client = ControllerClient(cluster.socket, timeout=30)
    while not stop.is_set():
        body = {"script": "#!/bin/sh\nsleep 0.2\n", "cwd": str(cluster.workdir), "env": {},
                "option_args": ["--gpus-per-node=1", "-o", "/dev/null"]}
        try:
            acked.append(client.call("submit", body)["job_id"])
        except ClientError as exc:
            refused.append(str(exc))
            client.close()
        time.sleep(0.05)
    client.close()


def test_postgres_restart_under_load_loses_no_acknowledged_job(cluster, pg):
    stop = threading.Event()
    acked: list[int] = []
    refused: list[str] = []
    t = threading.Thread(target=submitter, args=(cluster, stop, acked, refused), daemon=True)
    t.start()
    try:
        wait_for(lambda: len(acked) >= 10, 60, what="some jobs accepted before the outage")
        pg.stop()
        wait_for(lambda: refused, 30, what="a submission refused during the outage")
        time.sleep(2)  # the controller keeps running without its store for a while
        assert cluster.controller.proc.poll() is None
        pg.resume()
        before = len(acked)
        wait_for(lambda: len(acked) >= before + 10, 60, what="submissions accepted again")
    finally:
        stop.set()
        t.join(30)
    assert all("store is unavailable" in r for r in refused), refused[:3]
    # Every acknowledged submission exists and runs to completion; nothing else was created.
    def all_done():
        jobs = cluster.call("jobs", {"all": True})["jobs"]
        return len(jobs) == len(acked) and all(j["state"] == "COMPLETED" for j in jobs) and jobs
    try:
        jobs = wait_for(all_done, 120, what="every acknowledged job to complete")
    except AssertionError:
        from collections import Counter
        jobs = cluster.call("jobs", {"all": True})["jobs"]
        stuck = [j for j in jobs if j["state"] != "COMPLETED"][:5]
        raise AssertionError(f"{len(jobs)} jobs for {len(acked)} acks; states "
                             f"{Counter(j['state'] for j in jobs)}; e.g. {stuck}") from None
    assert sorted(j["id"] for j in jobs) == sorted(acked)
