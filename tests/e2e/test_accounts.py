"""Accounts, limits, fair share and abuse limits end to end, as the unprivileged test users:
default and chosen accounts, QuotaLimit on running GPUs, submission limits with a clear message
while others keep being served, live changes by admins that survive a restart, hshare, and the
per-uid connection cap."""
from __future__ import annotations

import json
import textwrap
import threading

import pytest

from hai_cluster.controller.connlimit import REFUSED_LINGERING

from .harness import OTHER_USER, TEST_USER, Cluster, start_local_cluster, user_dir, wait_for

CONFIG = f"""
[access]
max_connections_per_uid = 3

[limits]
max_pending = 6

[limits.classes]
high = {{ max_gpus = 2 }}

[fairshare]
half_life = 3600

[[accounts]]
name = "vision"
users = ["{TEST_USER}"]
shares = 3
max_gpus = 2

[[accounts]]
name = "nlp"
users = ["{OTHER_USER}", "{TEST_USER}"]
"""
DENIED = "Access/permission denied"


@pytest.fixture(scope="module")
def cluster():
    c = start_local_cluster(gpus=4, controller_toml=CONFIG)
    yield c
    c.close()


def sleep_job(cluster: Cluster, *opts: str, user: str = TEST_USER) -> int:
    return cluster.submit("--gpus-per-node=2", *opts, "--wrap", "sleep 300", user=user)


def test_accounts_quota_and_live_limits(cluster):
    first = sleep_job(cluster)
    second = sleep_job(cluster)
    theirs = sleep_job(cluster, user=OTHER_USER)
    assert cluster.job(first)["account"] == "vision" and cluster.job(theirs)["account"] == "nlp"
    cluster.wait_state(first, "RUNNING")
    cluster.wait_state(theirs, "RUNNING")
    wait_for(lambda: cluster.job(second)["reason"] == "QuotaLimit", 20, what="QuotaLimit")
    queue = cluster.cli("hqueue", "-l").stdout
    assert "ACCOUNT" in queue.splitlines()[0] and "vision" in queue and "(QuotaLimit)" in queue
    # choosing an account: one of mine yes, someone else's no, an unknown one says so
    cluster.cli("hsubmit", "-A", "nlp", "--test-only", "--wrap", "true")
    proc = cluster.cli("hsubmit", "-A", "vision", "--wrap", "true", user=OTHER_USER, check=False)
    assert proc.returncode != 0 and f"{DENIED}: user {OTHER_USER} is not in account vision" in proc.stderr
    proc = cluster.cli("hsubmit", "--account=nosuch", "--wrap", "true", check=False)
    assert proc.returncode != 0 and "Invalid account specified: nosuch" in proc.stderr
    # only admins change limits
    proc = cluster.cli("hcontrol", "update", "Account=vision", "MaxGPUs=4", check=False)
    assert proc.returncode != 0 and DENIED in proc.stderr
    assert cluster.job(second)["state"] == "PENDING"
    out = cluster.cli("hcontrol", "update", "Account=vision", "MaxGPUs=4", "Shares=5", user="root").stdout
    assert "Account=vision MaxGPUs=4" in out and "Shares=5" in out
    cluster.cli("hcancel", str(theirs), user=OTHER_USER)
    assert cluster.wait_state(second, "RUNNING")["state"] == "RUNNING"
    # the change is in the store: a restarted controller keeps it
    cluster.controller.stop()
    cluster.controller.start()
    cluster.wait_nodes(1)
    shown = cluster.cli("hcontrol", "show", "accounts").stdout
    assert "Account=vision Shares=5 MaxGPUs=4" in shown
    acct = cluster.cli("hacct", "-X", "-j", str(first), "-P", "-n", "-o", "JobID,Account").stdout
    assert acct.splitlines()[0] == f"{first}|vision"
    cluster.cli("hcancel", str(first), str(second))
    for j in (first, second):
        cluster.wait_state(j, "CANCELLED")


def test_hshare_shows_usage_and_factors(cluster):
    # the jobs of the test above ran: vision and nlp have decayed GPU-seconds
    rows = json.loads(cluster.cli("hshare", "-a", "--json").stdout)["rows"]
    by = {(r["account"], r["user"]): r for r in rows}
    assert by[("vision", TEST_USER)]["raw_usage"] > 0 and by[("nlp", OTHER_USER)]["raw_usage"] > 0
    assert 0 < by[("vision", TEST_USER)]["factor"] < 1
    assert by[("vision", None)]["raw_shares"] == 5  # the live change
    text = cluster.cli("hshare").stdout.splitlines()
    assert text[0].split() == ["Account", "User", "RawShares", "NormShares", "RawUsage", "EffectvUsage", "FairShare"]
    assert all(OTHER_USER not in line for line in text)  # without -a: my rows and the accounts'
    assert any(line.split()[:2] == ["vision", TEST_USER] for line in text)


def test_flood_hits_the_pending_limit_while_others_are_served(cluster):
    d = user_dir(cluster.workdir, TEST_USER)
    flood = d / "flood.py"
    flood.write_text(textwrap.dedent("""
        import os, sys
        from hai_cluster.cli.client import ClientError, ControllerClient
        c = ControllerClient()
        body = {"script": "#!/bin/sh\\ntrue\\n", "cwd": os.getcwd(), "option_args": ["--hold"]}
        for i in range(100000):
            try:
                c.call("submit", body)
            except ClientError as exc:
                print(f"{i} {exc}")
                sys.exit(0)
        print("never refused")
    """))
    before = len(cluster.call("jobs", {"users": [TEST_USER], "states": ["PENDING"]})["jobs"])
    out = cluster.cli("python", str(flood)).stdout.strip()
    accepted, message = out.split(" ", 1)
    assert int(accepted) + before == 6, out
    assert "job submit limit, user haitest: pending jobs 6 of at most 6" in message
    # others are still served, and may submit
    assert cluster.cli("hqueue", user=OTHER_USER).returncode == 0
    job = cluster.submit("--wrap", "true", user=OTHER_USER)
    assert cluster.wait_state(job, "COMPLETED")["state"] == "COMPLETED"
    cluster.cli("hcancel", "-u", TEST_USER)


def test_connection_cap_per_uid(cluster):
    d = user_dir(cluster.workdir, TEST_USER)
    ready, go = d / "cap-ready", d / "cap-go"
    hold = d / "hold.py"
    hold.write_text(textwrap.dedent(f"""
        import os, time
        from hai_cluster.cli.client import ClientError, ControllerClient
        held = []
        for i in range(3):
            c = ControllerClient()
            c.call("ping", {{}})
            held.append(c)
        extra = ControllerClient()
        try:
            extra.call("ping", {{}})
            print("extra served")
        except ClientError as exc:
            print(f"extra refused: {{exc}}")
        # refused connections are counted too: beyond a few lingering ones, closed unanswered
        more, told = [], 0
        for i in range(8):
            more.append(ControllerClient())
            try:
                more[-1].call("ping", {{}})
            except ClientError as exc:
                told += "too many connections" in str(exc)
        print(f"more refused: told {{told}} of 8")
        open("{ready}", "w").close()
        while not os.path.exists("{go}"):
            time.sleep(0.05)
        held.pop().close()
        again = ControllerClient()
        print("after close:", again.call("ping", {{}})["user"])
    """))
    result = []
    worker = threading.Thread(target=lambda: result.append(cluster.cli("python", str(hold))))
    worker.start()
    try:
        wait_for(ready.exists, 30, what="the connections to be held")
        # another user is not affected while haitest holds its 3
        assert cluster.cli("hqueue", user=OTHER_USER).returncode == 0
    finally:
        go.touch()
        worker.join(60)
    out = result[0].stdout
    assert "extra refused: too many connections to the controller from uid" in out, out
    assert f"more refused: told {REFUSED_LINGERING - 1} of 8" in out, out  # the extra one lingers too
    assert f"after close: {TEST_USER}" in out
    log = (cluster.workdir / "ctl.log").read_text()
    lines = [line for line in log.splitlines() if "connection(s) from uid=" in line and "connections open" in line]
    assert 1 <= len(lines) <= 2, lines  # nine refusals, summed up in a line every 10 s (not one each)


def test_per_user_limit_set_live(cluster):
    out = cluster.cli("hcontrol", "update", f"User={OTHER_USER}", "MaxGPUs=1", user="root").stdout
    assert out.strip() == f"User={OTHER_USER} MaxGPUs=1 MaxPending=6 MaxJobs=0"
    job = sleep_job(cluster, user=OTHER_USER)
    wait_for(lambda: cluster.job(job)["reason"] == "QuotaLimit", 20, what="QuotaLimit")
    for argv, text in ((("MaxGPUs=lots",), "MaxGPUs=lots is not a whole number"),
                       (("Colour=red",), "unknown field colour"), (("Shares=3",), "Shares are set per account"),
                       (("MaxGPUs=-1",), "invalid max_gpus -1")):
        proc = cluster.cli("hcontrol", "update", f"User={OTHER_USER}", *argv, user="root", check=False)
        assert proc.returncode != 0 and text in proc.stderr, proc.stderr
    cluster.cli("hcontrol", "update", f"User={OTHER_USER}", "MaxGPUs=0", user="root")
    assert cluster.wait_state(job, "RUNNING")["state"] == "RUNNING"
    cluster.cli("hcancel", str(job), user=OTHER_USER)


def test_priority_class_limit(cluster):
    """[limits.classes] high = { max_gpus = 2 }: a user's running high-priority jobs hold at most
    2 GPUs (the next waits with QuotaLimit); the same user's normal jobs are not held by it."""
    first = sleep_job(cluster, "--priority=high", user=OTHER_USER)
    second = sleep_job(cluster, "--priority=high", user=OTHER_USER)
    cluster.wait_state(first, "RUNNING")
    wait_for(lambda: cluster.job(second)["reason"] == "QuotaLimit", 20, what="QuotaLimit")
    normal = sleep_job(cluster, user=OTHER_USER)
    assert cluster.wait_state(normal, "RUNNING")["state"] == "RUNNING"
    assert cluster.job(second)["state"] == "PENDING"
    assert "Priority=high MaxGPUsPerUser=2" in cluster.cli("hcontrol", "show", "accounts").stdout
    cluster.cli("hcancel", str(first), user=OTHER_USER)
    cluster.cli("hcancel", str(normal), user=OTHER_USER)
    assert cluster.wait_state(second, "RUNNING")["state"] == "RUNNING"
    cluster.cli("hcancel", str(second), user=OTHER_USER)
    for j in (first, second, normal):
        cluster.wait_state(j, "CANCELLED")
