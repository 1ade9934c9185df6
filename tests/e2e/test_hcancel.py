"""hcancel through the CLI on a real (local) cluster: its filters, --signal without ending the
job, -Q, the exit status for unknown ids, and the ending order SIGCONT, SIGTERM, SIGKILL."""
from __future__ import annotations

import pwd

import pytest

from .harness import OTHER_USER, TEST_USER, start_local_cluster, user_dir, wait_for


@pytest.fixture(scope="module")
def cluster():
    c = start_local_cluster(controller_toml='partitions = ["gpu", "debug"]')
    yield c
    c.close()


def states(cluster, *ids: int) -> list[str]:
    return [cluster.job(j)["state"] for j in ids]


def running(cluster, name: str, *argv: str, user: str = TEST_USER) -> int:
    mark = user_dir(cluster.workdir, user) / f"{name}.started"
    j = cluster.submit("-J", name, "-o", "/dev/null", *argv, "--wrap", f"touch {mark}; exec sleep 1000", user=user)
    wait_for(mark.exists, 30, what=f"{name} to run")
    return j


def test_hcancel_filters_by_user_state_name_and_partition(cluster):
    alpha = cluster.submit("--hold", "-J", "alpha", "--wrap", "true")
    beta_debug = cluster.submit("--hold", "-J", "beta", "-p", "debug", "--wrap", "true")
    theirs = cluster.submit("--hold", "-J", "alpha", "--wrap", "true", user=OTHER_USER)
    alpha_running = running(cluster, "alpha")
    # -t PENDING -n alpha: the running alpha and the pending beta stay
    cluster.cli("hcancel", "-u", TEST_USER, "-t", "PENDING", "-n", "alpha")
    assert states(cluster, alpha, beta_debug, theirs, alpha_running) == ["CANCELLED", "PENDING", "PENDING", "RUNNING"]
    # -p debug: only the job in that partition
    cluster.cli("hcancel", "--me", "-p", "debug")
    assert states(cluster, beta_debug, theirs, alpha_running) == ["CANCELLED", "PENDING", "RUNNING"]
    # -u: another user's jobs, for an admin
    cluster.cli("hcancel", "-u", OTHER_USER, user="root")
    assert states(cluster, theirs, alpha_running) == ["CANCELLED", "RUNNING"]
    # -n with a state that matches nothing cancels nothing
    cluster.cli("hcancel", "--me", "-n", "alpha", "-t", "PENDING")
    assert states(cluster, alpha_running) == ["RUNNING"]
    cluster.cli("hcancel", "--me", "-n", "alpha", "-t", "RUNNING")
    assert cluster.wait_state(alpha_running, "CANCELLED")["state"] == "CANCELLED"
    res = cluster.cli("hcancel", check=False)
    assert res.returncode != 0 and "No job identification provided" in res.stderr


def test_hcancel_signal_is_delivered_without_ending_the_job(cluster):
    d = user_dir(cluster.workdir, TEST_USER)
    got, mark = d / "usr1.got", d / "usr1.started"
    script = d / "usr1.sh"
    script.write_text(f"#!/bin/bash\ntrap 'echo USR1 >> {got}' USR1\ntouch {mark}\nwhile :; do sleep 0.1; done\n")
    j = cluster.submit("-o", "/dev/null", str(script))
    wait_for(mark.exists, 30, what="the job to run")
    cluster.cli("hcancel", "--signal=USR1", str(j))
    wait_for(lambda: got.exists() and got.read_text() == "USR1\n", 30, what="the job to get SIGUSR1")
    cluster.cli("hcancel", "-s", "USR1", str(j))
    wait_for(lambda: got.read_text() == "USR1\nUSR1\n", 30, what="the second SIGUSR1")
    job = cluster.job(j)
    assert (job["state"], len(job["runs"])) == ("RUNNING", 1)
    res = cluster.cli("hcancel", "--signal=NOPE", str(j), check=False)
    assert res.returncode != 0 and "invalid signal 'NOPE'" in res.stderr
    cluster.cli("hcancel", str(j))
    cluster.wait_state(j, "CANCELLED")


def test_hcancel_quiet_is_silent_for_finished_jobs_and_unknown_ids_exit_non_zero(cluster):
    j = cluster.submit("-o", "/dev/null", "--wrap", "true")
    cluster.wait_state(j, "COMPLETED")
    loud = cluster.cli("hcancel", str(j), check=False)
    assert loud.returncode != 0 and f"{j}" in loud.stderr and "already completing or completed" in loud.stderr
    quiet = cluster.cli("hcancel", "-Q", str(j), check=False)
    assert (quiet.returncode, quiet.stderr, quiet.stdout) == (0, "", "")
    unknown = cluster.cli("hcancel", "-Q", "999999", check=False)
    assert unknown.returncode != 0 and "Invalid job id specified: 999999" in unknown.stderr
    assert cluster.job(j)["state"] == "COMPLETED"


def test_hcancel_ends_a_job_with_sigcont_then_sigterm_then_sigkill_after_the_kill_wait(cluster):
    """The job stops itself: a stopped process runs no handler, so its TERM handler running shows
    that SIGCONT came first; it ignores SIGTERM, so SIGKILL ends it after the kill wait (--grace)."""
    d = user_dir(cluster.workdir, TEST_USER)
    log, pidfile = d / "order.log", d / "order.pid"
    script = d / "order.sh"
    script.write_text(f"#!/bin/bash\ntrap 'echo TERM $(date +%s.%N) >> {log}' TERM\ntrap 'echo CONT >> {log}' CONT\n"
                      f"echo $$ > {pidfile}\nkill -STOP $$\nwhile :; do sleep 0.1; done\n")
    j = cluster.submit("--grace=3", "-o", "/dev/null", str(script))
    pid = int(wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), 30, what="the job to start"))
    wait_for(lambda: open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "T", 30,
             what="the job to stop itself")
    cluster.cli("hcancel", str(j))
    job = cluster.wait_state(j, "CANCELLED", "COMPLETED", "FAILED", timeout=60)
    run = job["runs"][0]
    assert (job["state"], run["exit_signal"]) == ("CANCELLED", 9)
    lines = log.read_text().split("\n")
    assert sorted(line.split()[0] for line in lines if line) == ["CONT", "TERM"]
    term_at = float(next(line for line in lines if line.startswith("TERM")).split()[1])
    assert run["end_time"] - term_at >= 3 - 0.5
    uid = pwd.getpwnam(TEST_USER).pw_uid
    state = cluster.cli("hacct", "-X", "-j", str(j), "-P", "-n", "-o", "State,ExitCode").stdout.split("\n")[0]
    assert state == f"CANCELLED by {uid}|0:9"
