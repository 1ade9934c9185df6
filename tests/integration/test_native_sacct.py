"""The C sacct (hai_cluster/native/sacct.c) against the Python one, its reference: both run as each
of the two test users against a real controller, over the same jobs (ended ones with their steps,
a failed one, held ones, an array, a hostile name, another user's), and must print the same bytes
and exit the same. The forms the C sacct sends to the controller are checked to be rendered there
(a build whose Python fallback cannot run prints them all the same); the forms it leaves to Python
(another time zone, --help, errors, ...) are checked to reach Python (that build fails on them).
Then the caller's uid deciding whose jobs are listed, a running job's Elapsed, refused requests,
no controller, a controller too old for the request, and garbage on the socket."""
from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from hai_cluster.cli.client import ClientError, ControllerClient
from hai_cluster.controller import api_listing_text
from ..e2e.harness import OTHER_USER, TEST_USER, start_local_cluster, wait_for
from .native_clients import NO_PYTHON, front_end_builds
from .test_native_hsubmit import FakeController, build, frame, response
from .test_native_squeue import run, traceback_from_the_package



@pytest.fixture(scope="module")
def clients():
    yield from front_end_builds("sacct")


def same(clients, socket_path: str, *argv: str, user: str = TEST_USER, env: dict | None = None,
         rendered: bool = True) -> subprocess.CompletedProcess:
    """The C and Python sacct print the same and exit the same; `rendered`: the controller made the
    C one's text (the build without Python prints it too), else it went to Python (that build
    cannot run it)."""
    c = run(clients["c"], *argv, socket_path=socket_path, user=user, env=env)
    py = run(clients["py"], *argv, socket_path=socket_path, user=user, env=env)
    c_err, py_err = traceback_from_the_package(c.stderr), traceback_from_the_package(py.stderr)
    assert (c.returncode, c.stdout, c_err) == (py.returncode, py.stdout, py_err), (argv, env, user, c.stderr, py.stderr)
    nopy = run(clients["nopy"], *argv, socket_path=socket_path, user=user, env=env)
    if rendered:
        assert (nopy.returncode, nopy.stdout, nopy.stderr) == (py.returncode, py.stdout, py.stderr), (argv, env, user)
    else:
        assert nopy.returncode == 1 and nopy.stderr.startswith(f"sacct: error: cannot run {NO_PYTHON}".encode()), \
            (argv, env, nopy.stderr)
    return py


@pytest.fixture(scope="module")
def acct():
    """A cluster whose accounting holds, ended: a job with a batch step and an srun step, a failed
    one, a cancelled one, another user's; and held (pending): plain, an array, a name with `%` and
    U+202E, and (written straight into the store) one named with ESC and a newline."""
    c = start_local_cluster()
    try:
        ids = {"done": c.submit("-J", "done", "--wrap", "srun true; true"),
               "failed": c.submit("-J", "failed", "--wrap", "exit 3"),
               "theirs": c.submit("-J", "theirs", "--wrap", "true", user=OTHER_USER),
               "held": c.submit("--hold", "-J", "held", "--wrap", "true"),
               "array": c.submit("--hold", "-J", "arr", "--array=1-3", "--wrap", "true"),
               "odd": c.submit("--hold", "-J", "100%s rtl\u202eevil é名前", "--wrap", "true"),
               "cancelled": c.submit("--hold", "-J", "gone", "--wrap", "true")}
        c.cli("hcancel", str(ids["cancelled"]))
        c.wait_state(ids["done"], "COMPLETED", timeout=120)
        c.wait_state(ids["failed"], "FAILED", timeout=120)
        c.wait_state(ids["theirs"], "COMPLETED", timeout=120)
        c.wait_state(ids["cancelled"], "CANCELLED", timeout=120)
        with sqlite3.connect(c.workdir / "hai.db") as db:
            db.execute("UPDATE jobs SET name = ? WHERE id = ?", ("x\x1b[31mred\n999 FAKE", ids["held"]))
        ids["filler"] = c.submit("--hold", "-J", "filler", "--wrap", "true")  # a write after the one behind its back
        yield c, ids
    finally:
        c.close()


def test_c_sacct_prints_what_the_python_one_prints(clients, acct):
    cluster, ids = acct
    sock = cluster.socket
    every = same(clients, sock, "-a", "-P", "-o", "JobID,JobName,User,State,ExitCode").stdout.decode()
    assert f"{ids['done']}.batch|batch||COMPLETED|0:0\n" in every and f"{ids['done']}.0|true||COMPLETED|0:0\n" in every
    assert f"{ids['failed']}|failed|{TEST_USER}|FAILED|3:0\n" in every
    assert f"{ids['theirs']}|theirs|{OTHER_USER}|COMPLETED|0:0\n" in every
    assert f"{ids['held']}|x\\x1b[31mred\\n999 FAKE|" in every and "\x1b" not in every
    assert f"{ids['odd']}|100%s rtl\\u202eevil é名前|" in every
    jobs = f"{ids['done']},{ids['failed']},{ids['theirs']}"
    for user in (TEST_USER, OTHER_USER):
        for argv in ([], ["-X", "-n", "-P", "-o", "JobID,State,Elapsed"], ["-n"], ["-X"], ["-P"], ["-p"], ["-a"],
                     ["-a", "-X", "-n", "-P", "-o", "JobID,State,Elapsed"], ["-l", "-a"],
                     ["-j", jobs], ["-j", f"{ids['done']}.batch"], ["--jobs", str(ids["array"])],
                     ["-j", f"{ids['array']}_2"], ["-s", "CD"], ["-s", "F,CA", "-a"], ["--state=PD"],
                     ["-S", "now-1hour"], ["-S", "2020-01-01", "-E", "now"], ["--starttime", "midnight"],
                     ["-E", "2020-01-01T00:00:00", "-a"], ["--format", "jobid%20,jobname%30,state"],
                     ["--format=JobID,Submit,Start,End,Elapsed,ElapsedRaw,CPUTime,Timelimit"],
                     ["-o", "JobIDRaw,NNodes,NTasks,AllocTRES,ReqMem,DerivedExitCode,Restarts,Reason,QOS,Partition"],
                     ["-u", OTHER_USER], ["-u", f"{TEST_USER},{OTHER_USER}"], ["--me"], ["--name=done,arr"],
                     ["-r", "nosuchpartition"], ["-D"], ["-X", "-n", "-P", "-o", "JobID,State", "-a", "-s", "R"]):
            same(clients, sock, *argv, user=user)
        for env in ({"SACCT_FORMAT": "jobid,exitcode"}, {"SACCT_FORMAT": ""}, {"SACCT_FORMAT": "JobID%5,State"},
                    {"LANG": "en_US.UTF-8"}, {"LANG": None}, {"LC_ALL": "C.utf8"}, {"PYTHONUTF8": "1"},
                    {"SQUEUE_FORMAT": "%i"}):  # one sacct does not read
            same(clients, sock, env=env, user=user)
            same(clients, sock, "-a", "-n", env=env, user=user)
    # whose jobs: getpass.getuser() (LOGNAME first), else the caller's uid's name
    same(clients, sock, "-X", "-P", "-o", "JobID,User", env={"LOGNAME": OTHER_USER})
    out = same(clients, sock, "-X", "-n", "-P", "-o", "User", user=OTHER_USER, env={"USER": None, "LOGNAME": None})
    assert set(out.stdout.split()) == {OTHER_USER.encode()}


def test_each_user_sees_their_own_jobs_by_default(clients, acct):
    cluster, ids = acct
    argv = ("-X", "-n", "-P", "-o", "JobID,User", "-S", "2020-01-01")
    mine = run(clients["nopy"], *argv, socket_path=cluster.socket, user=TEST_USER).stdout.decode().splitlines()
    theirs = run(clients["nopy"], *argv, socket_path=cluster.socket, user=OTHER_USER).stdout.decode().splitlines()
    assert f"{ids['done']}|{TEST_USER}" in mine and {line.split("|")[1] for line in mine} == {TEST_USER}
    assert theirs == [f"{ids['theirs']}|{OTHER_USER}"]
    # root lists everyone's without -a, as the Python sacct does
    every = run(clients["nopy"], *argv, socket_path=cluster.socket, user=None).stdout.decode().splitlines()
    assert f"{ids['done']}|{TEST_USER}" in every and f"{ids['theirs']}|{OTHER_USER}" in every


def test_forms_left_to_python_reach_it_and_print_the_same(clients, acct):
    cluster, _ids = acct
    sock = cluster.socket
    for argv in (["--help"], ["-h"], ["--usage"], ["-e"], ["--helpformat"], ["-M", "elsewhere"], ["-o", "JobID,Bogus"],
                 ["-o", "JobID%x"], ["-o", "jobname%-30"], ["-s", "BOGUS"], ["-S", "yesterday-ish"], ["-E", "2020-13-01"],
                 ["-j", "abc"], ["-j", "1_[x]"], ["stray"], ["-o"], ["-Xn"], ["--long=x"]):
        same(clients, sock, *argv, rendered=False)
    # another time zone than the controller's: its midnight and local times are the Python sacct's
    for env in ({"TZ": "Asia/Kolkata"}, {"TZ": "America/New_York"}, {"TZ": "UTC0"},
                {"LANG": "en_US.ISO-8859-1"}, {"PYTHONIOENCODING": "latin-1"}, {"PYTHONUTF8": "0"}):
        same(clients, sock, "-a", "-o", "JobID,Submit,Start,End", env=env, rendered=False)
    same(clients, sock, "-u", "\xe9t\xe9".encode("latin-1").decode("utf-8", "surrogateescape"), rendered=False)


def test_a_controller_in_another_zone_renders_for_clients_in_that_zone(clients):
    """A controller with TZ=Asia/Kolkata (+05:30, no DST) renders sacct for clients with that TZ:
    their midnight and local times are its own, byte for byte the Python sacct's; a client with
    no TZ (UTC here) or another one gets the Python sacct."""
    zone = "Asia/Kolkata"
    if not Path("/usr/share/zoneinfo", zone).exists():
        pytest.skip("no tzdata")
    before = os.environ.get("TZ")
    os.environ["TZ"] = zone  # the daemons inherit it
    try:
        cluster = start_local_cluster()
    finally:
        if before is None:
            del os.environ["TZ"]
        else:
            os.environ["TZ"] = before
    try:
        job = cluster.submit("-J", "zoned", "--wrap", "true")
        cluster.wait_state(job, "COMPLETED", timeout=120)
        argv = ("-o", "JobID,JobName,Submit,Start,End,State")
        out = same(clients, cluster.socket, *argv, env={"TZ": zone}).stdout.decode()
        assert f"{job}.batch" in out and re.search(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", out)
        same(clients, cluster.socket, "-X", "-n", "-P", "-o", "JobID,Submit", "-S", "00:00", env={"TZ": zone})
        for env in ({"TZ": None}, {"TZ": "America/New_York"}, {"TZ": "UTC0"}):
            same(clients, cluster.socket, *argv, env=env, rendered=False)
    finally:
        cluster.close()


def test_a_running_job_s_elapsed_is_rendered_fresh(clients, acct):
    """Elapsed of a running job depends on the clock: never a text kept from an earlier call."""
    cluster, _ids = acct
    job = cluster.submit("-J", "runs", "--wrap", "sleep 120")
    try:
        cluster.wait_state(job, "RUNNING")
        argv = ("-X", "-n", "-P", "-j", str(job), "-o", "JobID,State,Elapsed")
        times = []
        for _ in range(2):
            out = run(clients["nopy"], *argv, socket_path=cluster.socket).stdout.decode()
            m = re.fullmatch(rf"{job}\|RUNNING\|(\d\d):(\d\d):(\d\d)\n", out)
            assert m, out
            times.append(int(m[1]) * 3600 + int(m[2]) * 60 + int(m[3]))
            time.sleep(2.5)
        assert times[1] >= times[0] + 2
    finally:
        cluster.cli("hcancel", str(job))
        cluster.wait_state(job, "CANCELLED", timeout=120)


def test_the_kept_text_follows_a_write(clients, acct):
    cluster, _ids = acct
    argv = ("-X", "-n", "-P", "-o", "JobID,State", "-s", "PD")
    before = run(clients["nopy"], *argv, socket_path=cluster.socket).stdout.decode()
    job = cluster.submit("--hold", "-J", "later", "--wrap", "true")
    assert f"{job}|PENDING\n" in run(clients["nopy"], *argv, socket_path=cluster.socket).stdout.decode()
    assert f"{job}|" not in before
    cluster.cli("hcancel", str(job))
    wait_for(lambda: f"{job}|" not in run(clients["nopy"], *argv, socket_path=cluster.socket).stdout.decode(), 30,
             what="the cancelled job to leave the pending listing")


def test_the_controller_refuses_garbage_by_name_and_keeps_serving(acct):
    """Oversized or malformed requests get an error response naming the field (bounded before any
    work), and the controller answers the next request as before."""
    cluster, ids = acct
    good = {"argv": ["-X", "-n", "-P", "-o", "JobID", "-j", str(ids["failed"])], "env": {}, "now": time.time(),
            "midnight": 0, "offsets": [[0, 0]]}
    bad = [({**good, "argv": ["-n"] * (api_listing_text.MAX_ARGV + 1)}, "field 'argv' is too long"),
           ({**good, "argv": ["x" * (api_listing_text.MAX_ARGV_CHARS + 1)]}, "field 'argv' is too long"),
           ({**good, "env": {"PATH": "/bin"}}, "names a variable sacct does not read"),
           ({**good, "env": {"SACCT_FORMAT": "JobID," * 1000}}, "SACCT_FORMAT must be a string of at most"),
           ({**good, "offsets": [[0, 0]] * 100}, "field 'offsets' must be 1 to"),
           ({**good, "offsets": "x"}, "field 'offsets' has the wrong type"),
           ({**good, "now": None}, "missing field 'now' or 'midnight'"),
           ({**good, "now": float("nan")}, "is not a time"),
           ([1, 2], "request body must be a map")]
    client = ControllerClient(cluster.socket, timeout=30)
    try:
        for body, error in bad:
            with pytest.raises(ClientError, match=re.escape(error)):
                client.call("sacct_text", body)
        # a midnight that is not ours: another zone, left to the Python sacct
        assert "fallback" in client.call("sacct_text", good)
    finally:
        client.close()
    assert cluster.call("ping")["cluster"]


def test_no_controller_old_controller_and_garbage(clients, tmp_path):
    """No socket: the Python sacct's message and status. A controller that does not know the
    request, or answers garbage: the Python sacct runs, and says what it says."""
    py = same(clients, "/nonexistent/ctl.sock", rendered=False)
    assert py.returncode == 1 and b"cannot reach the controller" in py.stderr
    listing = response({"now": time.time(), "jobs": [
        {"id": 7, "state": "PENDING", "reason": "JobHeldUser", "array_job_id": None, "array_task_id": None,
         "partition": "gpu", "name": "old", "user": TEST_USER, "uid": 0, "submit_time": time.time(), "start_time": None,
         "end_time": None, "exit_code": None, "exit_signal": None, "restart_count": 0, "nodes": 1, "cpus_per_task": 1,
         "tasks_per_node": 1, "overcommit": False}], "runs": [], "steps": [], "more": False, "next": None})
    cases = [(response(None, ok=False, error="method 'sacct_text' is not allowed"), listing),  # too old
             (frame({"v": 1, "k": "res", "id": 1, "ok": True, "b": {"text": 5}, "e": None}), listing),
             (frame({"v": 1, "k": "res", "id": 1, "ok": True, "b": {"fallback": "why"}, "e": None}), listing),
             (frame({"v": 1, "k": "res", "id": 2, "ok": True, "b": {"text": "forged\n"}, "e": None}), listing),
             (b"\x00\x00\x00\x04\xa3a\xff\xfe", listing),  # bad UTF-8
             (b"\xff\xff\xff\xff", listing), (b"", listing)]
    for n, (first, then) in enumerate(cases):
        outs = []
        for name in ("c", "py"):
            path = tmp_path / f"ctl-{n}-{name}.sock"
            fake = FakeController(path, *([first, then] if name == "c" else [then]))
            try:
                outs.append(run(clients[name], "-a", "-X", "-P", "-o", "JobID,JobName,State", socket_path=str(path),
                                user=None))
            finally:
                fake.close()
        c, py = outs
        assert py.returncode == 0 and b"7|old|PENDING" in py.stdout, py.stderr
        assert (c.returncode, c.stdout, c.stderr) == (py.returncode, py.stdout, py.stderr), n


def test_build_without_a_compiler_keeps_the_python_sacct(tmp_path):
    launcher = tmp_path / "sacct"
    launcher.write_text("#!/usr/bin/python3\n")
    proc = build(tmp_path, CC="/nonexistent/cc")
    assert proc.returncode == 0 and "the Python hsubmit, squeue and sacct" in proc.stdout
    assert launcher.read_text() == "#!/usr/bin/python3\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sacct"]
