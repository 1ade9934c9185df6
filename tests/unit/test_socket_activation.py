"""Socket activation (hai-controller.socket): the controller takes the listening socket systemd
passes as fd 3 ($LISTEN_FDS, $LISTEN_PID), only if it is the Unix stream socket its config names,
and none of it reaches the processes it starts. Each case runs in a child process whose fd 3 is
set up as systemd would (the test's own fd 3 belongs to pytest)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap

import pytest

from hai_cluster.controller.mail import setid_problem
from hai_cluster.sdnotify import listened_socket

CHILD = textwrap.dedent("""
    import os, sys
    from hai_cluster.sdnotify import ListenError, listened_socket
    if sys.argv[2] != "none":
        os.dup2(0, 3)  # systemd's first passed fd
    os.environ.update(LISTEN_FDS=sys.argv[3], LISTEN_PID=str(os.getpid()) if sys.argv[4] == "me" else "1")
    try:
        sock = listened_socket(sys.argv[1])
    except ListenError as exc:
        print("error:", exc)
        sys.exit(0)
    left = [k for k in os.environ if k.startswith("LISTEN_")]
    if sock is None:
        print("none", left)
        sys.exit(0)
    print("ok", sock.fileno(), os.get_inheritable(3), left, flush=True)
    sock.setblocking(True)
    conn, _ = sock.accept()
    conn.sendall(b"served")
""")


def child(path: str, given: socket.socket | None, count: str = "1", pid: str = "me") -> subprocess.Popen:
    stdin = given.fileno() if given is not None else subprocess.DEVNULL
    return subprocess.Popen([sys.executable, "-c", CHILD, path, "sock" if given else "none", count, pid],
                            stdin=stdin, stdout=subprocess.PIPE, text=True)


def listening(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.listen(8)
    return s


def test_the_socket_systemd_passes_is_served(tmp_path):
    path = str(tmp_path / "controller.sock")
    with listening(path) as s:
        proc = child(path, s)
        line = proc.stdout.readline().split()
        assert line == ["ok", "3", "False", "[]"]  # fd 3, not inherited, LISTEN_* gone
        with socket.socket(socket.AF_UNIX) as c:
            c.connect(path)
            assert c.recv(10) == b"served"
        assert proc.wait(10) == 0


def test_a_socket_that_is_not_the_configured_one_is_refused(tmp_path):
    path, other = str(tmp_path / "controller.sock"), str(tmp_path / "other.sock")
    with listening(other) as s:
        out = child(path, s).communicate(timeout=10)[0]
        assert out.startswith("error:") and f"not a listening Unix stream socket at {path}" in out
        assert other in out and "ListenStream=" in out
    with socket.socket(socket.AF_UNIX) as bound:  # bound, but not listening
        bound.bind(path)
        out = child(path, bound).communicate(timeout=10)[0]
        assert out.startswith("error:") and "bound to" in out
    with listening(str(tmp_path / "a.sock")) as s:
        out = child(path, s, count="2").communicate(timeout=10)[0]
        assert "systemd passed 2 sockets (LISTEN_FDS); expected one" in out


def test_sockets_meant_for_another_process_are_left_alone(tmp_path):
    path = str(tmp_path / "controller.sock")
    with listening(path) as s:
        out = child(path, s, pid="other").communicate(timeout=10)[0]
        assert out.strip() == "none []"  # not ours: not used, and not passed on either
    env = {}
    assert listened_socket(path, env) is None and env == {}


def test_a_setuid_mail_program_is_named_at_start(tmp_path):
    prog = tmp_path / "sendmail"
    prog.write_text("#!/bin/sh\n")
    prog.chmod(0o4755)
    link = tmp_path / "mail"
    link.symlink_to(prog)
    said = setid_problem(str(link), helpers=(), nnp=True)
    assert said and f"{prog} (what {link} runs) is setuid" in said and "msmtp-mta" in said
    assert setid_problem(str(link), helpers=(), nnp=False) is None  # as root, or without NoNewPrivileges
    plain = tmp_path / "plain"
    plain.write_text("#!/bin/sh\n")
    plain.chmod(0o755)
    assert setid_problem(str(plain), helpers=(str(tmp_path / "missing"), str(plain)), nnp=True) is None
    helper = tmp_path / "postdrop"
    helper.write_text("")
    helper.chmod(0o2755)
    if not os.stat(helper).st_mode & 0o2000:
        pytest.skip("this file system drops the setgid bit")
    assert "is setgid" in setid_problem(str(plain), helpers=(str(helper),), nnp=True)
