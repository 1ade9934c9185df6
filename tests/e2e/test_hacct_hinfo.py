"""hacct, hinfo, hcontrol show/update node and hcontrol requeue through the CLI on a real (local)
cluster: sacct's and sinfo's views, one accounting row per run."""
from __future__ import annotations

import datetime
import json
import pwd

import pytest

from .harness import OTHER_USER, TEST_USER, start_local_cluster, user_dir, wait_for

NODE = "local1"
NODE_CPUS = 48  # what the agent offers, from its config (agent.cpus), not the machine's count


@pytest.fixture(scope="module")
def cluster():
    c = start_local_cluster(node=NODE, gpus=2, agent_toml=f"cpus = {NODE_CPUS}")  # not the machine's count
    yield c
    c.close()


def running(cluster, name: str, *argv: str, user: str = TEST_USER) -> int:
    mark = user_dir(cluster.workdir, user) / f"{name}.started"
    j = cluster.submit("-J", name, "-o", "/dev/null", *argv, "--wrap", f"touch {mark}; exec sleep 1000", user=user)
    wait_for(mark.exists, 30, what=f"{name} to run")
    return j


def acct(cluster, *argv: str, user: str = TEST_USER) -> list[str]:
    return cluster.cli("hacct", "-X", "-P", "-n", *argv, user=user).stdout.splitlines()


def iso(t: float) -> str:
    return datetime.datetime.fromtimestamp(t).strftime("%Y-%m-%dT%H:%M:%S")


def test_hacct_default_fields_are_sacct_s(cluster):
    j = cluster.submit("-J", "plain", "-o", "/dev/null", "--wrap", "true")
    cluster.wait_state(j, "COMPLETED")
    lines = cluster.cli("hacct", "-j", str(j)).stdout.splitlines()
    assert lines[0].split() == ["JobID", "JobName", "Partition", "Account", "AllocCPUS", "State", "ExitCode"]
    assert lines[1].split() == [str(j), "plain", "gpu", "default", "1", "COMPLETED", "0:0"]
    assert lines[2].split() == [f"{j}.batch", "batch", "default", "1", "COMPLETED", "0:0"]  # no partition
    assert len(lines) == 3


def test_hacct_field_list_with_widths(cluster):
    j = cluster.submit("-J", "a-rather-long-job-name", "-o", "/dev/null", "--wrap", "true")
    cluster.wait_state(j, "COMPLETED")
    header, row = cluster.cli("hacct", "-X", "-j", str(j), "-o", "JobID,JobName%6,State%12,ExitCode").stdout.splitlines()
    assert header.split() == ["JobID", "JobNam", "State", "ExitCode"]  # %6 cuts the header and the name
    assert row.split() == [str(j), "a-rath", "COMPLETED", "0:0"]
    # %12 pads the state column to 12 characters: ExitCode starts 13 after State, on every line
    assert header.index("ExitCode") == header.index("State") + 13 == row.index("0:0")
    assert row.index("COMPLETED") == header.index("State")
    assert acct(cluster, "-j", str(j), "-o", "jobid,STATE,jobname") == [f"{j}|COMPLETED|a-rather-long-job-name"]
    res = cluster.cli("hacct", "-X", "-o", "JobID,Bogus", check=False)
    assert res.returncode != 0 and "invalid field 'Bogus'" in res.stderr


def test_hacct_exit_code_is_code_colon_signal(cluster):
    code = cluster.submit("-o", "/dev/null", "--wrap", "exit 3")
    sig = cluster.submit("-o", "/dev/null", "--wrap", "kill -SEGV $$")
    for j in (code, sig):
        cluster.wait_state(j, "FAILED")
    assert acct(cluster, "-j", f"{code},{sig}", "-o", "JobID,State,ExitCode") == [
        f"{code}|FAILED|3:0", f"{sig}|FAILED|0:11"]


def test_hacct_shows_cancelled_by_uid(cluster):
    mine = running(cluster, "tocancel")
    cluster.cli("hcancel", str(mine))
    theirs = cluster.submit("--hold", "--wrap", "true", user=OTHER_USER)
    cluster.cli("hcancel", str(theirs), user="root")
    cluster.wait_state(mine, "CANCELLED")
    uid = pwd.getpwnam(TEST_USER).pw_uid
    assert acct(cluster, "-j", f"{mine},{theirs}", "-o", "JobID,State") == [
        f"{mine}|CANCELLED by {uid}", f"{theirs}|CANCELLED by 0"]


def test_hacct_time_window_user_filter_and_json(cluster):
    mine = cluster.submit("-J", "window", "-o", "/dev/null", "--wrap", "true")
    theirs = cluster.submit("-J", "window", "-o", "/dev/null", "--wrap", "true", user=OTHER_USER)
    for j in (mine, theirs):
        cluster.wait_state(j, "COMPLETED")
    job = cluster.job(mine)
    before, after = iso(job["submit_time"] - 120), iso(job["end_time"] + 120)
    ids = lambda *argv: {int(r.split("|")[0]) for r in acct(cluster, "-o", "JobID", *argv)}  # noqa: E731
    assert {mine, theirs} <= ids("-S", before)  # the default window (from midnight) holds both too
    assert {mine, theirs} <= ids("-S", before, "-E", after)
    assert not {mine, theirs} & ids("-S", after)  # ended before the window opens
    assert not {mine, theirs} & ids("-S", iso(job["submit_time"] - 600), "-E", before)  # submitted after it closes
    assert mine in ids("-u", TEST_USER) and theirs not in ids("-u", TEST_USER)
    assert theirs in ids("-u", OTHER_USER) and mine not in ids("-u", OTHER_USER)
    assert mine in ids("--me") and theirs not in ids("--me")
    res = cluster.cli("hacct", "-X", "-S", "not-a-time", check=False)
    assert res.returncode != 0 and "not-a-time" in res.stderr
    reply = json.loads(cluster.cli("hacct", "-X", "--json", "-j", str(mine)).stdout)
    assert [(j["id"], j["state"], j["user"]) for j in reply["jobs"]] == [(mine, "COMPLETED", TEST_USER)]
    assert [(r["job_id"], r["state"]) for r in reply["runs"]] == [(mine, "COMPLETED")]


def test_hacct_gpu_hours_count_gpus_times_elapsed(cluster):
    j = cluster.submit("--gpus-per-node=2", "-o", "/dev/null", "--wrap", "sleep 2")
    job = cluster.wait_state(j, "COMPLETED")
    run = job["runs"][0]
    elapsed = int(run["end_time"] - run["start_time"])
    assert elapsed >= 2
    assert acct(cluster, "-j", str(j), "-o", "JobID,AllocGPUS,GPUHours,Restarts") == [
        f"{j}|2|{2 * elapsed / 3600:.2f}|0"]


def test_requeue_gives_restarts_plus_one_and_one_accounting_row_per_run(cluster):
    j = running(cluster, "requeued", "--grace=1")
    mark = user_dir(cluster.workdir, TEST_USER) / "requeued.started"
    mark.unlink()
    cluster.cli("hcontrol", "requeue", str(j))
    wait_for(mark.exists, 60, what="the second run")
    assert cluster.job(j)["restart_count"] == 1
    mark.unlink()
    cluster.cli("hcontrol", "preempt", str(j), user="root")
    wait_for(mark.exists, 60, what="the third run")
    job = cluster.job(j)
    assert (job["state"], job["restart_count"]) == ("RUNNING", 2)
    assert acct(cluster, "-j", str(j), "-o", "JobID,State,Restarts") == [
        f"{j}|REQUEUED|0", f"{j}|PREEMPTED|1", f"{j}|RUNNING|2"]
    cluster.cli("hcancel", str(j))
    cluster.wait_state(j, "CANCELLED")


def test_no_requeue_job_is_refused_with_a_clear_message(cluster):
    j = running(cluster, "pinned", "--no-requeue")
    res = cluster.cli("hcontrol", "requeue", str(j), check=False)
    assert res.returncode != 0 and f"Requeue of job {j} refused: it was submitted with --no-requeue" in res.stderr, res.stderr
    assert cluster.job(j)["restart_count"] == 0
    cluster.cli("hcancel", str(j))
    cluster.wait_state(j, "CANCELLED")


def node_states(cluster, *argv: str) -> list[list[str]]:
    return [line.split() for line in cluster.cli("hinfo", "-h", *argv).stdout.splitlines()]


def test_hinfo_default_view_node_view_and_state_filters(cluster):
    header = cluster.cli("hinfo").stdout.splitlines()[0].split()
    assert header == ["PARTITION", "AVAIL", "TIMELIMIT", "NODES", "STATE", "GPUS(A/T)", "NODELIST"]
    assert node_states(cluster) == [["gpu*", "up", "UNLIMITED", "1", "idle", "0/2", NODE]]
    assert cluster.cli("hinfo", "-N").stdout.splitlines()[0].split()[:5] == [
        "NODELIST", "PARTITION", "STATE", "CPUS", "GPUS(A/T)"]
    assert [r[:5] for r in node_states(cluster, "-N")] == [[NODE, "gpu", "idle", str(NODE_CPUS), "0/2"]]
    assert [r[0] for r in node_states(cluster, "-N", "-t", "idle")] == [NODE]
    assert node_states(cluster, "-N", "-t", "alloc,mix") == []
    one = running(cluster, "half", "--gpus-per-node=1")
    assert [r[4] for r in node_states(cluster, "-t", "mix")] == ["mix"]
    two = running(cluster, "full", "--gpus-per-node=1")
    assert [r[4:6] for r in node_states(cluster, "-t", "alloc")] == [["alloc", "2/2"]]
    assert node_states(cluster, "-t", "idle,mix") == []
    for j in (one, two):
        cluster.cli("hcancel", str(j))
        cluster.wait_state(j, "CANCELLED")
    res = cluster.cli("hinfo", "-t", "sleepy", check=False)
    assert res.returncode != 0 and "invalid node state in 'sleepy'" in res.stderr


def test_hcontrol_update_node_drain_resume_and_down_show_in_hinfo_and_show_node(cluster):
    cluster.cli("hcontrol", "update", f"NodeName={NODE}", "State=DRAIN", "Reason=bad fan", user="root")
    shown = cluster.cli("hcontrol", "show", "node", NODE).stdout
    assert f"NodeName={NODE} " in shown and "State=DRAIN" in shown and "Reason=bad fan" in shown
    assert [r[0] for r in node_states(cluster, "-N", "-t", "drain")] == [NODE]
    assert node_states(cluster, "-N", "-t", "idle") == []
    j = cluster.submit("-o", "/dev/null", "--wrap", "true")
    wait_for(lambda: cluster.job(j)["reason"] not in ("None", None, ""), 30, what="a pending reason")
    assert cluster.job(j)["state"] == "PENDING"  # nothing starts on a drained node
    res = cluster.cli("hcontrol", "update", f"NodeName={NODE}", "State=RESUME", check=False)
    assert res.returncode != 0 and "Access/permission denied" in res.stderr  # users may not
    cluster.cli("hcontrol", "update", f"NodeName={NODE}", "State=RESUME", user="root")
    cluster.wait_state(j, "COMPLETED")
    assert "State=IDLE" in cluster.cli("hcontrol", "show", "node", NODE).stdout
    cluster.cli("hcontrol", "update", f"NodeName={NODE}", "State=DOWN", "Reason=replacing", user="root")
    assert [r[0] for r in node_states(cluster, "-N", "-t", "down")] == [NODE]
    cluster.cli("hcontrol", "update", f"NodeName={NODE}", "State=RESUME", user="root")
    assert [r[0] for r in node_states(cluster, "-N", "-t", "idle")] == [NODE]
    res = cluster.cli("hcontrol", "update", "NodeName=nosuch", "State=DRAIN", "Reason=x", user="root", check=False)
    assert res.returncode != 0 and "nosuch" in res.stderr
