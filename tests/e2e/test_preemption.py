"""MLFQ time-slicing end to end on real daemons: preemption with checkpoint and resume, grace
periods, --no-requeue, urgent jobs, and what hacct/hqueue show of it."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from hai_cluster.core.hostlist import compress

from .harness import OTHER_USER, TEST_USER, start_ssh_cluster, user_dir, wait_for

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = {"HAI_EXAMPLES": str(REPO / "examples")}
# The production order (gittins) with a restart cost of 0.5 s, so that a test sees preemptions
# within seconds: a run may be preempted 5 s into it (10 restart costs) by a job at least a level
# above it. Once the cluster has seen jobs end within seconds (the fixture's), a fresh job is
# level 0 and one that has had 10 s of service sinks levels below it.
SCHEDULER = """[scheduler]
policy = "mlfq"
restart_cost = 0.5
max_user_priority = "urgent"
"""


@pytest.fixture(scope="module")
def cluster(ssh_nodes):
    c = start_ssh_cluster(ssh_nodes, gpus_per_node=2, scheduler_toml=SCHEDULER)
    teach_short_jobs(c)
    yield c
    c.close()


def teach_short_jobs(cluster, count: int = 3) -> None:
    """Let the cluster see jobs end within seconds, as a busy one has: what it learns of job sizes
    (the Gittins order's) then puts fresh jobs ahead of runs that have had 10 s of service."""
    jobs = [cluster.submit("--gpus-per-node=1", "--wrap", "true") for _ in range(count)]
    for j in jobs:
        assert cluster.wait_state(j, "COMPLETED", "FAILED", timeout=60)["state"] == "COMPLETED"


def steps_by_run(log: Path) -> dict[int, list[int]]:
    runs: dict[int, list[int]] = {}
    for line in log.read_text().splitlines():
        m = re.fullmatch(r"run=(\d+) step=(\d+)", line.strip())
        assert m, f"unexpected line in steps.log: {line!r}"
        runs.setdefault(int(m[1]), []).append(int(m[2]))
    return runs


def checkpoint_dir(cluster, job_id: int, user: str = TEST_USER) -> Path:
    return user_dir(cluster.workdir, user) / ".hai" / "checkpoints" / str(job_id)


def test_short_job_preempts_long_ones_which_resume_from_their_checkpoint(cluster):
    script = str(REPO / "examples" / "train_loop.sh")
    a_jobs = [cluster.submit("--gpus-per-node=2", "--grace=20", "-o", f"a{i}-%j.out", script, "200", "0.1", "10",
                             env=EXAMPLES) for i in range(2)]
    for j in a_jobs:
        cluster.wait_state(j, "RUNNING")
    # train_loop.py uses hai_cluster.job, which tells the cluster that the job resumes: no option needed
    wait_for(lambda: all("Preemptible=announced " in cluster.cli("scontrol", "show", "job", str(j)).stdout
                         for j in a_jobs), 30, what="the jobs to say they resume")
    b = cluster.submit("--gpus-per-node=2", "--wrap", "echo short job done", user=OTHER_USER)
    # Once A's runs have had 10 s of service (levels below fresh B) and held their GPUs for 10
    # restart costs, one of them makes way for B.
    done = cluster.wait_state(b, "COMPLETED", "FAILED", timeout=90)
    assert done["state"] == "COMPLETED"
    for j in a_jobs:
        assert cluster.wait_state(j, "COMPLETED", "FAILED", timeout=120)["state"] == "COMPLETED"
    preempted = [j for j in a_jobs if cluster.job(j)["restart_count"] > 0]
    assert len(preempted) >= 1
    for j in preempted:
        job = cluster.job(j)
        runs = job["runs"]
        assert [r["state"] for r in runs][-1] == "COMPLETED"
        assert all(r["state"] == "PREEMPTED" for r in runs[:-1])
        assert all("exited within its grace period" in r["reason"] for r in runs[:-1]), runs
        steps = steps_by_run(checkpoint_dir(cluster, j) / "steps.log")
        # Each run continues exactly where the previous one checkpointed: nothing lost or repeated.
        flat = [s for run in sorted(steps) for s in steps[run]]
        assert flat == list(range(1, 201))
        assert sorted(steps) == list(range(job["restart_count"] + 1))
        acct = cluster.cli("hacct", "-X", "-j", str(j), "-P", "-n", "-o", "State,Restarts").stdout.splitlines()
        assert [line.split("|")[0] for line in acct] == ["PREEMPTED"] * job["restart_count"] + ["COMPLETED"]
        assert [line.split("|")[1] for line in acct] == [str(i) for i in range(len(acct))]
        out = (user_dir(cluster.workdir, TEST_USER) / f"a{a_jobs.index(j)}-{j}.out").read_text()
        assert "done: steps=200" in out  # output of every run lands in the same file
    # The history says who was preempted, for whom and why, and what followed.
    first = cluster.cli("hcontrol", "show", "events", str(preempted[0]), user="root").stdout
    assert f"event=preempted job={preempted[0]} for_job={b} by=scheduler" in first
    assert "past its quantum" in first and "event=checkpoint_notice" in first
    assert "state=PREEMPTED" in first and "event=requeued" in first
    assert f"event=resumable job={preempted[0]}" in first and "how=announced" in first
    mine = cluster.cli("hcontrol", "show", "events", str(b), user=OTHER_USER).stdout
    assert "reason=WaitingForCheckpoint" in mine and "event=started" in mine


def test_job_ignoring_the_signal_is_killed_after_grace_and_requeued(cluster):
    started = user_dir(cluster.workdir, TEST_USER) / "stubborn.started"
    stubborn = cluster.submit("--gpus-per-node=2", "--grace=2", "--wrap",
                              f"trap '' TERM; touch {started}; sleep 1000")
    cluster.wait_state(stubborn, "RUNNING")
    wait_for(started.exists, 30, what="the stubborn job's script to run")  # RUNNING is recorded a bit earlier
    cluster.cli("hcontrol", "preempt", str(stubborn), user="root")
    wait_for(lambda: len(cluster.job(stubborn)["runs"]) >= 2 and cluster.job(stubborn)["runs"][0]["end_time"],
             60, what="the stubborn job to be killed and started again")
    first = cluster.job(stubborn)["runs"][0]
    assert first["state"] == "PREEMPTED" and "killed" in first["reason"] and first["exit_signal"] == 9
    assert "preempted by administrator root" in first["reason"]
    cluster.cli("hcancel", str(stubborn))
    assert cluster.wait_state(stubborn, "CANCELLED", timeout=30)["state"] == "CANCELLED"


def test_no_requeue_job_is_never_preempted(cluster, ssh_nodes):
    pinned = cluster.submit("--gpus-per-node=2", "-N", "2", "--no-requeue", "--wrap", "sleep 1000")
    cluster.wait_state(pinned, "RUNNING")
    proc = cluster.cli("hcontrol", "preempt", str(pinned), user="root", check=False)
    assert proc.returncode != 0 and "never preempted" in proc.stderr
    proc = cluster.cli("hcontrol", "requeue", str(pinned), check=False)
    assert proc.returncode != 0 and "--no-requeue" in proc.stderr
    newcomer = cluster.submit("--gpus-per-node=2", "--wrap", "true", user=OTHER_USER)
    # Long past the pinned job's minimum run and below the newcomer's level, it still runs its first run.
    wait_for(lambda: cluster.job(pinned)["attained_now"] > 40, 30, what="the pinned job to sink")
    row = cluster.cli("hqueue", "-h", "-o", "%i %t %L %R", "-j", f"{pinned},{newcomer}").stdout.splitlines()
    nodes = compress(sorted(cluster.agents))  # hai-n[1-2], or haiK-n[1-2] beside another test run
    rows = [r.split() for r in row]
    assert [[r[0], r[1], r[3]] for r in rows] == [[str(pinned), "R", nodes], [str(newcomer), "PD", "(Resources)"]]
    assert int(rows[0][2]) > int(rows[1][2])  # the newcomer would preempt it if it could
    assert len(cluster.job(pinned)["runs"]) == 1
    cluster.cli("hcancel", str(pinned))
    assert cluster.wait_state(newcomer, "COMPLETED", timeout=30)["state"] == "COMPLETED"


def test_urgent_job_starts_within_the_grace_period(cluster):
    fresh = [cluster.submit("--gpus-per-node=2", "--grace=3", "--wrap", "sleep 1000") for _ in range(2)]
    for j in fresh:
        cluster.wait_state(j, "RUNNING")
    urgent = cluster.submit("--gpus-per-node=2", "--priority=urgent", "--wrap", "echo urgent", user=OTHER_USER)
    submitted = cluster.job(urgent)["submit_time"]
    done = cluster.wait_state(urgent, "COMPLETED", timeout=30)
    started = done["runs"][0]["start_time"]
    assert started - submitted < 3 + 10  # grace + a few scheduler ticks and a launch
    assert sum(cluster.job(j)["restart_count"] for j in fresh) == 1
    for j in fresh:
        cluster.cli("hcancel", str(j))
        cluster.wait_state(j, "CANCELLED", timeout=30)


def test_owner_requeues_others_may_not(cluster):
    j = cluster.submit("--gpus-per-node=1", "--wrap", "sleep 1000")
    cluster.wait_state(j, "RUNNING")
    proc = cluster.cli("hcontrol", "requeue", str(j), user=OTHER_USER, check=False)
    assert proc.returncode != 0 and "Access/permission denied" in proc.stderr
    cluster.cli("hcontrol", "requeue", str(j))
    wait_for(lambda: cluster.job(j)["restart_count"] == 1, 30, what="requeue")
    assert cluster.job(j)["runs"][0]["state"] == "REQUEUED"
    cluster.cli("hcancel", str(j))
    proc = cluster.cli("hcontrol", "preempt", str(j), check=False)
    assert proc.returncode != 0 and "only operators and administrators" in proc.stderr


def test_a_job_that_never_said_it_resumes_is_not_time_sliced_but_an_urgent_one_takes_it(cluster):
    legacy = cluster.submit("--gpus-per-node=2", "-N", "2", "-J", "legacy", "--wrap", "sleep 1000")
    try:
        cluster.wait_state(legacy, "RUNNING")
        newcomer = cluster.submit("--gpus-per-node=2", "--wrap", "true", user=OTHER_USER)
        # Long past its minimum run, levels below the newcomer, it keeps its GPUs: a preemption would lose its work
        wait_for(lambda: cluster.job(legacy)["attained_now"] > 30, 30, what="the legacy job to sink")
        assert cluster.job(newcomer)["state"] == "PENDING" and len(cluster.job(legacy)["runs"]) == 1
        assert "Preemptible=no " in cluster.cli("scontrol", "show", "job", str(legacy)).stdout
        assert cluster.cli("hqueue", "-h", "-j", str(legacy), "-o", "%i %Y").stdout.split() == [str(legacy), "no"]
        # An urgent job may take it, and the run's record says that its work was lost
        urgent = cluster.submit("--gpus-per-node=2", "-N", "2", "--priority=urgent", "--wrap", "true",
                                user=OTHER_USER)
        assert cluster.wait_state(urgent, "COMPLETED", timeout=60)["state"] == "COMPLETED"
        first = cluster.job(legacy)["runs"][0]
        assert first["state"] == "PREEMPTED"
        assert "its work is lost: the job did not say it can resume" in first["reason"]
        reason = cluster.cli("hacct", "-X", "-P", "-n", "-j", str(legacy), "-o", "State,Reason").stdout.splitlines()[0]
        assert reason.startswith("PREEMPTED|") and "its work is lost" in reason
    finally:
        cluster.cli("hcancel", str(legacy))
    assert cluster.wait_state(newcomer, "COMPLETED", timeout=60)["state"] == "COMPLETED"


def test_a_signal_job_that_requeues_itself_is_time_sliced_as_submitit_s_are(cluster):
    # submitit's contract: --signal=USR2@90, and on USR2 the job checkpoints and runs
    # `scontrol requeue` on itself, which here arrives while it is being preempted: harmless
    home = user_dir(cluster.workdir, TEST_USER)
    (home / "requeuer.sh").write_text(
        "#!/bin/bash\n#SBATCH --signal=USR2@90\n#SBATCH -o requeuer-%j.out\n"
        "trap 'scontrol requeue $SLURM_JOB_ID; echo \"requeue rc=$? run=$SLURM_RESTART_COUNT\"; exit 0' USR2\n"
        "echo \"start run=$SLURM_RESTART_COUNT\"\n"
        "if [ \"$SLURM_RESTART_COUNT\" -gt 0 ]; then exit 0; fi\n"
        "while :; do sleep 0.2; done\n")
    j = cluster.submit("--gpus-per-node=2", "-N", "2", "--grace=10", "requeuer.sh")
    cluster.wait_state(j, "RUNNING")
    assert "Preemptible=signal " in cluster.cli("scontrol", "show", "job", str(j)).stdout
    short = cluster.submit("--gpus-per-node=2", "--wrap", "true", user=OTHER_USER)
    assert cluster.wait_state(short, "COMPLETED", timeout=90)["state"] == "COMPLETED"
    assert cluster.wait_state(j, "COMPLETED", timeout=90)["state"] == "COMPLETED"
    runs = cluster.job(j)["runs"]
    assert [r["state"] for r in runs] == ["PREEMPTED", "COMPLETED"]
    assert "its work is lost" not in runs[0]["reason"]
    out = (home / f"requeuer-{j}.out").read_text().splitlines()  # bash also says its sleep died of USR2
    assert [line for line in out if "run=" in line] == ["start run=0", "requeue rc=0 run=0", "start run=1"]
