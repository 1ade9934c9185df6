"""spool's process queries on real process trees: the fast paths (the kernel's children list,
kill(-pgid, 0) for an empty group) give what the /proc scan gives."""
import os
import signal
import subprocess
import sys
import time

from hai_cluster.agent import spool


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
