"""Multi-tenancy end to end, as real unprivileged users: nobody acts on or reads another user's
jobs, operators and admins may do what their role allows, refusals are clear and logged, and a
submitter's environment never reaches root-owned helpers nor carries the daemons' secrets."""
from __future__ import annotations

import os
import pwd
import shutil
from pathlib import Path

import pytest

from ..infra import users
from .harness import OTHER_USER, TEST_USER, Cluster, start_local_cluster, user_dir, wait_for

OPERATOR = "haioper"
OPS_GROUP = "haiops"
DENIED = "Access/permission denied"


def ensure_operator() -> None:
    users.ensure_group_member(OPERATOR, OPS_GROUP)


@pytest.fixture(scope="module")
def cluster():
    ensure_operator()
    # Secrets in the daemons' own environment must never show up in a job's.
    saved = dict(os.environ)
    os.environ.update({"HAI_DAEMON_SECRET": "s3cret-daemon", "PGPASSWORD": "s3cret-db"})
    try:
        c = start_local_cluster(gpus=2, controller_toml=f'[access]\noperators = ["@{OPS_GROUP}"]\n')
    finally:
        os.environ.clear()
        os.environ.update(saved)
    yield c
    c.close()


def sleeper(cluster: Cluster, user: str = TEST_USER, *extra: str) -> int:
    marker = user_dir(cluster.workdir, user) / "usr1"
    return cluster.submit(*extra, "--wrap", f"trap 'echo got-usr1 >> {marker}' USR1; "
                          "while true; do sleep 0.1; done", user=user)


def refused(cluster: Cluster, *argv: str, user: str) -> str:
    proc = cluster.cli(*argv, user=user, check=False)
    assert proc.returncode != 0, f"{' '.join(argv)} as {user} was not refused: {proc.stdout}"
    assert DENIED in proc.stderr, proc.stderr
    return proc.stderr


def test_users_cannot_touch_each_others_jobs(cluster):
    running = sleeper(cluster)
    cluster.wait_state(running, "RUNNING")
    held = cluster.submit("--hold", "--wrap", "true")
    other_uid = pwd.getpwnam(OTHER_USER).pw_uid
    for argv in (("hcancel", str(running)), ("hcancel", str(held)), ("hcancel", "-s", "USR1", str(running)),
                 ("hcontrol", "release", str(held)), ("hcontrol", "hold", str(held)),
                 ("hcontrol", "requeue", str(running)), ("hcontrol", "preempt", str(running)),
                 ("hcontrol", "update", "NodeName=local1", "State=DRAIN", "Reason=x")):
        err = refused(cluster, *argv, user=OTHER_USER)
        assert "owned by haitest" in err or "only operators" in err, err
    # hcancel -u haitest as haiother: refused as a whole (one line, one log record, not one per
    # job: a filter over another user's jobs cost a lookup and a log line per job), nothing cancelled
    err = refused(cluster, "hcancel", "-u", TEST_USER, user=OTHER_USER)
    assert f"Access/permission denied: jobs of user(s) {TEST_USER}" in err and str(running) not in err
    err = refused(cluster, "hcancel", "-u", f"{TEST_USER},{OTHER_USER}", "-t", "PENDING", user=OTHER_USER)
    assert err.count(DENIED) == 1
    assert "Invalid job state specified: COMPLETED" in cluster.cli(
        "hcancel", "-t", "CD", user=OTHER_USER, check=False).stderr
    assert cluster.job(running)["state"] == "RUNNING"
    assert cluster.job(held)["state"] == "PENDING" and cluster.job(held)["reason"] == "JobHeldUser"
    assert not (user_dir(cluster.workdir, TEST_USER) / "usr1").exists()
    log = (cluster.workdir / "ctl.log").read_text()
    assert f"denied uid={other_uid} ({OTHER_USER}, user)" in log
    assert log.count(f"cancel of the jobs of {TEST_USER}") == 2  # once per refused request
    # ... and the owner may do all of it.
    cluster.cli("hcancel", "-s", "USR1", str(running))
    wait_for(lambda: (user_dir(cluster.workdir, TEST_USER) / "usr1").exists(), 20, what="USR1 in the job")
    cluster.cli("hcontrol", "release", str(held))
    cluster.wait_state(held, "COMPLETED")
    cluster.cli("hcontrol", "requeue", str(running))
    cluster.wait_state(running, "PENDING", "RUNNING")
    wait_for(lambda: cluster.job(running)["restart_count"] == 1, 30, what="the requeue")
    cluster.cli("hcancel", str(running))
    assert cluster.wait_state(running, "CANCELLED")["state"] == "CANCELLED"


def test_operator_may_hold_requeue_preempt_and_drain_but_not_cancel(cluster):
    assert cluster.cli("python", "-c", "from hai_cluster.cli.client import ControllerClient as C; "
                       "print(C().call('ping', {})['role'])", user=OPERATOR).stdout.strip() == "operator"
    job = sleeper(cluster, OTHER_USER)
    cluster.wait_state(job, "RUNNING")
    pending = cluster.submit("--begin", "now+1hour", "--wrap", "true", user=OTHER_USER)
    cluster.cli("hcontrol", "hold", str(pending), user=OPERATOR)
    assert cluster.job(pending)["reason"] == "JobHeldAdmin"
    refused(cluster, "hcontrol", "release", str(pending), user=OTHER_USER)  # held by an operator
    cluster.cli("hcontrol", "release", str(pending), user=OPERATOR)
    cluster.cli("hcontrol", "preempt", str(job), user=OPERATOR)
    wait_for(lambda: cluster.job(job)["restart_count"] == 1, 30, what="the preemption")
    refused(cluster, "hcancel", str(job), user=OPERATOR)
    refused(cluster, "hcontrol", "update", "NodeName=local1", "State=DOWN", "Reason=x", user=OPERATOR)
    cluster.cli("hcontrol", "update", "NodeName=local1", "State=DRAIN", "Reason=maintenance", user=OPERATOR)
    assert cluster.call("nodes", {})["nodes"][0]["state"] == "drain"
    cluster.cli("hcontrol", "update", "NodeName=local1", "State=RESUME", user=OPERATOR)
    # root is an admin: it cancels anyone's jobs
    cluster.cli("hcancel", str(job), str(pending), user="root")
    assert cluster.wait_state(job, "CANCELLED")["state"] == "CANCELLED"
    assert cluster.job(pending)["state"] == "CANCELLED"


def test_output_is_created_as_the_user_with_its_umask(cluster):
    d = user_dir(cluster.workdir, TEST_USER)
    private = cluster.cli("/bin/bash", "-c", "umask 077; hsubmit --parsable -o private.out --wrap 'echo secret-output'")
    job = int(private.stdout.strip())
    assert cluster.wait_state(job, "COMPLETED", "FAILED")["state"] == "COMPLETED"
    st = (d / "private.out").stat()
    assert (st.st_uid, st.st_mode & 0o777) == (pwd.getpwnam(TEST_USER).pw_uid, 0o600)
    assert cluster.cli("/bin/cat", str(d / "private.out")).stdout == "secret-output\n"
    other = cluster.cli("/bin/cat", str(d / "private.out"), user=OTHER_USER, check=False)
    assert other.returncode != 0 and "Permission denied" in other.stderr
    # an output path the user cannot write is refused at submission; nothing is created
    os.chmod(d, 0o755)
    theirs = user_dir(cluster.workdir, OTHER_USER)
    os.chmod(theirs, 0o755)
    res = cluster.cli("hsubmit", "-o", str(theirs / "planted.out"), "--wrap", "echo hi", check=False)
    assert res.returncode != 0 and f"cannot write in {theirs}: Permission denied" in res.stderr
    # one that becomes unwritable after submission: the run fails, saying why
    later = d / "later"
    later.mkdir()
    shutil.chown(later, TEST_USER, TEST_USER)
    job = cluster.submit("--hold", "-o", str(later / "x-%j.out"), "--wrap", "echo hi")
    shutil.chown(later, OTHER_USER, OTHER_USER)
    cluster.cli("hcontrol", "release", str(job))
    done = cluster.wait_state(job, "COMPLETED", "FAILED")
    assert done["state"] == "FAILED"
    assert f"opening stdout {later}/x-{job}.out failed: Permission denied" in done["runs"][0]["reason"]
    assert not (theirs / "planted.out").exists() and list(later.iterdir()) == []


def test_environment_is_filtered(cluster):
    d = user_dir(cluster.workdir, TEST_USER)
    script = d / "env.sh"
    flag = d / "env-go"
    script.write_text(f"#!/bin/bash\nenv > env-$HAI_JOB_ID.txt\necho $PPID > parent-$HAI_JOB_ID.txt\n"
                      f"while [ ! -e {flag} ]; do sleep 0.1; done\n")
    user_env = {"LD_LIBRARY_PATH": "/opt/mine/lib", "PYTHONPATH": "/opt/mine/py", "MY_SETTING": "42",
                "NOTIFY_SOCKET": "/run/systemd/notify", "HAI_REPORT_FD": "7"}
    job = cluster.submit(str(script), env=user_env)
    ppid = int(wait_for(lambda: (d / f"parent-{job}.txt").exists() and (d / f"parent-{job}.txt").read_text().strip(),
                        30, what="the job to start"))
    # The job's parent is its shepherd, a root process: none of the user's hooks there.
    parent = Path(f"/proc/{ppid}/environ").read_bytes().decode().split("\0")
    assert os.stat(f"/proc/{ppid}").st_uid == 0
    assert parent and not [v for v in parent if v.startswith(("LD_LIBRARY_PATH=", "PYTHONPATH=", "MY_SETTING="))]
    flag.touch()
    assert cluster.wait_state(job, "COMPLETED", "FAILED")["state"] == "COMPLETED"
    env = dict(line.split("=", 1) for line in (d / f"env-{job}.txt").read_text().splitlines() if "=" in line)
    assert (env["LD_LIBRARY_PATH"], env["PYTHONPATH"], env["MY_SETTING"]) == ("/opt/mine/lib", "/opt/mine/py", "42")
    for name in ("NOTIFY_SOCKET", "HAI_REPORT_FD", "HAI_DAEMON_SECRET", "PGPASSWORD"):
        assert name not in env, name
    # --export=NONE: the job gets none of it (Slurm's meaning)
    job = cluster.submit("--export=NONE", str(script), env=user_env)
    assert cluster.wait_state(job, "COMPLETED", "FAILED")["state"] == "COMPLETED"
    text = (d / f"env-{job}.txt").read_text()
    assert "LD_LIBRARY_PATH" not in text and "MY_SETTING" not in text and "HAI_JOB_ID" in text

