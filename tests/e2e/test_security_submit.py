"""Submissions against a hostile user, end to end as real users (issue 18, findings 3 and 8): what
one submission may cost the store, strings that other users see, and what of a job others see."""
from __future__ import annotations

import json
import os
import subprocess
import threading
import time

import pytest

from .harness import OTHER_USER, TEST_USER, start_local_cluster, user_dir
from .test_security import OPERATOR, OPS_GROUP, ensure_operator

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def cluster():
    ensure_operator()
    c = start_local_cluster(gpus=1, controller_toml=f'[access]\noperators = ["@{OPS_GROUP}"]\n'
                                                     "[limits]\nmax_pending_bytes = 3000000\n")
    yield c
    c.close()


def store_bytes(cluster) -> int:
    return sum(f.stat().st_size for f in cluster.workdir.glob("hai.db*"))


def raw_call(cluster, user: str, method: str, body: dict) -> subprocess.CompletedProcess:
    """A request as `user` from a client of their own (not hsubmit), its reply or error printed."""
    code = ("import json, sys; from hai_cluster.cli.client import ClientError, ControllerClient as C\n"
            f"try: print(json.dumps(C().call({method!r}, json.load(sys.stdin))))\n"
            "except ClientError as e: print('ERROR', e)")
    return cluster.cli("python", "-c", code, input=json.dumps(body), user=user)


def test_an_array_stores_its_script_once(cluster):
    """A 256 KiB script with --array=0-1000 grew hai.db by 252 MB (plus a 255 MB WAL) in 2 s."""
    d = user_dir(cluster.workdir, TEST_USER)
    script = d / "big.sh"
    script.write_text("#!/bin/sh\n" + "# padding padding padding padding\n" * 7700 + "true\n")  # ~256 KiB
    before = store_bytes(cluster)
    job = cluster.submit("--hold", "--array=0-1000", str(script))
    assert len(cluster.call("jobs", {"ids": [job]})["jobs"]) == 1001
    assert store_bytes(cluster) - before < 20 * 2**20  # the rows, one copy of the script and the WAL
    cluster.cli("hcancel", str(job))


def test_submission_sizes_are_bounded(cluster):
    d = user_dir(cluster.workdir, TEST_USER)
    script = d / "huge.sh"
    script.write_text("#!/bin/sh\n" + "#" * (4 * 2**20) + "\ntrue\n")
    res = cluster.cli("hsubmit", str(script), check=False)
    assert res.returncode != 0 and "the batch script and its arguments are too large" in res.stderr, res.stderr
    res = cluster.cli("hsubmit", "--wrap", "true", env={f"BIG{i}": "x" * 100_000 for i in range(11)}, check=False)
    assert res.returncode != 0 and "the job's environment is too large" in res.stderr, res.stderr
    # the pending jobs of one user hold at most max_pending_bytes (3 MB here) of scripts
    mid = d / "mid.sh"
    mid.write_text("#!/bin/sh\n" + "#" * (2**20) + "\ntrue\n")
    held = [cluster.submit("--hold", str(mid)) for _ in range(2)]
    res = cluster.cli("hsubmit", "--hold", str(mid), check=False)
    assert res.returncode != 0 and "bytes of pending job scripts and environments" in res.stderr, res.stderr
    assert cluster.submit("--hold", "--wrap", "true", user=OTHER_USER)  # another user is not affected
    cluster.cli("hcancel", *map(str, held))
    assert cluster.submit("--hold", str(mid))  # room again once they ended
    cluster.cli("hcancel", "-u", TEST_USER)
    cluster.cli("hcancel", "-u", OTHER_USER, user=OTHER_USER)
    # a grace above max_grace (600 s) would let the job outlive a cancel or preemption that long
    res = cluster.cli("hsubmit", "--grace=601", "--wrap", "true", check=False)
    assert res.returncode != 0 and "--grace=601 is above this cluster's max_grace (600 s)" in res.stderr, res.stderr
    assert cluster.submit("--hold", "--grace=600", "--wrap", "true")
    cluster.cli("hcancel", "-u", TEST_USER)


def test_names_others_see_are_one_line_of_printable_text(cluster):
    """A script named with a newline and a forged row, or with terminal escapes, became the job's
    name, printed raw in every user's hqueue."""
    d = user_dir(cluster.workdir, TEST_USER)
    for name in ("x\n999 gpu FAKE root R 0:00 1 local1", "\x1b[2J\x1b[Hclean"):
        script = d / name
        script.write_text("#!/bin/sh\ntrue\n")
        res = cluster.cli("hsubmit", "--hold", str(script), check=False)
        assert res.returncode != 0 and "the script's file name" in res.stderr and "control characters" in res.stderr
        assert "give the job a name with -J" in res.stderr
        job = cluster.submit("--hold", "-J", "named", str(script))  # the same script, named: fine
        cluster.cli("hcancel", str(job))
    res = cluster.cli("hsubmit", "--hold", "-J", "a\x1b[31mred", "--wrap", "true", check=False)
    assert res.returncode != 0 and "control characters" in res.stderr
    assert "FAKE" not in cluster.cli("hqueue", user=OTHER_USER).stdout
    res = cluster.cli("hcontrol", "update", "NodeName=local1", "State=DRAIN", "Reason=x\x1b[2J", user=OPERATOR,
                      check=False)  # a node's reason is shown to everyone too
    assert res.returncode != 0 and "the reason contains control characters" in res.stderr, res.stderr
    assert cluster.call("nodes", {})["nodes"][0]["state"] == "up"


def test_nul_bytes_are_refused_clearly(cluster):
    """A NUL in cwd gave "internal error in submit" and a traceback in the controller's log."""
    for body, text in (({"cwd": "/tmp\0/x", "option_args": ["--wrap", "true"]}, "the submit directory contains a NUL"),
                       ({"cwd": "/tmp", "option_args": ["--wrap", "true"], "env": {"A": "x\0y"}},
                        "environment variable A contains a NUL"),
                       ({"cwd": "/tmp", "script": "#!/bin/sh\ntrue\n", "script_args": ["a\0b"]},
                        "script argument 1 contains a NUL")):
        out = raw_call(cluster, TEST_USER, "submit", body).stdout
        assert out.startswith("ERROR") and text in out, out
    log = (cluster.workdir / "ctl.log").read_text()
    assert "internal error" not in log
    # (once in CI, 2026-12-02, a traceback of some request of this module's cluster was here; not
    # seen again in 7 runs, under load too: the message now shows which handler and why)
    assert "Traceback" not in log, log[max(0, log.index("Traceback") - 400):][:6000]


def test_a_jobs_arguments_are_its_owners_and_admins_only(cluster):
    d = user_dir(cluster.workdir, TEST_USER)
    script = d / "train.sh"
    script.write_text("#!/bin/sh\ntrue\n")
    job = cluster.submit("--hold", str(script), "--api-key=s3cret")
    mine = json.loads(raw_call(cluster, TEST_USER, "show_job", {"job_id": job}).stdout)
    assert mine["job"]["spec"]["script_args"] == ["--api-key=s3cret"]
    for user in (OTHER_USER, OPERATOR):
        out = raw_call(cluster, user, "show_job", {"job_id": job}).stdout
        assert "s3cret" not in out and '"script_args"' not in out and f'"id": {job}' in out, out
    assert "s3cret" in raw_call(cluster, "root", "show_job", {"job_id": job}).stdout  # an admin
    cluster.cli("hcancel", str(job))


def test_only_the_owner_and_admins_update_a_job(cluster):
    """update_job's docstring said owner or admin; operators could update others' jobs."""
    job = cluster.submit("--hold", "-t", "10", "--wrap", "true")
    res = cluster.cli("hcontrol", "update", f"JobId={job}", "TimeLimit=5", user=OPERATOR, check=False)
    assert res.returncode != 0 and "Access/permission denied" in res.stderr, res.stderr
    assert cluster.job(job)["time_limit"] == 600
    cluster.cli("hcontrol", "update", f"JobId={job}", "TimeLimit=5")
    assert cluster.job(job)["time_limit"] == 300
    cluster.cli("hcancel", str(job))


def test_one_cancel_of_thousands_of_unknown_ids_is_one_lookup(cluster):
    """cancel looked up each unknown id with a query of its own (4,000 ids held the store 3 s);
    one request names at most 10,000."""
    out = raw_call(cluster, TEST_USER, "cancel", {"ids": list(range(100_000, 104_000))}).stdout
    reply = json.loads(out)
    assert reply["done"] == [] and len(reply["errors"]) == 4000
    assert reply["errors"][0] == "Invalid job id specified: 100000"
    out = raw_call(cluster, TEST_USER, "cancel", {"ids": list(range(20_000))}).stdout
    assert out.startswith("ERROR") and "at most 10000 per request" in out, out
    out = raw_call(cluster, TEST_USER, "jobs", {"tasks": [[1, t] for t in range(5000)]}).stdout
    assert json.loads(out)["jobs"] == []  # 5,000 tasks: one row-value IN, not an expression too deep


def test_files_the_controller_creates_are_private(cluster):
    """The SQLite store holds every job's script and environment (--export secrets)."""
    for f in cluster.workdir.glob("hai.db*"):
        assert f.stat().st_mode & 0o077 == 0, f"{f} is {oct(f.stat().st_mode)}"
    res = subprocess.run(["cat", str(cluster.workdir / "hai.db")], user=OTHER_USER, capture_output=True)
    assert res.returncode != 0
    assert os.stat(cluster.workdir / "hai.db").st_uid == 0


def test_one_submission_cannot_stall_the_controller(cluster):
    """A 1.5 MB #SBATCH line kept the controller's event loop in shlex for 20 s (4 MiB: minutes,
    past the unit's watchdog); an 8 MiB dependency in an update took 6 s to parse."""
    d = user_dir(cluster.workdir, TEST_USER)
    (d / "long.sh").write_text("#!/bin/sh\n#SBATCH -J " + "a" * 1_500_000 + "\ntrue\n")
    result = {}

    def attack():
        result["res"] = cluster.cli("hsubmit", str(d / "long.sh"), check=False)
    worker = threading.Thread(target=attack)
    worker.start()
    started = time.monotonic()
    pings = []
    while worker.is_alive() and time.monotonic() - started < 60:
        t = time.monotonic()
        cluster.cli("python", "-c", "from hai_cluster.cli.client import ControllerClient as C; C().call('ping', {})",
                    user=OTHER_USER)
        pings.append(time.monotonic() - t)
    worker.join(60)
    res = result["res"]
    assert res.returncode != 0 and "the directive is 1500011 characters long; at most 4096" in res.stderr, res.stderr
    assert max(pings, default=0) < 5, pings  # the other user was answered while it was refused
    job = cluster.submit("--hold", "--wrap", "true")
    out = raw_call(cluster, TEST_USER, "update_job", {"job_id": job, "fields": {"Dependency": "afterok:" + "1:" * 400_000}}).stdout
    assert out.startswith("ERROR") and "too long (at most 4000 characters)" in out, out[:300]
    cluster.cli("hcancel", str(job))


def test_submit_and_cancel_in_a_loop_does_not_fill_the_store(cluster):
    """The audit's second round: 146 held 4 MiB jobs submitted and cancelled in 15 s grew hai.db to
    589 MB, nothing left pending. A final job's script and environment now leave the store."""
    d = user_dir(cluster.workdir, TEST_USER)
    (d / "fat.sh").write_text("#!/bin/sh\n" + "#" * (2 * 2**20) + "\ntrue\n")
    before = store_bytes(cluster)
    for _ in range(20):
        job = cluster.submit("--hold", str(d / "fat.sh"))
        cluster.cli("hcancel", str(job))
    assert cluster.job(job)["state"] == "CANCELLED"
    grown = store_bytes(cluster) - before
    assert grown < 12 * 2**20, grown  # 20 x 2 MiB kept would be 40 MiB (and as much WAL)


def test_one_user_may_add_jobs_only_so_fast():
    """[access] submit_rate / submit_burst: beyond the burst a submission waits for its tokens, and
    one that would wait too long is refused saying when it could go; others are not held back."""
    c = start_local_cluster(gpus=1, controller_toml="[access]\nsubmit_rate = 0.5\nsubmit_burst = 20\n")
    try:
        for _ in range(20):  # the burst
            c.submit("--hold", "--wrap", "true")
        t = time.monotonic()
        c.submit("--hold", "--wrap", "true")
        assert time.monotonic() - t >= 1.5  # waited for its token (2 s at 0.5 a second)
        res = c.cli("hsubmit", "--hold", "--array=0-99", "--wrap", "true", check=False)  # would wait ~40 s
        assert res.returncode != 0 and "submitting too fast: at most 0.5 jobs a second and 20 at once" in res.stderr
        t = time.monotonic()
        c.submit("--hold", "--wrap", "true", user=OTHER_USER)
        assert time.monotonic() - t < 2  # a bucket of its own
        assert len(c.call("jobs", {})["jobs"]) == 22
    finally:
        c.close()
