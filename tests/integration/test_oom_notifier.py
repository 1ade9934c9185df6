"""A run's OOM is seen even when the cgroup it happened in is gone (cgroup v1): v1 counts the kill
only in the victim's own cgroup, and the cgroup a container runtime made below the run's goes,
with its count, when the container ends, often before the shepherd looks. The run's cgroup's OOM
eventfd (RunCgroup.oom_notifier) has it all the same. On this machine's real cgroups."""
from __future__ import annotations

import os
import secrets
import signal
import sys

import pytest

from hai_cluster.agent import cgroups

from .agent_helpers import need_root
from .test_device_cgroup import mounts

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def test_an_oom_kill_in_a_cgroup_below_the_run_that_is_gone_is_still_seen():
    need_root()
    v2, v1 = mounts()
    if "memory" not in v1:
        pytest.skip("no cgroup v1 memory controller here (v2 keeps the count in the run's cgroup)")
    parent = f"haitest-oom-{secrets.token_hex(4)}"
    caps = cgroups.Capabilities(parent=parent, v2=None, v1={"memory": v1["memory"]}, features={"memory": "v1"})
    os.mkdir(os.path.join(v1["memory"], parent))
    cg = cgroups.RunCgroup(caps, "7.0")
    efd = None
    try:
        cg.create(64, None, None)
        efd = cg.oom_notifier()
        assert efd is not None
        with pytest.raises(BlockingIOError):
            os.read(efd, 8)  # nothing yet
        below = os.path.join(cg.dirs["memory"], "runtime")  # as runc's container cgroup
        os.mkdir(below)
        pid = os.fork()
        if pid == 0:
            try:
                with open(os.path.join(below, "cgroup.procs"), "w") as f:
                    f.write("0")
                os.execv(sys.executable, [sys.executable, "-c", "b = bytearray(512 << 20)"])
            finally:
                os._exit(3)
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status
        assert cg.oom_kills() == 1  # counted below the run's cgroup, while that cgroup lasts
        os.rmdir(below)
        assert cg.oom_kills() == 0  # ... and gone with it
        assert int.from_bytes(os.read(efd, 8), sys.byteorder) >= 1  # the run's own cgroup's event stays
        assert cg.limit_reached()  # its own limit: the event is not one of a cgroup above
    finally:
        if efd is not None:
            os.close(efd)
        cg.remove()
        os.rmdir(os.path.join(v1["memory"], parent))


def test_an_oom_of_a_limit_above_the_run_is_not_the_runs():
    """A cgroup above the run's (a site's own limit on the agent's cgroups) runs out of memory: the
    kernel notifies every cgroup below it, the run's too, but the run's own limit refused nothing
    (limit_reached is false): the shepherd does not take it for the run's OOM. A run without a
    limit of its own gets no notifier."""
    need_root()
    v2, v1 = mounts()
    if "memory" not in v1:
        pytest.skip("no cgroup v1 memory controller here")
    parent = f"haitest-oom-{secrets.token_hex(4)}"
    caps = cgroups.Capabilities(parent=parent, v2=None, v1={"memory": v1["memory"]}, features={"memory": "v1"})
    os.mkdir(os.path.join(v1["memory"], parent))
    with open(os.path.join(v1["memory"], parent, "memory.limit_in_bytes"), "w") as f:
        f.write(str(64 << 20))
    cg, unlimited = cgroups.RunCgroup(caps, "8.0"), cgroups.RunCgroup(caps, "9.0")
    efd = None
    try:
        unlimited.create(None, None, None)
        assert unlimited.oom_notifier() is None
        cg.create(1024, None, None)
        efd = cg.oom_notifier()
        pid = os.fork()
        if pid == 0:
            try:
                with open(os.path.join(cg.dirs["memory"], "cgroup.procs"), "w") as f:
                    f.write("0")
                os.execv(sys.executable, [sys.executable, "-c", "b = bytearray(512 << 20)"])
            finally:
                os._exit(3)
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status
        assert int.from_bytes(os.read(efd, 8), sys.byteorder) >= 1  # notified, as a cgroup below
        assert not cg.limit_reached()  # but its own limit refused nothing
    finally:
        if efd is not None:
            os.close(efd)
        cg.remove()
        unlimited.remove()
        os.rmdir(os.path.join(v1["memory"], parent))
