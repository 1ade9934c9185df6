"""The root shepherd never signals a process that is not the job's (the second audit of issue 18,
H1): once the job's main process was reaped, its pid (also its process group's id) could be given
to another user's process, which the grace period's SIGKILL then killed. Real users, a real
cluster; the pid reuse is made to happen at once with /proc/sys/kernel/ns_last_pid (as CRIU
does), instead of cycling through every pid as the attacker had to."""
from __future__ import annotations

import os
import pwd
import signal
import subprocess
import time
from pathlib import Path

import pytest

from .harness import OTHER_USER, TEST_USER, start_local_cluster, user_dir, wait_for

pytestmark = pytest.mark.timeout(180)
NS_LAST_PID = Path("/proc/sys/kernel/ns_last_pid")


def proc_state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def spawn_as(user: str, pid_wanted: int) -> subprocess.Popen:
    """A process of `user`, given pid_wanted if that pid is free (ns_last_pid set just before)."""
    pw = pwd.getpwnam(user)
    NS_LAST_PID.write_text(str(pid_wanted - 1))
    return subprocess.Popen(["sleep", "120"], user=pw.pw_uid, group=pw.pw_gid, extra_groups=[],
                            start_new_session=True)


@pytest.mark.skipif(not NS_LAST_PID.exists(), reason="no /proc/sys/kernel/ns_last_pid (CONFIG_CHECKPOINT_RESTORE)")
def test_a_reused_pid_of_the_jobs_main_process_is_never_signalled():
    c = start_local_cluster(gpus=1)
    victims: list[subprocess.Popen] = []
    try:
        d = user_dir(c.workdir, TEST_USER)
        # The main process records its pid, then starts a child that leaves its process group and
        # ignores SIGTERM: it keeps the run in its grace period after the main process died.
        (d / "linger.sh").write_text(
            "#!/bin/bash\n"
            f"echo $$ > {d}/main.pid\n"
            "setsid bash -c 'trap \"\" TERM; sleep 100' < /dev/null > /dev/null 2>&1 &\n"
            "sleep 100\n")
        job = c.submit("--grace=8", str(d / "linger.sh"), cwd=d)
        main = int(wait_for(lambda: (d / "main.pid").exists() and (d / "main.pid").read_text().strip(), 30,
                            what="the job's main process"))
        c.cli("hcancel", str(job))  # SIGTERM: the main process dies, the setsid child lingers
        wait_for(lambda: proc_state(main) in (None, "Z"), 30, what="the main process to die")
        # Another user's process takes the main process's pid if the shepherd let it go.
        for _ in range(20):
            victims.append(spawn_as(OTHER_USER, main))
            if victims[-1].pid == main:
                break
        assert proc_state(main) == "Z" and all(v.pid != main for v in victims), \
            "the job's main process was reaped while its run was still being ended: its pid is free"
        c.wait_state(job, "CANCELLED", timeout=60)  # the grace period is over: SIGKILL went out
        time.sleep(0.5)
        assert all(v.poll() is None for v in victims), "a process of another user was killed"
        assert proc_state(main) is None  # reaped at last, once nothing signals it any more
    finally:
        for v in victims:
            if v.poll() is None:
                v.send_signal(signal.SIGKILL)
                v.wait()
        c.close()
