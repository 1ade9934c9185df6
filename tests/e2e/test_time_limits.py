"""Time limits through the CLI on a real (local) cluster: a run past its limit is signalled, then
killed after the kill wait, and ends as TIMEOUT; --signal=[B:]SIG@SECS arrives that long before."""
from __future__ import annotations

from pathlib import Path

import pytest

from .harness import TEST_USER, start_local_cluster, user_dir, wait_for


@pytest.fixture(scope="module")
def cluster():
    c = start_local_cluster()
    yield c
    c.close()


def trapping_script(cluster, name: str, signals: tuple[str, ...]) -> tuple[str, Path]:
    """A job script that records each signal it gets (name and time) and keeps running."""
    d = user_dir(cluster.workdir, TEST_USER)
    log, script = d / f"{name}.log", d / f"{name}.sh"
    traps = "".join(f"trap 'echo {s} $(date +%s.%N) >> {log}' {s}\n" for s in signals)
    script.write_text(f"#!/bin/bash\n{traps}echo start $(date +%s.%N) >> {log}\nwhile :; do sleep 0.1; done\n")
    return str(script), log


def records(log: Path) -> dict[str, float]:
    return {line.split()[0]: float(line.split()[1]) for line in log.read_text().splitlines()}


def test_run_past_its_limit_is_signalled_then_killed_and_ends_as_timeout(cluster):
    body, log = trapping_script(cluster, "limit", ("TERM",))
    j = cluster.submit("-t", "0:03", "--grace=3", "-o", "/dev/null", body)
    job = cluster.wait_state(j, "TIMEOUT", "COMPLETED", "FAILED", "CANCELLED", timeout=60)
    assert job["state"] == "TIMEOUT", job
    run = job["runs"][0]
    assert (run["state"], run["exit_signal"]) == ("TIMEOUT", 9)  # it ignored SIGTERM: SIGKILL ended it
    got = records(log)
    assert got["TERM"] - got["start"] >= 3 - 0.5  # not before its limit
    assert run["end_time"] - got["TERM"] >= 3 - 0.5  # SIGKILL only after the kill wait
    rows = cluster.cli("hacct", "-X", "-j", str(j), "-P", "-n", "-o", "JobID,State,ExitCode").stdout.split()
    assert rows == [f"{j}|TIMEOUT|0:9"]
    assert cluster.cli("hqueue", "-h", "-t", "TO", "-o", "%i %t", "-j", str(j)).stdout.split() == [str(j), "TO"]


def test_job_that_ends_on_the_limit_signal_is_timeout_too(cluster):
    j = cluster.submit("-t", "0:02", "-o", "/dev/null", "--wrap", "sleep 1000")
    job = cluster.wait_state(j, "TIMEOUT", "COMPLETED", "FAILED", "CANCELLED", timeout=60)
    assert (job["state"], job["runs"][0]["exit_signal"]) == ("TIMEOUT", 15)


def steps_script(cluster, name: str) -> tuple[str, Path]:
    """A batch script and one srun step in it, each recording the signals it gets (batch-USR1,
    step-USR1, ...: the first time of each) and running on."""
    d = user_dir(cluster.workdir, TEST_USER)
    log, trap, script = d / f"{name}.log", d / f"{name}-trap.sh", d / f"{name}.sh"
    trap.write_text("".join(f"trap 'echo $1-{s} $(date +%s.%N) >> {log}' {s}\n" for s in ("USR1", "TERM"))
                    + "while :; do sleep 0.1; done\n")
    script.write_text(f"#!/bin/bash\necho start $(date +%s.%N) >> {log}\nsrun bash {trap} step &\n"
                      f"exec bash {trap} batch\n")
    return str(script), log


def first_records(log: Path) -> dict[str, float]:
    got: dict[str, float] = {}
    for line in log.read_text().splitlines():
        got.setdefault(line.split()[0], float(line.split()[1]))
    return got


@pytest.mark.parametrize("spec, gets, spared", [
    ("USR1@8", "step", "batch"), ("SIGUSR1@8", "step", "batch"), ("10@8", "step", "batch"),
    ("B:USR1@8", "batch", "step")])
def test_signal_arrives_that_long_before_the_limit_where_slurm_sends_it(cluster, spec, gets, spared):
    """USR1 8 s before a 12 s limit: about 4 s after the start, well before the limit's SIGTERM;
    as Slurm 22.05 does (checked on the peer): to the steps' tasks, or with B: to the batch shell."""
    name = "sig-" + spec.replace(":", "").replace("@", "-")
    body, log = steps_script(cluster, name)
    j = cluster.submit("-t", "0:12", f"--signal={spec}", "--grace=1", "-o", "/dev/null", body)
    wait_for(lambda: log.exists() and f"{gets}-USR1" in log.read_text(), 60, what="the warning signal")
    assert cluster.job(j)["state"] == "RUNNING"  # a warning, not an end
    job = cluster.wait_state(j, "TIMEOUT", "COMPLETED", "FAILED", "CANCELLED", timeout=60)
    assert job["state"] == "TIMEOUT"
    got = first_records(log)
    assert got[f"{gets}-USR1"] - got["start"] >= 4 - 0.5  # not earlier than asked
    assert got[f"{gets}-TERM"] - got[f"{gets}-USR1"] >= 4  # sent before the limit (8 s ahead)
    assert f"{spared}-USR1" not in got and f"{spared}-TERM" in got, got  # the limit reaches both


def test_bad_time_and_signal_values_are_refused(cluster):
    before = cluster.job_ids()
    for argv, message in [(["--time=abc"], "--time=abc"), (["--signal=USR1@abc"], "--signal=USR1@abc"),
                          (["--signal=NOSUCH"], "--signal=NOSUCH")]:
        res = cluster.cli("hsubmit", *argv, "--wrap", "true", check=False)
        assert res.returncode != 0 and message in res.stderr, (argv, res.stderr)
    assert cluster.job_ids() == before
