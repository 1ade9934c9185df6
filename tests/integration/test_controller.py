"""The controller on each store (SQLite, PostgreSQL) with one local agent: jobs run, survive a
controller SIGKILL, and bad input on its socket changes nothing."""
from __future__ import annotations

import signal
import socket

import pytest

from hai_cluster.cli.client import ClientError
from hai_cluster.protocol.codec import HEADER

from ..e2e.harness import TEST_USER, start_local_cluster, user_dir, wait_for


@pytest.fixture(params=["sqlite", "postgresql"])
def cluster(request):
    c = start_local_cluster(database=None if request.param == "sqlite" else request.getfixturevalue("postgres_url"))
    yield c
    c.close()


def test_job_survives_controller_kill(cluster):
    flag = user_dir(cluster.workdir, TEST_USER) / "go"
    first = cluster.submit("--gpus-per-node=2", "--wrap", f"while [ ! -e {flag} ]; do sleep 0.1; done; echo ok")
    second = cluster.submit("--gpus-per-node=2", "--wrap", "echo second")
    cluster.wait_state(first, "RUNNING")
    assert cluster.job(second)["state"] == "PENDING"
    cluster.controller.kill(signal.SIGKILL)
    flag.touch()
    cluster.controller.start()
    assert cluster.wait_state(first, "COMPLETED", "FAILED")["state"] == "COMPLETED"
    assert cluster.wait_state(second, "COMPLETED", "FAILED")["state"] == "COMPLETED"
    assert [r["state"] for r in cluster.job(first)["runs"]] == ["COMPLETED"]


def test_failed_job_reports_exit_code(cluster):
    job = cluster.submit("--wrap", "exit 3")
    done = cluster.wait_state(job, "COMPLETED", "FAILED")
    assert (done["state"], done["exit_code"]) == ("FAILED", 3)
    row = cluster.cli("hacct", "-X", "-j", str(job), "-P", "-n", "-o", "State,ExitCode").stdout.strip()
    assert row == "FAILED|3:0"


def test_garbage_and_malformed_requests_change_nothing(cluster):
    before = cluster.call("jobs", {"all": True})["jobs"]
    for junk in (b"GET / HTTP/1.0\r\n\r\n", HEADER.pack(2**31) + b"x", HEADER.pack(3) + b"\xc1\xc1\xc1", b"\x00"):
        s = socket.socket(socket.AF_UNIX)
        s.connect(cluster.socket)
        s.sendall(junk)
        s.shutdown(socket.SHUT_WR)
        s.settimeout(10)
        while s.recv(4096):
            pass  # the controller closes this connection
        s.close()
    for method, body, text in [
        ("submit", {"cwd": 7}, "wrong type"),
        ("submit", {"script": "#!/bin/sh\n", "cwd": "/tmp", "option_args": ["--nodes=0"]}, "nodes"),
        ("submit", {"script": "no shebang", "cwd": "/tmp"}, "does not look like a batch script"),
        ("submit", "not a map", "must be a map"),
        ("cancel", {}, "No job identification"),
        ("cancel", {"ids": ["x"]}, "list of job ids"),
        ("jobs", {"states": ["SLEEPING"]}, "invalid job state"),
        ("show_job", {"job_id": 123456}, "Invalid job id"),
        ("drop_tables", {}, "not allowed"),
    ]:
        with pytest.raises(ClientError, match=text):
            cluster.call(method, body)
    assert cluster.call("jobs", {"all": True})["jobs"] == before
    assert cluster.controller.proc.poll() is None
    assert cluster.call("ping", {})["uid"] == 0


def test_agent_link_loss_shows_not_responding(cluster):
    cluster.agents["local1"].kill(signal.SIGKILL)
    wait_for(lambda: not cluster.call("nodes", {})["nodes"][0]["responding"], 30, what="node not responding")
    assert "idle*" in cluster.cli("hinfo").stdout
    job = cluster.submit("--wrap", "true")
    wait_for(lambda: cluster.job(job)["reason"] == "Resources", 10, what="reason Resources")
    cluster.agents["local1"].start()
    assert cluster.wait_state(job, "COMPLETED", "FAILED")["state"] == "COMPLETED"


def test_users_may_not_raise_their_priority_beyond_the_configured_class(cluster):
    proc = cluster.cli("hsubmit", "--priority=urgent", "--hold", "--wrap", "true", check=False)
    assert proc.returncode != 0 and "--priority=urgent is above what users may ask for (high)" in proc.stderr
    mine = cluster.submit("--priority=high", "--hold", "--wrap", "true")
    assert cluster.job(mine)["priority"] == "high"
    admin = cluster.submit("--priority=urgent", "--hold", "--wrap", "true", user="root")
    assert cluster.job(admin)["priority"] == "urgent"
    # A user's own hold is theirs to release; an administrator's hold is not.
    cluster.cli("hcontrol", "release", str(mine))
    assert cluster.wait_state(mine, "COMPLETED")["state"] == "COMPLETED"
    held = cluster.submit("--wrap", "true", "--hold")
    cluster.cli("hcontrol", "hold", str(held), user="root")
    wait_for(lambda: cluster.job(held)["reason"] == "JobHeldAdmin", 10, what="admin hold reason")
    proc = cluster.cli("hcontrol", "release", str(held), check=False)
    assert proc.returncode != 0 and "held by an administrator" in proc.stderr
    cluster.cli("hcontrol", "release", str(held), user="root")
    assert cluster.wait_state(held, "COMPLETED")["state"] == "COMPLETED"
    cluster.cli("hcancel", str(admin), user="root")
