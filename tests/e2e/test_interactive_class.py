"""The interactive class on one node: jobs of salloc and srun start ahead of the batch jobs of
their level, and the [interactive] limits refuse a session at once, with the limit's name."""
from __future__ import annotations

import pwd
import subprocess
import time

import pytest

from .harness import BIN, TEST_USER, start_local_cluster, user_dir, wait_for

LIMITS = '\n[interactive]\nmax_jobs_per_user = 1\nmax_gpus_per_user = 1\nmax_time = "10:00"\n'


@pytest.fixture(scope="module")
def cluster():
    c = start_local_cluster(gpus=2, controller_toml=LIMITS)
    yield c
    c.close()


@pytest.fixture(autouse=True)
def nothing_left(cluster):
    yield
    cluster.cancel_left()


def test_interactive_limits_refuse_a_session_at_once_and_say_which(cluster):
    proc = cluster.cli("salloc", "--no-shell", "--gpus-per-node=1", "-J", "first", check=False)
    assert proc.returncode == 0, proc.stderr
    first = int(proc.stderr.split()[-1])
    job = cluster.job(first)
    assert job["time_limit"] == 600 and job["interactive"]  # [interactive] max_time is the default limit too
    proc = cluster.cli("srun", "true", check=False)
    assert proc.returncode == 1
    assert proc.stderr == (f"srun: error: Job submit/allocate failed: interactive job limit: user {TEST_USER} would "
                           f"hold 2 interactive jobs (at most 1, [interactive] max_jobs_per_user; 1 held now: end one, "
                           f"e.g. exit its salloc)\n")
    cluster.cli("scancel", str(first))
    cluster.wait_state(first, "CANCELLED")
    proc = cluster.cli("salloc", "--gpus-per-node=2", "true", check=False)
    assert proc.returncode == 1 and "would hold 2 GPUs in interactive jobs (at most 1, [interactive] " \
                                    "max_gpus_per_user" in proc.stderr, proc.stderr
    proc = cluster.cli("salloc", "-t", "20:00", "true", check=False)
    assert proc.returncode == 1 and proc.stderr.startswith(
        "salloc: error: Job submit/allocate failed: Requested time limit is invalid (missing or exceeds some limit): "
        "-t 20:00 is longer than interactive jobs may run (10:00, [interactive] max_time)"), proc.stderr
    # batch jobs are not counted: they have their own limits
    batch = cluster.submit("--gpus-per-node=2", "--wrap", "sleep 1")
    assert cluster.cli("srun", "-t", "1:00", "true", check=False).returncode == 0
    cluster.wait_state(batch, "COMPLETED")


def test_a_session_starts_ahead_of_a_batch_job_of_its_level_that_came_first(cluster):
    d = user_dir(cluster.workdir, TEST_USER)
    go = d / "holder-go"
    go.unlink(missing_ok=True)
    holder = cluster.submit("--gpus-per-node=2", "--wrap", f"while [ ! -e {go} ]; do sleep 0.1; done")
    cluster.wait_state(holder, "RUNNING")
    batch = cluster.submit("--gpus-per-node=2", "--wrap", "true")  # first in line by its submit time
    pw = pwd.getpwnam(TEST_USER)
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "HOME": pw.pw_dir, "USER": TEST_USER, "HAI_CONTROLLER": cluster.socket}
    session = subprocess.Popen([str(BIN / "srun"), "--gpus-per-node=1", "bash", "-c", "echo $CUDA_VISIBLE_DEVICES; sleep 2"],
                               user=pw.pw_uid, group=pw.pw_gid, extra_groups=[], env=env, cwd=str(d),
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        waiting = wait_for(lambda: [j for j in cluster.call("jobs", {})["jobs"]
                                    if j["interactive"] and j["reason"] != "None"], 30,
                           what="the session's job, waiting")[0]["id"]
        queue = [line.split() for line in cluster.cli("hqueue", "-h", "-o", "%i %k %T").stdout.splitlines()]
        assert [str(waiting), "interactive", "PENDING"] in queue and [str(batch), "batch", "PENDING"] in queue
        go.touch()
        out, err = session.communicate(timeout=60)
    finally:
        if session.poll() is None:
            session.kill()
    assert session.returncode == 0 and out.strip() in ("0", "1"), err
    assert set(err.splitlines()) <= {f"srun: job {waiting} queued and waiting for resources",
                                      f"srun: job {waiting} has been allocated resources"}, err
    started = {j: cluster.job(j)["start_time"] for j in (waiting, batch)}
    assert started[batch] is None or started[waiting] < started[batch]
    cluster.wait_state(batch, "COMPLETED")


def test_an_allocation_nobody_holds_is_ended_and_a_no_shell_one_is_not():
    """A lost submit reply (or a client that died while the controller was down) leaves an
    allocation that no salloc or srun holds: after [interactive] abandoned_after it is ended, so
    it cannot keep its GPUs, never time-sliced, until its limit. salloc --no-shell's is held by
    nobody on purpose and stays."""
    import os
    from hai_cluster.cli.allocation import ALLOCATION_SCRIPT
    from hai_cluster.cli.client import ControllerClient
    c = start_local_cluster(gpus=2, controller_toml="\n[interactive]\nabandoned_after = 10.0\n")
    try:
        pw = pwd.getpwnam(TEST_USER)
        body = {"script": ALLOCATION_SCRIPT, "option_args": ["--gpus-per-node=1"], "script_args": [],
                "cwd": "/tmp", "env": {"PATH": "/usr/bin:/bin"}, "script_name": "interactive", "interactive": True}

        def submit(**more) -> int:  # as salloc submits, under the test user's uid, and never holds it
            client = ControllerClient(c.socket)
            try:
                return client.call("submit", {**body, **more})["job_id"]
            finally:
                client.close()
        child = os.fork()
        if child == 0:  # the submissions' uid must be the user's (SO_PEERCRED): a child that becomes it
            try:
                os.setgid(pw.pw_gid)
                os.setuid(pw.pw_uid)
                ids = [submit()]
                with open(f"/tmp/hai-abandoned-{os.getppid()}", "w") as f:
                    f.write(" ".join(map(str, ids)))
                os._exit(0)
            except BaseException:
                os._exit(1)
        assert os.waitpid(child, 0)[1] == 0
        path = f"/tmp/hai-abandoned-{os.getpid()}"
        with open(path) as f:
            abandoned = int(f.read())
        os.unlink(path)
        proc = c.cli("salloc", "--no-shell", "--gpus-per-node=1", check=False)
        assert proc.returncode == 0, proc.stderr
        detached = int(proc.stderr.split()[-1])
        c.wait_state(abandoned, "CANCELLED", timeout=60)
        assert "held this allocation for 10 s; ending it" in (c.workdir / "ctl.log").read_text()
        time.sleep(12)  # past abandoned_after for the --no-shell one too
        assert c.job(detached)["state"] == "RUNNING"  # nobody holds it, on purpose
    finally:
        c.close()
