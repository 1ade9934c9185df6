"""What the scheduler learns from the jobs that ended lives in the store (issue 24): a controller
stopped saves it, one killed folds in what it lacked at its next start (nothing lost, nothing
counted twice), and one whose saved state is gone rebuilds it from accounting. `hcontrol show
scheduler` shows it, and where a job stands in the order."""
from __future__ import annotations

import signal
import sqlite3

from hai_cluster.cli.client import ClientError

from ..e2e.harness import start_local_cluster, wait_for


def learned_from(cluster) -> int:
    line = cluster.cli("hcontrol", "show", "scheduler").stdout.splitlines()[0]
    return int(line.split("LearnedFrom=")[1].split()[0])


def restart(cluster, sig=signal.SIGTERM) -> None:
    cluster.controller.kill(sig)
    cluster.controller.start()

    def serving() -> bool:
        try:
            cluster.call("jobs", {})
            return True
        except ClientError:
            return False
    wait_for(serving, 30, what="the controller to serve again")


def run_jobs(cluster, n: int) -> None:
    ids = [cluster.submit("-J", "tiny", "--gpus-per-node=1", "-o", "/dev/null", "--wrap", "sleep 0.2")
           for _ in range(n)]
    for j in ids:
        cluster.wait_state(j, "COMPLETED")


def saved_row(cluster):
    db = sqlite3.connect(cluster.workdir / "hai.db")
    try:
        return db.execute("SELECT through_id, state FROM scheduler_state WHERE name = 'sizes'").fetchone()
    finally:
        db.close()


def test_the_learned_sizes_survive_restarts_kills_and_a_lost_state():
    cluster = start_local_cluster(gpus=2)
    try:
        run_jobs(cluster, 4)
        wait_for(lambda: learned_from(cluster) == 4, 15, what="the 4 ended jobs folded in")
        out = cluster.cli("hcontrol", "show", "scheduler").stdout
        assert "Order=gittins" in out and "g1" in out and "g1/n:tiny" in out
        restart(cluster)  # a clean stop saves it
        assert saved_row(cluster)[0] > 0
        assert learned_from(cluster) == 4
        run_jobs(cluster, 3)
        wait_for(lambda: learned_from(cluster) == 7, 15, what="the next 3 folded in")
        restart(cluster, signal.SIGKILL)  # no save: the start folds in what ended after the saved point
        assert learned_from(cluster) == 7
        db = sqlite3.connect(cluster.workdir / "hai.db")
        db.execute("UPDATE scheduler_state SET state = '{\"version\": 99}'")  # not a model this version reads
        db.commit()
        db.close()
        restart(cluster, signal.SIGKILL)
        assert learned_from(cluster) == 7  # rebuilt from the 7 ended jobs
        assert "rebuilt from 7 ended job(s)" in (cluster.workdir / "ctl.log").read_text()
        held = cluster.submit("--hold", "--gpus-per-node=1", "--wrap", "true")
        wait_for(lambda: f"Job {held}: level" in cluster.cli("hcontrol", "show", "scheduler", str(held)).stdout, 15,
                 what="the held job's standing")
        out = cluster.cli("hcontrol", "show", "scheduler", str(held), "999999").stdout
        line = next(x for x in out.splitlines() if x.startswith(f"Job {held}: level "))
        # the default order (gittins) ranks it by what the model says of a new 1-GPU job
        assert "Gittins rank" in line and "at 0 h of service on 1 GPU(s)" in line, out
        assert "from 7 finished jobs of g1" in line, out
        assert "Job 999999: not pending or running in the latest scheduling pass" in out
    finally:
        cluster.close()
