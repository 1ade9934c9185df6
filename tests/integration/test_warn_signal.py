"""--signal's warning by Slurm's rule on a real process group (agent/contain.py): without B: the
job steps' tasks and what they started get it, the batch shell and srun-like processes beside it
do not."""
import os
import signal
import subprocess
import time
from pathlib import Path

from hai_cluster.agent.contain import deliver_to_steps
from hai_cluster.agent.spool import group_members


def _batch(tmp: Path) -> tuple[subprocess.Popen, Path]:
    log = tmp / "got.log"
    trap = tmp / "trap.sh"  # records that NAME got USR1 and runs on
    trap.write_text(f'trap "echo $1 >> {log}" USR1\nwhile :; do sleep 0.05; done\n')
    batch = tmp / "batch.sh"
    batch.write_text(
        f"trap 'echo batch >> {log}' USR1\n"
        f"sh {trap} srun &\n"  # like srun: in the batch shell's environment
        f"SLURM_STEP_ID=0 sh -c 'sh {trap} task-child & exec sh {trap} task' &\n"
        f"SLURM_STEP_ID=3 sh {trap} other-step &\n"
        "echo ready\nwhile :; do sleep 0.05; done\n")
    env = {k: v for k, v in os.environ.items() if k != "SLURM_STEP_ID"}
    p = subprocess.Popen(["sh", str(batch)], stdout=subprocess.PIPE, text=True, start_new_session=True, env=env)
    assert p.stdout.readline().strip() == "ready"
    deadline = time.monotonic() + 10
    while len(group_members(p.pid)) < 9 and time.monotonic() < deadline:  # 5 shells, their sleeps
        time.sleep(0.02)
    return p, log


def test_the_warning_reaches_every_steps_tasks_and_nothing_else(tmp_path):
    p, log = _batch(tmp_path)
    try:
        assert deliver_to_steps(p.pid, signal.SIGUSR1, None) >= 3
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and len(log.read_text().split() if log.exists() else ()) < 3:
            time.sleep(0.05)
        time.sleep(0.3)  # a wrong receiver would have written by now too
        assert sorted(log.read_text().split()) == ["other-step", "task", "task-child"]
        assert p.poll() is None  # the batch shell runs on
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def test_a_group_without_steps_gets_nothing(tmp_path):
    p = subprocess.Popen(["sleep", "30"], start_new_session=True,
                         env={k: v for k, v in os.environ.items() if k != "SLURM_STEP_ID"})
    try:
        assert deliver_to_steps(p.pid, signal.SIGUSR1, None) == 0 and p.poll() is None
    finally:
        p.kill()
        p.wait()
