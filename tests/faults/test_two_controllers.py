"""Two controllers on one PostgreSQL store: the standby takes over when the active one is
SIGKILLed, jobs go on and the invariants hold; an old leader that was SIGSTOPped and resumed after
a takeover changes nothing (its writes are fenced, it sends agents nothing) and stops by itself.

Takeover times are printed (run with -s); scripts/benchmarks/takeover.py measures them."""
from __future__ import annotations

import os
import random
import signal
import threading
import time

import pytest

from hai_cluster.cli.client import ClientError, ControllerClient
from tests.e2e.harness import Daemon, python_daemon, start_ssh_cluster, wait_for
from tests.faults.invariants import check_invariants, submit_workload

pytestmark = pytest.mark.timeout(600)

# The production order (gittins) with a restart cost of 0.2 s: a run may be preempted 2 s into it.
SCHEDULER = '[scheduler]\nrestart_cost = 0.2\n'
LEASE = 3.0
CONTROLLER = f"node_down_after = 30.0\nping_interval = 0.5\nlease_duration = {LEASE}\n"
SEED = int(os.environ.get("HAI_CHAOS_SEED", random.SystemRandom().randrange(10**6)))


def second_controller(cluster, name: str) -> tuple[Daemon, str]:
    """The same configuration as the cluster's controller, on another socket (another host in life)."""
    base = cluster.workdir
    sock = str(base / f"{name}.sock")
    (base / f"{name}.toml").write_text((base / "controller.toml").read_text().replace(cluster.socket, sock))
    return Daemon(python_daemon("hai_cluster.controller.daemon", base / f"{name}.toml"), base / f"{name}.log"), sock


def answer(sock: str, method: str = "nodes"):
    """The reply, or the error text."""
    client = ControllerClient(sock, timeout=10)
    try:
        return client.call(method, {})
    except ClientError as exc:
        return str(exc)
    finally:
        client.close()


def wait_active(sock: str, nodes: int, since: float) -> tuple[float, float]:
    """Seconds from `since` until the controller at `sock` answers as the active one, and until it
    has every node back."""
    active = wait_for(lambda: isinstance(answer(sock), dict) and time.monotonic(), 60, 0.05,
                      f"{sock} to become active")
    wait_for(lambda: sum(n["responding"] for n in answer(sock)["nodes"]) == nodes, 60, 0.05,
             f"{sock} to reach every node")
    return active - since, time.monotonic() - since


@pytest.fixture
def pair(ssh_nodes, postgres_url):
    cluster = start_ssh_cluster(ssh_nodes, gpus_per_node=4, scheduler_toml=SCHEDULER, controller_toml=CONTROLLER,
                                database=postgres_url)
    standby, sock = second_controller(cluster, "standby")
    standby.start()
    extra = [standby]
    try:
        yield cluster, standby, sock, extra
    finally:
        for d in extra:
            if d.proc and d.proc.poll() is not None:
                continue
            d.proc.send_signal(signal.SIGCONT)
        for d in extra:
            if d is not cluster.controller:
                d.stop()
        cluster.close()


def test_standby_takes_over_and_a_resumed_old_leader_is_fenced(pair, ssh_nodes):
    cluster, standby, standby_sock, extra = pair
    first, first_sock = cluster.controller, cluster.socket
    rng = random.Random(SEED)
    # The standby refuses clients and names the active controller.
    refused = wait_for(lambda: (lambda r: isinstance(r, str) and "not the active controller (active: " in r
                                        and "not known yet" not in r and r)(
        answer(standby_sock)), 30, 0.2, "the standby to answer")
    assert f"active: {os.uname().nodename}:{first_sock}" in refused, refused
    cli = cluster.cli("hqueue", check=False, env={"HAI_CONTROLLER": standby_sock})
    assert cli.returncode != 0 and "not the active controller" in cli.stderr, cli

    acked = submit_workload(cluster, rng, 12)
    wait_for(lambda: answer(first_sock, "jobs")["jobs"] and any(
        j["state"] == "RUNNING" for j in answer(first_sock, "jobs")["jobs"]), 60, 0.2, "jobs running")

    # 1. SIGKILL the active controller: the standby takes over.
    t0 = time.monotonic()
    first.kill(signal.SIGKILL)
    to_api, to_nodes = wait_active(standby_sock, len(ssh_nodes), t0)
    print(f"\ntakeover after SIGKILL (lease {LEASE:g} s): serving {to_api:.2f} s, every node {to_nodes:.2f} s")
    cluster.socket, cluster.controller = standby_sock, standby
    acked += submit_workload(cluster, rng, 6)
    epochs = {n.name: int((cluster.workdir / n.name / "spool" / "controller_epoch").read_text())
              for n in ssh_nodes}
    assert set(epochs.values()) == {2}, epochs

    # The killed one comes back (systemd would restart it): now it is the standby.
    first.start()
    extra.append(first)
    wait_for(lambda: "not the active controller" in str(answer(first_sock)), 60, 0.2, "the old active as standby")

    # 2. SIGSTOP the new active controller; the other takes over; then it wakes up.
    stopped = standby
    stopped.proc.send_signal(signal.SIGSTOP)
    # A client request queued on the stopped controller's socket, served only after it resumes.
    late: list = []
    script = cluster.workdir / "late.sh"
    script.write_text("#!/bin/sh\ntrue\n")
    os.chmod(script, 0o755)
    sender = threading.Thread(target=lambda: late.append(cluster.cli(
        "hsubmit", "--parsable", "-J", "late-submit", "-o", "/dev/null", str(script), check=False,
        env={"HAI_CONTROLLER": standby_sock})))
    t0 = time.monotonic()
    sender.start()
    to_api, to_nodes = wait_active(first_sock, len(ssh_nodes), t0)
    print(f"takeover after SIGSTOP (lease {LEASE:g} s): serving {to_api:.2f} s, every node {to_nodes:.2f} s")
    cluster.socket, cluster.controller = first_sock, first
    acked += submit_workload(cluster, rng, 6)
    log_at = stopped.log.stat().st_size
    stopped.proc.send_signal(signal.SIGCONT)
    assert stopped.proc.wait(60) == 3  # it found it lost the lease and stopped by itself
    sender.join(60)
    assert late and late[0].returncode != 0, late
    woke = stopped.log.read_bytes()[log_at:].decode(errors="replace")
    assert "no longer the active controller" in woke, woke
    # What it did after waking: nothing recorded, nothing started, no agent told anything.
    for acted in ("starting on", "run ended", "preempting", "recording it lost", "is down"):
        assert acted not in woke, woke
    names = [j["name"] for j in cluster.call("jobs", {"all": True})["jobs"]]
    assert "late-submit" not in names
    epochs = {n.name: int((cluster.workdir / n.name / "spool" / "controller_epoch").read_text())
              for n in ssh_nodes}
    assert set(epochs.values()) == {3}, epochs

    check_invariants(cluster, acked, f"seed {SEED}")


def test_a_second_controller_on_one_sqlite_file_refuses_to_start():
    from tests.e2e.harness import start_local_cluster

    cluster = start_local_cluster()
    try:
        second, sock = second_controller(cluster, "second")
        second.start()
        assert second.proc.wait(60) == 2
        said = second.log.read_text()
        assert "is in use by another controller" in said and "SQLite supports one controller only" in said, said
        assert not os.path.exists(sock)
        assert isinstance(answer(cluster.socket), dict)  # the first one carries on
    finally:
        cluster.close()
