"""The C hsubmit (hai_cluster/native/hsubmit.c) against the Python one, its reference: both run as
an ordinary user against a real controller on the same cases, and must print the same, exit the
same and store the same jobs. Then the C client against a fake controller that answers garbage:
a clear error and exit 1, never a signal. And the build itself: warnings-clean, the no-compiler
and compile-error paths."""
from __future__ import annotations

import json
import os
import pty
import re
import shutil
import socket
import sqlite3
import struct
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from hai_cluster.native.build import is_compiled
from hai_cluster.protocol import minipack

from ..e2e.harness import TEST_USER, ensure_user, start_local_cluster, user_dir, wait_for

FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL"}


def build(bin_dir: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hai_cluster.native.build", "--bin", str(bin_dir)],
                          capture_output=True, text=True, env={**os.environ, **env})


@pytest.fixture(scope="module")
def clients():
    """{"c": the compiled hsubmit, "py": a launcher of the Python one}, in a directory the test user
    can reach. The C one is built with -Wall -Wextra -Werror: warnings fail the build."""
    if not shutil.which(os.environ.get("CC") or "cc"):
        pytest.skip("no C compiler")
    d = Path(tempfile.mkdtemp(prefix="hai-native-", dir="/tmp"))
    os.chmod(d, 0o755)
    proc = build(d, CFLAGS="-O2 -Wall -Wextra -Werror")
    assert proc.returncode == 0, proc.stderr
    assert "built" in proc.stdout
    assert is_compiled(d / "hsubmit")
    py = d / "hsubmit-py"  # what setup.cfg's bin/hsubmit launcher does
    py.write_text(f"#!{sys.executable}\nfrom hai_cluster.cli.hsubmit import main\nraise SystemExit(main())\n")
    py.chmod(0o755)
    short = d / "short"  # a 2 s timeout, for the fake server that never answers
    short.mkdir(mode=0o755)
    proc = build(short, CFLAGS="-O2 -DHAI_TIMEOUT_SECONDS=2")
    assert proc.returncode == 0, proc.stderr
    yield {"c": d / "hsubmit", "py": py, "short": short / "hsubmit"}
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster():
    c = start_local_cluster()
    yield c
    c.close()


def run(binary: Path, *argv: str | bytes, socket_path: str, cwd: Path, env: dict | None = None,
        stdin=subprocess.DEVNULL) -> subprocess.CompletedProcess:
    pw = ensure_user(TEST_USER)
    full_env = {"PATH": "/usr/bin:/bin", "HOME": pw.pw_dir, "USER": TEST_USER, "LANG": "C.UTF-8",
                "HAI_CONTROLLER": socket_path, **(env or {})}
    kw = {"input": stdin} if isinstance(stdin, bytes) else {"stdin": stdin}
    return subprocess.run([str(binary), *argv], user=pw.pw_uid, group=pw.pw_gid, extra_groups=[], cwd=cwd,
                          capture_output=True, env=full_env, timeout=120, **kw)


def both(clients, cluster, *argv, socket_path: str | None = None, **kw) -> tuple[subprocess.CompletedProcess, list[int]]:
    """Runs the case with each client; asserts the same output and status (job ids normalised)
    and returns the Python run and the job ids each printed, C's first."""
    out, ids = {}, []
    for name in ("c", "py"):
        proc = run(clients[name], *argv, socket_path=socket_path or cluster.socket,
                   cwd=user_dir(cluster.workdir, TEST_USER), **kw)
        assert proc.returncode >= 0, f"{name} hsubmit died of signal {-proc.returncode}"
        found = re.findall(rb"\d+", proc.stdout)
        ids += [int(found[0])] if found else []
        out[name] = (proc.returncode, re.sub(rb"\d+", b"N", proc.stdout), proc.stderr)
    assert out["c"] == out["py"], f"{argv}: C {out['c']} != Python {out['py']}"
    return proc, ids


def jobs(cluster, ids: list[int]) -> list[dict]:
    return cluster.call("jobs", {"ids": ids, "all": True})["jobs"]


TIMES = {"submit_time", "start_time", "end_time", "pending_since", "last_run_end", "attained_gpu_seconds",
         "attained_now"}  # and what the run time decides


def same_jobs(cluster, c_id: int, py_id: int, *, run: bool = True) -> None:
    """The two jobs (submitted held) have the same spec in the store (the script, its environment,
    arguments, working directory: all the client sent), compared while they are pending (a final
    job's script and environment leave the store), and the same fields (the "jobs" RPC) but for
    ids and times; with `run`, once released and ended too."""
    # the scheduler's next pass gives both their reason (one may have had it already)
    wait_for(lambda: "None" not in {j["reason"] for j in jobs(cluster, [c_id, py_id])}, 30, what="pending reasons")
    with sqlite3.connect(cluster.workdir / "hai.db") as db:
        specs = {i: json.loads(db.execute("SELECT spec FROM jobs WHERE id = ?", (i,)).fetchone()[0])
                 for i in (c_id, py_id)}
    assert specs[c_id]["environment"] and specs[c_id]["script"]
    assert specs[c_id] == specs[py_id]
    if run:
        for i in (c_id, py_id):
            cluster.call("release", {"job_id": i})
        wait_for(lambda: all(j["state"] in FINAL for j in jobs(cluster, [c_id, py_id])), 60, what="jobs to end")
    rows = {j["id"]: {k: v for k, v in j.items() if k != "id" and k not in TIMES} for j in jobs(cluster, [c_id, py_id])}
    assert rows[c_id] == rows[py_id]


def test_c_and_python_hsubmit_print_exit_and_submit_the_same(clients, cluster):
    work = user_dir(cluster.workdir, TEST_USER)
    script = work / "job.sh"
    script.write_text("#!/bin/bash\n#SBATCH -J directed\n#SBATCH --gpus-per-node=1\n#SBATCH -t 5\necho \"$@\"\n")
    crlf = work / "crlf.sh"
    crlf.write_bytes(b"#!/bin/bash\r\n#SBATCH -J crlf\r\necho one\recho two\r\n")
    (work / "dir.sh").mkdir(exist_ok=True)

    _, ids = both(clients, cluster, "--hold", "--wrap", "true")
    same_jobs(cluster, *ids)
    proc, ids = both(clients, cluster, "--hold", "--parsable", "--wrap=echo hi")
    assert proc.stdout.strip().isdigit()
    same_jobs(cluster, *ids)
    proc, ids = both(clients, cluster, "--hold", "-o", "out-%j.txt", str(script), "a b", "c")
    assert proc.stdout.startswith(b"Submitted batch job ")
    same_jobs(cluster, *ids)
    _, ids = both(clients, cluster, "--hold", "crlf.sh")
    same_jobs(cluster, *ids)
    _, ids = both(clients, cluster, "--hold", "--parsable", "--gpus-per-node=2",
                  stdin=b"#!/bin/sh\n#SBATCH -J piped\necho in\n")
    same_jobs(cluster, *ids)
    _, ids = both(clients, cluster, "--hold", "--wrap", "true")
    same_jobs(cluster, *ids, run=False)
    assert {j["state"] for j in jobs(cluster, ids)} == {"PENDING"}

    proc, _ = both(clients, cluster, "-W", "--wrap", "true")
    assert proc.returncode == 0
    proc, _ = both(clients, cluster, "--wait", "--parsable", "--wrap", "exit 3")
    assert proc.returncode == 3
    proc, _ = both(clients, cluster, "--test-only", "--wrap", "true")
    assert proc.stderr.startswith(b"hsubmit: Job would ") and proc.returncode == 0
    proc, _ = both(clients, cluster, "--test-only", "--gpus-per-node=2", "-N", "1", "--hold", "--wrap", "true")
    assert proc.returncode == 0

    before = {j["id"] for j in cluster.call("jobs", {"all": True})["jobs"]}
    failures = [
        (("nope.sh",), {}, b"hsubmit: error: Unable to open file nope.sh: No such file or directory\n"),
        (("dir.sh",), {}, b"hsubmit: error: Unable to open file dir.sh: Is a directory\n"),
        (("--nodes=0", "--wrap", "true"), {}, b"hsubmit: error: "),
        (("--no-such-option", "--wrap", "true"), {}, b"hsubmit: error: "),
        (("--wrap", "true"), {"socket_path": "/nonexistent/ctl.sock"},
         b"hsubmit: error: cannot reach the controller at /nonexistent/ctl.sock: No such file or directory"),
        (("bad.sh",), {}, b"hsubmit: error: script bad.sh is not valid UTF-8 (byte 0xff at offset 15)\n"),
        ((), {"stdin": b"#!/bin/sh\necho \xe2\x82\n"},
         b"hsubmit: error: the script on standard input is not valid UTF-8 (byte 0xe2 at offset 15)\n"),
        (("--wrap", "true"), {"env": {b"BAD\xffNAME": b"x"}},
         b"hsubmit: error: environment variable BAD\\xffNAME is not valid UTF-8\n"),
        (("--wrap", "true"), {"env": {b"GOODNAME": b"caf\xe9 \xed\xa0\x80"}},
         b"hsubmit: error: environment variable GOODNAME is not valid UTF-8\n"),
        (("--wrap", b"echo \xc3"), {}, b"hsubmit: error: argument echo \\xc3 is not valid UTF-8\n"),
    ]
    (work / "bad.sh").write_bytes(b"#!/bin/sh\necho \xff\n")
    for argv, kw, err in failures:
        proc, _ = both(clients, cluster, *argv, **kw)
        assert proc.returncode == 1 and proc.stderr.startswith(err) and proc.stdout == b"", (argv, proc.stderr)
    assert {j["id"] for j in cluster.call("jobs", {"all": True})["jobs"]} == before  # none submitted

    # No script at all: standard input is a terminal.
    main, secondary = pty.openpty()
    try:
        proc, _ = both(clients, cluster, stdin=secondary)
    finally:
        os.close(main)
        os.close(secondary)
    assert proc.returncode == 1
    assert proc.stderr == b"hsubmit: error: no script given (a file, --wrap, or a script on standard input)\n"

    # --help, -h and --usage: the C one runs the Python one (sys.argv[1:] must come out right).
    for argv in (("--help",), ("-h", "whatever"), ("--usage",)):
        proc, _ = both(clients, cluster, *argv)
        assert proc.returncode == 0 and proc.stdout.startswith(b"Usage: hsubmit [OPTIONS]")
    proc, _ = both(clients, cluster, "--usage", "--wrap", "true")  # not alone: a submission
    assert proc.returncode == 1 and proc.stderr.startswith(b"hsubmit: error: ")


class FakeController:
    """A socket that answers the first request of its Nth connection with replies[N] (the last one
    for any later connection) and closes; a None reply holds the connection open without a word."""

    def __init__(self, path: Path, *replies: bytes | None) -> None:
        self.replies = replies
        self.requests: list[bytes] = []  # the first read of each connection
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.bind(str(path))
        self.sock.listen(8)
        self.held: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        n = 0
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            reply = self.replies[min(n, len(self.replies) - 1)]
            n += 1
            conn.settimeout(10)
            try:
                self.requests.append(conn.recv(1 << 20))  # the request (it fits)
                if reply is None:
                    self.held.append(conn)
                    continue
                conn.sendall(reply)
            except OSError:
                pass
            conn.close()

    def close(self) -> None:
        self.sock.close()
        for c in self.held:
            c.close()


def frame(obj) -> bytes:
    payload = minipack.packb(obj)
    return struct.pack(">I", len(payload)) + payload


def response(body, id: int = 1, ok: bool = True, error=None) -> bytes:
    return frame({"v": 1, "k": "res", "id": id, "ok": ok, "b": body, "e": error})


GARBAGE = [
    (b"\x00\x00\x00\x10\x81\xa1v", "the controller closed the connection"),  # truncated frame, then close
    (struct.pack(">I", 0xFFFFFFF0) + b"x", "bad reply from the controller: frame length"),
    (frame([1, 2, 3]), "bad reply from the controller: frame is a list, expected a map"),
    (frame("a string"), "bad reply from the controller: frame is a str, expected a map"),
    (struct.pack(">I", 3) + b"\xc1\xc1\xc1", "bad reply from the controller: undecodable frame"),
    (struct.pack(">I", 4) + b"\x82\xa1v\x01", "bad reply from the controller: undecodable frame"),  # truncated map
    (struct.pack(">I", 5) + b"\xdf\xff\xff\xff\xff", "bad reply from the controller: undecodable frame"),
    (struct.pack(">I", 4) + b"\xa3a\xff\xfe", "bad reply from the controller: undecodable frame"),  # bad UTF-8
    (struct.pack(">I", 3) + b"\x81\x90\x01", "bad reply from the controller: undecodable frame"),  # list as key
    (struct.pack(">I", 2) + b"\x81\xa1", "bad reply from the controller: undecodable frame"),
    (struct.pack(">I", 3000) + b"\x91" * 2999 + b"\x01", "bad reply from the controller: undecodable frame"),
    (struct.pack(">I", 2) + b"\x80\x00", "bad reply from the controller: undecodable frame: 1 bytes after"),
    (frame({"v": 2, "k": "res", "id": 1, "ok": True, "b": None, "e": None}), "bad reply from the controller: protocol"),
    (frame({"v": 1, "k": "what", "id": 1}), "bad reply from the controller: unknown message kind"),
    (frame({"v": 1, "k": "res", "id": "1", "ok": True}), "bad reply from the controller: message field 'id'"),
    (frame({"v": 1, "k": "res", "id": 1, "ok": 1}), "bad reply from the controller: message field 'ok'"),
    (frame({"v": 1, "k": "res", "id": 1, "ok": False, "e": None}), "bad reply from the controller: error response"),
    (response(None), "bad reply from the controller: "),
    (response([1]), "bad reply from the controller: "),
    (response({"need_script": True}), "bad reply from the controller: need_script without"),
    (response({"job_id": "7", "parsable": True, "wait": False}), "bad reply from the controller: no job_id"),
    (response({"test_only": {"start": "now", "nodes": [1], "partition": "p"}}), "bad reply from the controller: "),
    (response({"test_only": 5}), "bad reply from the controller: "),
    (response(None, id=2) + b"\x00", "the controller closed the connection"),  # another request's answer
    (response(None, ok=False, error="the controller says no"), "hsubmit: error: the controller says no"),
    (frame({"v": 1, "k": "evt", "m": "hello", "b": None}) + frame({"v": 1, "k": "req"}),
     "bad reply from the controller: message field 'id'"),
]


@pytest.mark.parametrize("reply,error", GARBAGE, ids=range(len(GARBAGE)))
def test_c_hsubmit_refuses_garbage_from_the_socket(clients, tmp_path, reply, error):
    path = tmp_path / "ctl.sock"
    fake = FakeController(path, reply)
    try:
        proc = subprocess.run([str(clients["c"]), "--wrap", "true"], capture_output=True, text=True, timeout=60,
                              env={"PATH": "/usr/bin:/bin", "HAI_CONTROLLER": str(path)})
    finally:
        fake.close()
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    assert proc.stderr.startswith(error if error.startswith("hsubmit") else f"hsubmit: error: {error}"), proc.stderr
    assert proc.stdout == ""


def test_c_hsubmit_gives_up_on_a_silent_controller(clients, tmp_path):
    path = tmp_path / "ctl.sock"
    fake = FakeController(path, None)
    try:
        proc = subprocess.run([str(clients["short"]), "--wrap", "true"], capture_output=True, text=True, timeout=60,
                              env={"HAI_CONTROLLER": str(path)})
    finally:
        fake.close()
    # sent again once with the same key (the first may have been recorded), then given up
    silent = "no answer from the controller within 2 s"
    assert (proc.returncode, proc.stderr) == (
        1, f"hsubmit: error: {silent}; the job may have been submitted: check hqueue (retrying failed: {silent})\n")


def submit_key(request: bytes) -> str:
    return minipack.unpackb(request[4:])["b"]["key"]


def submit_to_fake(binary: Path, path: Path, *replies: bytes) -> tuple[subprocess.CompletedProcess, list[bytes]]:
    """`binary --wrap true` against a FakeController answering `replies`; its result, and the
    requests the fake received."""
    fake = FakeController(path, *replies)
    try:
        proc = subprocess.run([str(binary), "--wrap", "true"], capture_output=True, text=True, timeout=60,
                              env={"PATH": "/usr/bin:/bin", "HAI_CONTROLLER": str(path)})
    finally:
        fake.close()
    return proc, fake.requests


@pytest.mark.parametrize("client", ["c", "py"])
def test_a_submission_whose_reply_was_lost_is_sent_again_with_its_key(clients, tmp_path, client):
    """The controller died after recording the job (the first connection closes without a word):
    the client sends the same request once more, on a new connection, with the same idempotency
    key, and the controller's answer to it (the job the first one made) is what it prints."""
    proc, requests = submit_to_fake(clients[client], tmp_path / "ctl.sock", b"",
                                    response({"job_id": 7, "parsable": False, "wait": False}))
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "Submitted batch job 7\n", "")
    assert len(requests) == 2
    first_key, second_key = (submit_key(r) for r in requests)
    assert first_key == second_key and re.fullmatch(r"[0-9a-f]{32}", first_key)
    # a new submission has a key of its own
    proc, requests = submit_to_fake(clients[client], tmp_path / "ctl2.sock",
                                    response({"job_id": 8, "parsable": True, "wait": False}))
    assert proc.returncode == 0
    assert re.fullmatch(r"[0-9a-f]{32}", submit_key(requests[0])) and submit_key(requests[0]) != first_key


@pytest.mark.parametrize("client", ["c", "py"])
def test_a_retry_refused_for_good_says_the_job_may_exist(clients, tmp_path, client):
    """The retry reaches a controller that refuses it (not a "try again" refusal): the user is told
    that the first attempt may have created the job, and where to look."""
    proc, _ = submit_to_fake(clients[client], tmp_path / "ctl.sock", b"",
                             response(None, ok=False, error="the controller says no"))
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr == ("hsubmit: error: the controller closed the connection; the job may have been submitted: "
                           "check hqueue (retrying failed: the controller says no)\n")


@pytest.mark.parametrize("client", ["c", "py"])
def test_a_retry_waits_while_the_controller_says_try_again(clients, tmp_path, client):
    """A restarting controller refuses requests until its store is open ("...; try again"): the
    retry waits for it within its window instead of giving up at the first refusal."""
    starting = response(None, ok=False, error="the controller is starting (its store is not open yet); try again")
    proc, requests = submit_to_fake(clients[client], tmp_path / "ctl.sock", b"", starting, starting,
                                    response({"job_id": 9, "parsable": True, "wait": False}))
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "9\n", "")
    assert len(requests) == 4 and len({submit_key(r) for r in requests}) == 1


def test_c_hsubmit_handles_a_job_list_reply_for_wait(clients, tmp_path):
    """--wait's poll (a connection of its own): a reply with floats, nested maps and an array task
    that ended without an exit code, which counts as 1."""
    path = tmp_path / "ctl.sock"
    jobs = {"now": 1.5, "jobs": [{"id": 7, "state": "COMPLETED", "exit_code": 0, "t": {"x": [1.25, None, b"\0"]}},
                                 {"id": 8, "state": "FAILED", "exit_code": None}]}
    fake = FakeController(path, response({"job_id": 7, "parsable": False, "wait": True}), response(jobs))
    try:
        proc = subprocess.run([str(clients["c"]), "--wrap", "true"], capture_output=True, timeout=60,
                              env={"HAI_CONTROLLER": str(path)})
    finally:
        fake.close()
    assert (proc.returncode, proc.stdout, proc.stderr) == (1, b"Submitted batch job 7\n", b"")


def test_build_without_a_compiler_keeps_the_python_hsubmit(tmp_path):
    launcher = tmp_path / "hsubmit"
    launcher.write_text("#!/usr/bin/python3\n")
    proc = build(tmp_path, CC="/nonexistent/cc")
    assert proc.returncode == 0
    assert "no C compiler" in proc.stdout and "the Python hsubmit" in proc.stdout
    assert launcher.read_text() == "#!/usr/bin/python3\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hsubmit"]


def test_build_that_fails_to_compile_leaves_hsubmit_alone(tmp_path):
    if not shutil.which("cc"):
        pytest.skip("no C compiler")
    launcher = tmp_path / "hsubmit"
    launcher.write_text("#!/usr/bin/python3\n")
    proc = build(tmp_path, CC="cc", CFLAGS="-DHAI_TIMEOUT_SECONDS=(")  # breaks client.h's programs alone
    assert proc.returncode == 1
    assert "failed" in proc.stderr and "unchanged" in proc.stderr
    assert launcher.read_text() == "#!/usr/bin/python3\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hai-jobexec", "hsubmit"]  # each program alone
