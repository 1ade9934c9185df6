"""spool's process queries on real process trees: the fast paths (the kernel's children list,
kill(-pgid, 0) for an empty group) give what the /proc scan gives; is_shepherd knows a shepherd
from a user's process with its command line."""
import os
import signal
import subprocess
import sys
import time

from hai_cluster.agent import spool

from .agent_helpers import ensure_user, need_root


def _spawn_tree(children: int) -> subprocess.Popen:
    """A parent in its own process group with `children` sleeping children, one of them a zombie
    (exited, not reaped). The parent prints when all are started."""
    code = (
        "import os, sys, time\n"
        f"for i in range({children}):\n"
        "    if os.fork() == 0:\n"
        "        if i == 0: os._exit(0)\n"
        "        time.sleep(60); os._exit(0)\n"
        "print('ready', flush=True); time.sleep(60)\n"
    )
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert p.stdout.readline().strip() == "ready"
    deadline = time.monotonic() + 10  # until the first child has exited (a zombie now)
    while time.monotonic() < deadline:
        states = [spool._stat_fields(c) for c in spool._scan_children(p.pid)]
        if [f[0] for f in states if f is not None].count("Z") == 1:
            return p
        time.sleep(0.02)
    raise AssertionError("the first child did not become a zombie")


def _stop(p: subprocess.Popen) -> None:
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()


def test_children_of_matches_the_proc_scan():
    p = _spawn_tree(4)
    try:
        scanned = sorted(spool._scan_children(p.pid))
        assert len(scanned) == 4  # three sleeping and one zombie: both kinds are children
        assert sorted(spool.children_of(p.pid)) == scanned
        assert spool.children_of(scanned[-1]) == []
    finally:
        _stop(p)


def test_children_of_a_process_that_is_gone_is_empty():
    p = subprocess.Popen(["true"])
    p.wait()
    assert spool.children_of(p.pid) == []


def test_group_members_live_group_and_emptied_group():
    p = _spawn_tree(3)
    try:
        members = spool.group_members(p.pid)
        # the parent and its two sleepers; the zombie is no member that counts
        live = [c for c in spool.children_of(p.pid) if spool.proc_starttime(c) is not None]
        assert sorted(members) == sorted([p.pid, *live]) and len(live) == 2
    finally:
        _stop(p)
    deadline = time.monotonic() + 10  # the killed children are reaped by init (or our subreaper)
    while spool.group_members(p.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert spool.group_members(p.pid) == []


# -- is_shepherd: whose process it is (issue 18, L2) --

SLEEP = "import ctypes, os, sys, time\n" \
        "if sys.argv[1] == 'nodump': ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE\n" \
        "if sys.argv[1].isdigit(): os.seteuid(int(sys.argv[1]))\n" \
        "print('ready', flush=True); time.sleep(60)\n"


def _fake_shepherd(run_dir: str, mode: str, **kw) -> subprocess.Popen:
    """A process whose command line ends as a shepherd's for run_dir (spool.shepherd_argv)."""
    p = subprocess.Popen([kw.pop("python", sys.executable), "-c", SLEEP, mode, "-m", spool.SHEPHERD_MODULE, run_dir],
                         stdout=subprocess.PIPE, text=True, **kw)
    assert p.stdout.readline().strip() == "ready"
    return p


def test_a_users_process_with_a_shepherds_command_line_is_no_shepherd(tmp_path):
    """Any user may start a process with a shepherd's command line: one that passed would keep a run
    whose shepherd died from being declared lost."""
    need_root()
    pw = ensure_user()
    run_dir = str(tmp_path / "runs" / "7.0")
    as_user = dict(python="/usr/bin/python3", user=pw.pw_uid, group=pw.pw_gid, extra_groups=[])
    procs = [_fake_shepherd(run_dir, mode, **as_user) for mode in ("plain", "nodump")]  # nodump: /proc files root's
    ours = _fake_shepherd(run_dir, "plain")
    try:
        assert [spool.is_shepherd(p.pid, run_dir) for p in procs] == [False, False]
        assert spool.find_shepherd(run_dir) == ours.pid  # the /proc scan skips the user's too
        assert spool.is_shepherd(ours.pid, run_dir) and not spool.is_shepherd(ours.pid, run_dir + "x")
    finally:
        for p in (*procs, ours):
            p.kill()
            p.wait()


def test_a_shepherd_that_has_its_users_effective_ids_for_a_moment_is_still_one(tmp_path):
    """runtimes.as_user gives the shepherd the user's effective ids while it opens the user's image:
    /proc/PID is then the user's, its real uid stays root's."""
    need_root()
    run_dir = str(tmp_path / "runs" / "8.0")
    p = _fake_shepherd(run_dir, str(ensure_user().pw_uid))
    try:
        assert os.stat(f"/proc/{p.pid}").st_uid != 0
        assert spool.is_shepherd(p.pid, run_dir)
    finally:
        p.kill()
        p.wait()
