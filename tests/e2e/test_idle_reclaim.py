"""Idle reclamation end to end: agents behind sshd with simulated GPUs whose utilization the test
sets per job (gpus.simulated_util_file, read through the sampler's NVML calls), a controller with
short windows. An idle salloc session is warned on its terminal, in its control directory and in
its events, its warning is lifted when it gets busy, and it is cancelled after the grace; a busy
job is left alone; a batch job is untouched by default; a QOS that asks for it requeues."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from .harness import BIN, TEST_USER, start_ssh_cluster, user_dir, user_processes, wait_for
from .terminal import Terminal
from .test_interactive import env_of

WINDOW, GRACE = 3, 15  # seconds of idle samples (agents sample every 0.5 s)


@pytest.fixture(scope="module")
def knobs(tmp_path_factory) -> Path:
    """The simulated GPUs' utilization per job (the file) and a recording mail program."""
    d = tmp_path_factory.mktemp("idle")
    (d / "util").write_text("")
    prog = d / "record-mail"
    prog.write_text(f'#!/bin/sh\nprintf "%s|%s|%s\\n" "$2" "$SLURM_JOB_ID" "$SLURM_JOB_MAIL_TYPE" >> {d}/mails\n')
    prog.chmod(0o755)
    return d


@pytest.fixture(scope="module")
def cluster(ssh_nodes, knobs):
    controller = (f'mail_program = "{knobs / "record-mail"}"\n'
                  f'[idle]\nthreshold = 10\nwindow = {WINDOW}\ngrace = {GRACE}\n'
                  f'[[qos]]\nname = "reclaimed"\nidle_reclaim = true\nidle_action = "requeue"\n')
    agent = f'simulated_util_file = "{knobs / "util"}"\n[telemetry]\ninterval = 0.5\n'
    c = start_ssh_cluster(ssh_nodes, gpus_per_node=2, agent_toml=agent, controller_toml=controller)
    yield c
    c.close()


@pytest.fixture(autouse=True)
def nothing_left(cluster):
    """Each test ends with no job running and no process of the test user left (of this cluster:
    other test processes may share the machine and the user)."""
    yield
    cluster.cancel_left()
    wait_for(lambda: not user_processes(TEST_USER, cluster.workdir), 30,
             what=f"no process of {TEST_USER} left: {user_processes(TEST_USER, cluster.workdir)}")


def set_util(knobs: Path, job: int, util: int) -> None:
    with open(knobs / "util", "a") as f:
        f.write(f"{job} {util}\n")


def events(cluster, job: int) -> list[dict]:
    return cluster.call("events", {"job_id": job})["events"]


def kinds(cluster, job: int) -> list[str]:
    return [e["kind"] for e in events(cluster, job)]


def show(cluster, job: int) -> str:
    return cluster.cli("hcontrol", "show", "job", str(job)).stdout


def notice_path(cluster, job: int, node: str, attempt: int = 0) -> Path:
    return cluster.workdir / node / "spool" / "runs" / f"{job}.{attempt}" / "control" / "idle"


def test_idle_session_is_warned_lifted_when_busy_and_ended_after_its_grace(cluster, knobs):
    d = user_dir(cluster.workdir, TEST_USER)
    t = Terminal([str(BIN / "salloc"), "--gpus-per-node=1"], user=TEST_USER, env=env_of(cluster, PS1="I$ "),
                 cwd=str(d))
    try:
        job = int(t.expect(r"salloc: Granted job allocation (\d+)").group(1))
        node = cluster.job(job)["nodelist"]
        # busy (the simulated GPU reports 90 %): its clock stays at zero, the window shows
        wait_for(lambda: "IdleFor=00:00:00 IdleLimit=00:00:03" in show(cluster, job), 60, 0.5,
                 "show job's idle clock of a busy interactive job")
        set_util(knobs, job, 2)

        def clock():
            out = cluster.cli("hqueue", "-h", "-j", str(job), "-o", "%i %W").stdout.split()
            return out[1] if out and re.fullmatch(r"0:\d\d/0:03", out[1]) and out[1] != "0:00/0:03" else None
        wait_for(clock, 60, 0.3, "hqueue %W to show the idle clock running")
        t.expect(rf"salloc: job {job}: its GPUs have been under 10% utilization for 00:00:\d\d; it will be "
                 rf"cancelled after 00:00:15 more unless they get busy", timeout=60)
        assert "idle_warning" in kinds(cluster, job)
        path = wait_for(lambda: notice_path(cluster, job, node).exists() and notice_path(cluster, job, node), 30, 0.1,
                        "the idle notice in the job's control dir")
        notice = json.loads(path.read_text())
        assert (notice["action"], notice["threshold"], notice["grace"]) == ("cancel", 10, GRACE)
        assert notice["message"].startswith(f"job {job}: its GPUs have been under 10%")
        assert oct(path.stat().st_mode & 0o777) == "0o644"
        # busy again within the grace: the warning is lifted, the notice goes
        set_util(knobs, job, 95)
        t.expect(rf"salloc: job {job}: its GPUs are busy again; the idle warning is lifted", timeout=60)
        wait_for(lambda: not notice_path(cluster, job, node).exists(), 30, 0.2, "the idle notice to be taken away")
        assert "idle_cleared" in kinds(cluster, job)
        # idle for good: warned anew, then ended after the grace
        set_util(knobs, job, 0)
        t.expect(rf"salloc: job {job}: its GPUs have been under 10%", timeout=60)
        t.expect(rf"salloc: job {job}: IdleReclaimed: GPUs under 10% for 00:00:\d\d; cancelled", timeout=60)
        t.expect(rf"salloc: Job allocation {job} has been revoked", timeout=60)
        t.send("exit\r")
        t.wait(30)
    finally:
        t.close()
    ended = cluster.wait_state(job, "CANCELLED")
    assert ended["reason"].startswith("IdleReclaimed: GPUs under 10% for "), ended["reason"]
    assert ended["runs"][0]["reason"].startswith("IdleReclaimed"), ended["runs"]
    seen = kinds(cluster, job)
    assert seen.count("idle_warning") == 2 and "idle_reclaimed" in seen and "cancel_requested" in seen, seen
    assert "reclamation" in next(e for e in events(cluster, job) if e["kind"] == "cancel_requested")["detail"]["by"]


def test_batch_jobs_busy_one_untouched_default_one_untouched_and_a_qos_requeues(cluster, knobs):
    d = user_dir(cluster.workdir, TEST_USER)
    script = d / "hold.sh"
    script.write_text("#!/bin/bash\nsleep 600\n")
    busy = cluster.submit("--gpus-per-node=1", "--qos=reclaimed", str(script))
    default = cluster.submit("--gpus-per-node=1", str(script))
    idle = cluster.submit("--gpus-per-node=1", "--qos=reclaimed", "--mail-type=IDLE", str(script))
    set_util(knobs, default, 0)
    set_util(knobs, idle, 0)
    for job in (busy, default, idle):
        cluster.wait_state(job, "RUNNING")
    # the idle job of the reclaiming QOS: warned, then requeued (it may be requeued: sbatch's default)
    wait_for(lambda: "requeue_requested" in kinds(cluster, idle), 120, 0.5, "the idle batch job to be requeued")
    job = wait_for(lambda: (j := cluster.job(idle))["restart_count"] >= 1 and j, 60, 0.5, "its requeue")
    first = job["runs"][0]
    assert first["state"] == "REQUEUED" and first["reason"].startswith("IdleReclaimed: GPUs under 10%"), first
    assert {"idle_warning", "idle_reclaimed"} <= set(kinds(cluster, idle))
    mails = wait_for(lambda: (knobs / "mails").exists() and (knobs / "mails").read_text(), 30, 0.2, "the IDLE mail")
    assert f"Slurm Job_id={idle} Name=hold.sh GPUs idle, to be reclaimed" in mails, mails
    # meanwhile, the busy one (same QOS) and the idle one of the default QOS (batch: off) ran on
    for job in (busy, default):
        assert cluster.job(job)["state"] == "RUNNING"
        assert not {"idle_warning", "idle_reclaimed"} & set(kinds(cluster, job)), kinds(cluster, job)
    assert "IdleFor=00:00:00 IdleLimit=00:00:03" in show(cluster, busy)
    assert "IdleFor=N/A IdleLimit=NONE" in show(cluster, default)
    rows = dict(line.split() for line in cluster.cli("hqueue", "-h", "-o", "%i %W").stdout.splitlines())
    assert rows[str(default)] == "-" and rows[str(busy)] == "0:00/0:03", rows
    cluster.cancel_left()


def test_a_restarted_controller_goes_on_with_the_warned_jobs_clock(cluster, knobs):
    """The clock and its warning are in the store: after a restart the job is not warned afresh
    (a new window and grace), it is requeued once its grace has run out."""
    d = user_dir(cluster.workdir, TEST_USER)
    script = d / "hold.sh"
    script.write_text("#!/bin/bash\nsleep 600\n")
    job = cluster.submit("--gpus-per-node=1", "--qos=reclaimed", str(script))
    set_util(knobs, job, 0)
    cluster.wait_state(job, "RUNNING")
    wait_for(lambda: "idle_warning" in kinds(cluster, job), 120, 0.5, "the idle warning")
    cluster.controller.stop()
    cluster.controller.start()
    cluster.wait_nodes(len(cluster.agents))
    wait_for(lambda: "requeue_requested" in kinds(cluster, job), 120, 0.5, "the requeue after the restart")
    seen = kinds(cluster, job)
    assert seen.count("idle_warning") == 1, seen
    assert seen.index("idle_warning") < seen.index("requeue_requested") < seen.index("idle_reclaimed"), seen
