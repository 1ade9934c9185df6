"""A job that cannot write its output fails with a clear reason and the daemons carry on: its
output's file system fills up while it runs (a tiny tmpfs), or its output is in a directory the
user cannot write."""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

import pytest

from tests.e2e.harness import TEST_USER, ensure_user, start_local_cluster

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def tiny_fs():
    path = tempfile.mkdtemp(prefix="hai-tinyfs-", dir="/tmp")
    os.chmod(path, 0o755)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k,mode=0777", "tmpfs", path],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.fail(f"cannot mount a tmpfs (the test needs root): {mounted.stderr}", pytrace=False)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", path], check=False)
        os.rmdir(path)


@pytest.fixture
def cluster():
    c = start_local_cluster(gpus=2)
    yield c
    c.close()


def test_full_file_system_and_unwritable_directory_fail_the_job_clearly(cluster, tiny_fs):
    ensure_user(TEST_USER)
    # The job ignores its write errors and exits 0: only the full file system tells.
    full = cluster.submit("-o", f"{tiny_fs}/out.txt", "--wrap", "head -c 1000000 /dev/zero; exit 0")
    job = cluster.wait_state(full, "COMPLETED", "FAILED")
    assert job["state"] == "FAILED", job
    assert job["reason"] == f"writing job output {tiny_fs}/out.txt failed: No space left on device " \
                            f"(its file system is full)", job
    acct = cluster.cli("hacct", "-j", str(full), "-o", "JobID,State,Reason%120", "-n").stdout
    assert "FAILED" in acct and "No space left on device" in acct, acct

    private = os.path.join(cluster.workdir, "private")
    os.mkdir(private, 0o700)  # root's: the user cannot create files there, and hsubmit says so
    refused = cluster.cli("hsubmit", "-o", f"{private}/out.txt", "--wrap", "true", check=False)
    assert refused.returncode != 0 and f"cannot write in {private}: Permission denied" in refused.stderr
    shutil.chown(private, TEST_USER)  # the user's when submitted, root's again when it runs
    denied = cluster.submit("--hold", "-o", f"{private}/out.txt", "--wrap", "true")
    shutil.chown(private, "root")
    cluster.cli("hcontrol", "release", str(denied))
    job = cluster.wait_state(denied, "COMPLETED", "FAILED")
    assert job["state"] == "FAILED" and job["reason"] == f"opening stdout {private}/out.txt failed: " \
                                                         f"Permission denied", job

    # Both daemons are still there and a job that can write runs as before.
    assert cluster.controller.proc.poll() is None
    assert all(a.proc.poll() is None for a in cluster.agents.values())
    ok = cluster.submit("-o", "/dev/null", "--wrap", "echo fine")
    assert cluster.wait_state(ok, "COMPLETED", "FAILED")["state"] == "COMPLETED"


def test_full_file_system_fails_a_running_job(cluster, tiny_fs):
    """A job that fills its output's file system and runs on (ignoring its write errors) is failed
    while it runs, through the usual terminate: it does not train on for hours without its log."""
    ensure_user(TEST_USER)
    job_id = cluster.submit("-o", f"{tiny_fs}/out.txt", "--wrap", "head -c 1000000 /dev/zero; exec sleep 600")
    job = cluster.wait_state(job_id, "FAILED", "COMPLETED", timeout=120)
    assert job["state"] == "FAILED", job
    assert job["reason"] == f"writing job output {tiny_fs}/out.txt failed: No space left on device " \
                            f"(its file system is full)", job
    assert all(a.proc.poll() is None for a in cluster.agents.values())
