"""The C squeue (hai_cluster/native/squeue.c) against the Python one, its reference: both run as
each of the two test users against a real controller, over the same jobs (arrays, hostile names,
two users), and must print the same bytes and exit the same. The forms the C squeue sends to the
controller are checked to be rendered there (a build whose Python fallback cannot run prints
them all the same); the forms it leaves to Python are checked to reach Python (that build fails
on them). Then no controller, a controller too old for the request, garbage on the socket, and
the build without a compiler."""
from __future__ import annotations

import re
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from ..e2e.harness import OTHER_USER, TEST_USER, ensure_user, start_local_cluster, wait_for
from .native_clients import NO_PYTHON, front_end_builds
from .test_native_hsubmit import FakeController, build, frame, response



@pytest.fixture(scope="module")
def clients():
    yield from front_end_builds("squeue")


def run(binary: Path, *argv: str, socket_path: str, user: str | None = TEST_USER, env: dict | None = None
        ) -> subprocess.CompletedProcess:
    """binary argv as `user` (None: as this process); env's None values remove a variable."""
    pw = ensure_user(user) if user else None
    full = {"PATH": "/usr/bin:/bin", "HOME": pw.pw_dir if pw else "/", "USER": user or "root", "LANG": "C.UTF-8",
            "HAI_CONTROLLER": socket_path, **(env or {})}
    full = {k: v for k, v in full.items() if v is not None}
    kw = dict(user=pw.pw_uid, group=pw.pw_gid, extra_groups=[]) if pw else {}
    return subprocess.run([str(binary), *argv], cwd="/", capture_output=True, env=full, timeout=120, **kw)


def traceback_from_the_package(stderr: bytes) -> bytes:
    """A traceback without its first frame: the launcher's file, or the C squeue's `python -c`."""
    return re.sub(rb"(Traceback \(most recent call last\):\n).*?(?=  File \"[^\"]*/hai_cluster/)", rb"\1", stderr,
                  flags=re.S)


def clock_line_masked(stdout: bytes) -> bytes:
    """-l's first line is the time of the call: two calls may straddle a second."""
    return re.sub(rb"\A[A-Z][a-z]{2} [A-Z][a-z]{2} \d\d \d\d:\d\d:\d\d \d{4}\n", b"<now>\n", stdout)


def same(clients, socket_path: str, *argv: str, user: str = TEST_USER, env: dict | None = None,
         rendered: bool = True) -> subprocess.CompletedProcess:
    """The C and Python squeue print the same and exit the same; `rendered`: the controller made
    the C one's text (the build without Python prints it too), else it went to Python (that build
    cannot run it)."""
    c = run(clients["c"], *argv, socket_path=socket_path, user=user, env=env)
    py = run(clients["py"], *argv, socket_path=socket_path, user=user, env=env)
    c_err, py_err = traceback_from_the_package(c.stderr), traceback_from_the_package(py.stderr)
    assert (c.returncode, clock_line_masked(c.stdout), c_err) == (py.returncode, clock_line_masked(py.stdout), py_err), \
        (argv, env, user, c.stderr, py.stderr)
    nopy = run(clients["nopy"], *argv, socket_path=socket_path, user=user, env=env)
    if rendered:
        assert (nopy.returncode, clock_line_masked(nopy.stdout), nopy.stderr) == \
            (py.returncode, clock_line_masked(py.stdout), py.stderr), (argv, env)
    else:
        assert nopy.returncode == 1 and nopy.stderr.startswith(f"squeue: error: cannot run {NO_PYTHON}".encode()), \
            (argv, env, nopy.stderr)
    return py


@pytest.fixture(scope="module")
def queue():
    """A cluster whose queue holds: two users' held jobs, held arrays (a row each), names with `%`, a right-to-left override, non-ASCII
    text, and (written straight into the store, as a store from before the name checks would
    hold it) ESC sequences and a newline that forges a row."""
    c = start_local_cluster()
    try:
        ids = {"plain": c.submit("--hold", "-J", "plain", "--wrap", "true"),
               "percent": c.submit("--hold", "-J", "100%s %d %%", "--wrap", "true"),
               "rtl": c.submit("--hold", "-J", "rtl\u202eevil", "--wrap", "true"),
               "wide": c.submit("--hold", "-J", "é名前", "-t", "90", "--wrap", "true"),
               "array": c.submit("--hold", "-J", "arr", "--array=1-5", "--wrap", "true"),
               "mixed": c.submit("--hold", "-J", "mixed", "--array=0-3", "--wrap", "true"),
               "other": c.submit("--hold", "-J", "theirs", "--wrap", "true", user=OTHER_USER),
               "other2": c.submit("--hold", "-J", "theirs2", "-N", "1", "--gpus-per-node=2", "--wrap", "true",
                                  user=OTHER_USER)}
        with sqlite3.connect(c.workdir / "hai.db") as db:
            db.execute("UPDATE jobs SET name = ? WHERE id = ?", ("x\x1b[31mred\n999 FAKE", ids["plain"]))
        # a write through the controller, after the one behind its back: listings are read again
        ids["filler"] = c.submit("--hold", "-J", "filler", "--wrap", "true")
        ids["hostile"] = ids["plain"]
        yield c, ids
    finally:
        c.close()


def test_c_squeue_prints_what_the_python_one_prints(clients, queue):
    cluster, ids = queue
    sock = cluster.socket
    plain = run(clients["py"], socket_path=sock).stdout.decode()
    assert "\\x1b[31mred\\n999 FAKE" not in plain  # %.8j cuts it; -o %j shows it whole, escaped below
    whole = same(clients, sock, "-h", "-o", "%i|%j").stdout.decode()
    assert f"{ids['hostile']}|x\\x1b[31mred\\n999 FAKE\n" in whole and "\x1b" not in whole
    assert f"{ids['rtl']}|rtl\\u202eevil\n" in whole and f"{ids['percent']}|100%s %d %%\n" in whole
    assert f"{ids['array']}_[1-5]|arr\n" in whole
    partition = re.search(rb"\n\s*\d+\s+(\S+)", same(clients, sock).stdout).group(1).decode()
    for user in (TEST_USER, OTHER_USER):
        for argv in ([], ["-h"], ["--noheader"], ["-o", "%.18i|%T|%j|%u|%t|%R"], ["--format=%i %j %b %D %C %%"],
                     ["-o%i:%P"], ["--format", "%.5i%.3t"], ["-O", "jobid:10,state,name:.12,username,reasonlist"],
                     ["--Format=JobID,Name:30,TimeLimit,NumNodes"], ["-u", OTHER_USER], ["-u", f"{TEST_USER},{OTHER_USER}"],
                     ["--user", TEST_USER, "--user", "nobody-here"], ["--me"], ["--me", "-h", "-o", "%i %u"],
                     ["-t", "PD"], ["-t", "all"], ["--states=R"], ["-t", "pending,running"],
                     ["-j", f"{ids['plain']},{ids['other']}"], ["-j", f"{ids['array']}_2"], ["--jobs", str(ids["mixed"])],
                     ["-p", partition], ["-p", "nosuchpartition"], ["-n", "theirs,arr"], ["--name=é名前"],
                     ["-r"], ["-r", "-o", "%i %K %F %A"], ["-A", "default"], ["-w", "local1"], ["-v"],
                     ["-o", "%i %l %L %M %D %q %y %E %v %f %a %c %m %h %n %x %N %B %r %U %G %Y %k %w %W %O %d %H %I %J %z %X"],
                     ["-O", "jobid,restartcnt,preemptible,level,gpuutil,gpumem,idle"]):
            same(clients, sock, *argv, user=user)
    for env in ({"SQUEUE_FORMAT": "%i %j"}, {"SQUEUE_FORMAT2": "jobid:8,name"}, {"SQUEUE_USERS": OTHER_USER},
                {"SQUEUE_STATES": "all"}, {"SQUEUE_PARTITION": partition}, {"SQUEUE_NAMES": "arr"},
                {"SQUEUE_SORT": "-i", "SQUEUE_ACCOUNT": "x"},  # ones squeue.py does not read
                {"LANG": "en_US.UTF-8"}, {"LANG": None}, {"LANG": "C"}, {"LC_ALL": "C.utf8"}, {"PYTHONUTF8": "1"}):
        same(clients, sock, env=env)
        same(clients, sock, "-h", "-o", "%i %u", "--me", env=env)
    # --me is getpass.getuser(): LOGNAME first, and the uid's name when no variable names one
    same(clients, sock, "--me", env={"LOGNAME": OTHER_USER})
    out = same(clients, sock, "--me", "-h", "-o", "%u", user=OTHER_USER, env={"USER": None, "LOGNAME": None}).stdout
    assert set(out.split()) == {OTHER_USER.encode()}


def test_forms_left_to_python_reach_it_and_print_the_same(clients, queue):
    cluster, ids = queue
    sock = cluster.socket
    for argv in (["--help"], ["--usage"], ["-l"], ["--long"], ["--start"], ["-s"], ["--steps"], ["-hl"],
                 ["-o", "%i %S"], ["-o", "%V"], ["-O", "jobid,endtime"], ["-o", "%i %Q"], ["-o", "%p"],
                 ["-x"], ["stray"], ["-o"], ["-o", ""], ["-o", "%Z"], ["-O", "nosuchfield"], ["-o", "%i", "-o", "%j"],
                 ["-o", "%i", "-l"], ["-j", "abc"], ["-j", "1_[x]"], ["-t", "BOGUS"], ["-M", "elsewhere"],
                 ["-u", "a\tb"], ["-u", "-me"]):
        same(clients, sock, *argv, rendered=False)
    for env in ({"SQUEUE_FORMAT": "%Z"}, {"SQUEUE_FORMAT2": "bogus"}, {"SQUEUE_FORMAT": "%S"},
                {"LANG": "en_US.ISO-8859-1"}, {"LC_ALL": "de_DE"}, {"PYTHONIOENCODING": "latin-1"},
                {"PYTHONUTF8": "0"}):
        same(clients, sock, env=env, rendered=False)
    same(clients, sock, "-h", "-o", "%i", "-u", "\xe9t\xe9".encode("latin-1").decode("utf-8", "surrogateescape"),
         rendered=False)  # not UTF-8: the Python squeue's to decode


def test_a_running_job_s_time_is_rendered_fresh(clients, queue):
    """%M of a running job depends on the clock: never a text kept from an earlier call."""
    cluster, _ids = queue
    job = cluster.submit("-J", "runs", "--wrap", "sleep 120")
    try:
        cluster.wait_state(job, "RUNNING")
        argv = ("-h", "-j", str(job), "-o", "%i|%T|%M")
        times = []
        for _ in range(2):
            out = run(clients["nopy"], *argv, socket_path=cluster.socket).stdout.decode()
            m = re.fullmatch(rf"{job}\|RUNNING\|(\d+):(\d\d)\n", out)
            assert m, out
            times.append(int(m[1]) * 60 + int(m[2]))
            time.sleep(2.5)
        assert times[1] >= times[0] + 2
        # the default columns with a running job: the same but for the TIME column's seconds
        c, py = (run(clients[k], socket_path=cluster.socket).stdout.decode() for k in ("c", "py"))
        mask = lambda s: re.sub(r"\b\d+:\d\d\b", "T", s)  # noqa: E731
        assert mask(c) == mask(py) and f" {job} " in f" {c} "
    finally:
        cluster.cli("hcancel", str(job))
        cluster.wait_state(job, "CANCELLED", timeout=120)


def test_the_kept_text_follows_a_write(clients, queue):
    """The text is kept until the store's next write: a job submitted, then held, is listed at once."""
    cluster, _ids = queue
    argv = ("-h", "-o", "%i|%T|%r", "-u", TEST_USER, "-t", "PD")
    before = run(clients["nopy"], *argv, socket_path=cluster.socket).stdout.decode()
    assert before == run(clients["nopy"], *argv, socket_path=cluster.socket).stdout.decode()
    job = cluster.submit("--hold", "-J", "later", "--wrap", "true")
    after = run(clients["nopy"], *argv, socket_path=cluster.socket).stdout.decode()
    assert f"{job}|PENDING|JobHeldUser\n" in after and f"{job}|" not in before
    cluster.cli("hcancel", str(job))
    wait_for(lambda: f"{job}|" not in run(clients["nopy"], *argv, socket_path=cluster.socket).stdout.decode(), 30,
             what="the cancelled job to leave the listing")


def test_no_controller_old_controller_and_garbage(clients, tmp_path):
    """No socket: the Python squeue's message and status. A controller that does not know the
    request, or answers garbage: the Python squeue runs, and says what it says."""
    gone = "/nonexistent/ctl.sock"
    py = same(clients, gone, rendered=False)
    assert py.returncode == 1 and b"cannot reach the controller" in py.stderr
    listing = response({"now": time.time(), "jobs": [
        {"id": 7, "state": "PENDING", "reason": "JobHeldUser", "array_job_id": None, "array_task_id": None,
         "partition": "gpu", "account": None, "nodelist": None, "code": "PD", "name": "old", "user": TEST_USER,
         "start_time": None, "end_time": None, "nodes": 1}], "more": False, "next": None})
    cases = [(response(None, ok=False, error="method 'squeue_text' is not allowed"), listing),  # too old
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
                outs.append(run(clients[name], socket_path=str(path), user=None))
            finally:
                fake.close()
        c, py = outs
        assert py.returncode == 0 and b"old" in py.stdout
        assert (c.returncode, c.stdout, c.stderr) == (py.returncode, py.stdout, py.stderr), n


def test_build_without_a_compiler_keeps_the_python_squeue(tmp_path):
    launcher = tmp_path / "squeue"
    launcher.write_text("#!/usr/bin/python3\n")
    proc = build(tmp_path, CC="/nonexistent/cc")
    assert proc.returncode == 0
    assert "no C compiler" in proc.stdout and "the Python hsubmit, squeue and sacct" in proc.stdout
    assert launcher.read_text() == "#!/usr/bin/python3\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["squeue"]
