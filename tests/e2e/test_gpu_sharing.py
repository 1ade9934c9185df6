"""Fractional GPUs end to end: a controller and an agent (simulated NVML), the CLI as a user, and
the MPS control executable replaced by a script that records what it was asked (the faked edge)."""
from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from .harness import OTHER_USER, TEST_USER, start_local_cluster, user_dir, wait_for

pytestmark = pytest.mark.timeout(180)

FAKE_MPS = """#!/bin/sh
# Records each call (as which uid, for which card, with which arguments and input); with -d it
# "starts" the daemon by creating the control pipe, and `quit` on standard input removes it.
calls="$CUDA_MPS_LOG_DIRECTORY/calls"  # the log dir is the user's
if [ "$1" = "-d" ]; then
    echo "start uid=$(id -u) card=$CUDA_VISIBLE_DEVICES pipe=$CUDA_MPS_PIPE_DIRECTORY" >> "$calls"
    touch "$CUDA_MPS_PIPE_DIRECTORY/control"
else
    read cmd
    echo "$cmd uid=$(id -u) card=$CUDA_VISIBLE_DEVICES" >> "$calls"
    [ "$cmd" = quit ] && rm -f "$CUDA_MPS_PIPE_DIRECTORY/control"
fi
exit 0
"""


@pytest.fixture
def cluster():
    tool_dir = Path(tempfile.mkdtemp(prefix="hai-mps-", dir="/tmp"))  # the job's user runs the tool
    os.chmod(tool_dir, 0o755)
    fake = tool_dir / "nvidia-cuda-mps-control"
    fake.write_text(FAKE_MPS)
    fake.chmod(0o755)
    c = start_local_cluster(gpus=2, agent_toml=f'[sharing]\ngpus = [0]\nmps_control = "{fake}"\n')
    yield c
    c.close()
    shutil.rmtree(tool_dir)


def test_sharing_jobs_share_one_card_under_mps(cluster):
    # This machine has 2 CPUs, so two jobs (one CPU each) run at once: both share card 0.
    home = user_dir(cluster.workdir, TEST_USER)
    flag = home / "go"
    # Written aside and renamed: the test never reads a half-written file.
    job = (f"env > {home}/env.$HAI_JOB_ID.part && mv {home}/env.$HAI_JOB_ID.part {home}/env.$HAI_JOB_ID; "
           f"while [ ! -e {flag} ]; do sleep 0.1; done")
    quarter = cluster.submit("--gpus-per-node=0.25", "--wrap", job)
    best_effort = cluster.submit("--gpu-mem=8G", "--gpu-compute=30", "--gpu-qos=best-effort", "--wrap", job)
    envs = {}
    for j in (quarter, best_effort):
        cluster.wait_state(j, "RUNNING")
        path = home / f"env.{j}"
        wait_for(path.exists, 30, what=f"job {j}'s environment")
        envs[j] = dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    uid = pwd.getpwnam(TEST_USER).pw_uid
    mps_dir = cluster.workdir / "spool" / "mps" / f"gpu0-{uid}"
    pipe = str(mps_dir / "pipe")
    e = envs[quarter]
    assert e["CUDA_VISIBLE_DEVICES"] == "GPU-sim-local1-0" and e["CUDA_MPS_PIPE_DIRECTORY"] == pipe
    assert e["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert e["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M" and e["HAI_GPU_SHARE_MB"] == "20480"
    e = envs[best_effort]
    assert e["CUDA_VISIBLE_DEVICES"] == "GPU-sim-local1-0" and e["CUDA_MPS_PIPE_DIRECTORY"] == pipe
    assert e["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=8192M" and e["CUDA_MPS_CLIENT_PRIORITY"] == "1"
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in e  # best-effort: idle compute, no cap
    calls = (mps_dir / "log" / "calls").read_text().splitlines()
    assert calls == [f"start uid={uid} card=GPU-sim-local1-0 pipe={pipe}"]  # one daemon for the card

    rows = cluster.cli("hqueue", "-h", "-o", "%i %b").stdout.split("\n")
    shown = dict(r.split() for r in rows if r.strip())
    assert shown == {str(quarter): "gpu:0.25(20G)", str(best_effort): "gpu:8G,30%:best-effort"}
    # Telemetry maps the card's processes to runs: each job's own GPU memory (the simulated card
    # splits its 4 GiB of process memory between the two processes on it), against its share.
    def used():
        rows = cluster.cli("hqueue", "-h", "-o", "%i %G").stdout.split("\n")
        return dict(r.split() for r in rows if r.strip())
    wait_for(lambda: used() == {str(quarter): "2.0G/20.0G", str(best_effort): "2.0G/8.0G"}, 30,
             what="per-job GPU memory against the share")
    assert "TresPerNode=gres/gpu:0.25(20G)" in cluster.cli("hcontrol", "show", "job", str(quarter)).stdout
    node = cluster.cli("hcontrol", "show", "node").stdout
    assert "Isolation=mps SharedGpus=1" in node and "GresUsed=gpu:1 " in node  # one card, two shares
    assert "mps" in cluster.cli("hinfo", "-N").stdout.split("\n")[1].split()

    flag.touch()
    for j in (quarter, best_effort):
        assert cluster.wait_state(j, "COMPLETED", "FAILED")["state"] == "COMPLETED"
    wait_for(lambda: len((mps_dir / "log" / "calls").read_text().splitlines()) == 2, 30,
             what="the MPS daemon to be told to quit")
    assert (mps_dir / "log" / "calls").read_text().splitlines()[1] == f"quit uid={uid} card=GPU-sim-local1-0"

    whole = cluster.submit("--gpus-per-node=1", "--wrap", f"env > {home}/env.$HAI_JOB_ID")
    assert cluster.wait_state(whole, "COMPLETED", "FAILED")["state"] == "COMPLETED"
    env = (home / f"env.{whole}").read_text()
    assert "CUDA_VISIBLE_DEVICES=0\n" in env and "CUDA_MPS" not in env


def test_guaranteed_share_preempts_a_best_effort_one_which_resumes(cluster):
    # Card 0 (80 GiB) holds a best-effort job's 60 GiB; a guaranteed job asks for 40 GiB of it.
    repo = Path(__file__).resolve().parents[2]
    home = user_dir(cluster.workdir, TEST_USER)
    flag = home / "online-done"
    offline = cluster.submit("--gpu-mem=60G", "--gpu-qos=best-effort", "--grace=20", "-o", "offline-%j.out",
                             str(repo / "examples" / "train_loop.sh"), "400", "0.05", "10",
                             env={"HAI_EXAMPLES": str(repo / "examples")})
    cluster.wait_state(offline, "RUNNING")
    steps = home / ".hai" / "checkpoints" / str(offline) / "steps.log"
    wait_for(steps.exists, 30, what="the best-effort job's first steps")
    online = cluster.submit("--gpu-mem=40G", "--wrap", f"while [ ! -e {flag} ]; do sleep 0.1; done")
    cluster.wait_state(online, "RUNNING", timeout=60)
    job = cluster.job(offline)
    assert job["state"] == "PENDING" and job["restart_count"] == 1
    first = job["runs"][0]
    assert first["state"] == "PREEMPTED" and "exited within its grace period" in first["reason"]
    events = cluster.cli("hcontrol", "show", "events", str(offline), user="root").stdout
    assert f"for_job={online}" in events and "best-effort share of local1 GPU 0 goes to guaranteed job" in events
    flag.touch()
    assert cluster.wait_state(online, "COMPLETED", "FAILED")["state"] == "COMPLETED"
    assert cluster.wait_state(offline, "COMPLETED", "FAILED", timeout=120)["state"] == "COMPLETED"
    # The second run continued from the checkpoint: every step once, over two runs.
    text = steps.read_text().splitlines()
    flat = [int(line.split("step=")[1]) for line in text]
    assert flat == list(range(1, 401)) and {line.split()[0] for line in text} == {"run=0", "run=1"}


def test_bad_sharing_requests_submit_nothing(cluster):
    for args, text in ((["--gpus-per-node=1.5"], "a fraction of a GPU must be below 1"),
                       (["--gpu-compute=30"], "only for a share of a GPU"),
                       (["--gpu-mem=200G"], "shared GPU that can take gpu:200G")):
        proc = cluster.cli("hsubmit", *args, "--wrap", "true", check=False)
        assert proc.returncode != 0 and text in proc.stderr, proc.stderr
    assert cluster.call("jobs", {"all": True})["jobs"] == []


def test_sharing_jobs_get_mig_instances_by_uuid():
    c = start_local_cluster(gpus=1, agent_toml='[sharing]\ngpus = [0]\nmps_control = "/nonexistent/mps"\n',
                            gpus_toml='simulated_mig_layout = { 0 = ["3g.40gb", "2g.20gb"] }')
    try:
        home = user_dir(c.workdir, TEST_USER)
        flag = home / "go"
        # Written aside and renamed: the test never reads a half-written file.
        job = (f"env > {home}/env.$HAI_JOB_ID.part && mv {home}/env.$HAI_JOB_ID.part {home}/env.$HAI_JOB_ID; "
               f"while [ ! -e {flag} ]; do sleep 0.1; done")
        quarter = c.submit("--gpus-per-node=0.25", "--wrap", job)  # 20 GiB, 25 %: the 2g.20gb
        big = c.submit("--gpu-mem=30G", "--wrap", job)  # only the 3g.40gb holds 30 GiB
        third = c.submit("--gpu-mem=1G", "--wrap", job)  # both instances taken: waits
        envs = {}
        for j in (quarter, big):
            c.wait_state(j, "RUNNING")
            path = home / f"env.{j}"
            wait_for(path.exists, 30, what=f"job {j}'s environment")
            envs[j] = dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
        assert envs[quarter]["CUDA_VISIBLE_DEVICES"] == "MIG-sim-local1-0-1"
        assert envs[quarter]["HAI_GPU_ISOLATION"] == "mig" and envs[quarter]["HAI_GPU_SHARE_MB"] == "20480"
        assert envs[big]["CUDA_VISIBLE_DEVICES"] == "MIG-sim-local1-0-0"
        assert envs[big]["HAI_GPU_MIG_PROFILE"] == "3g.40gb"
        assert not any(k.startswith("CUDA_MPS") for e in envs.values() for k in e)  # no MPS under MIG
        assert c.call("jobs", {"ids": [third]})["jobs"][0]["state"] == "PENDING"
        assert "Isolation=mig" in c.cli("hcontrol", "show", "node").stdout
        flag.touch()
        for j in (quarter, big, third):
            assert c.wait_state(j, "COMPLETED", "FAILED")["state"] == "COMPLETED"
        # The third takes whichever instance freed first (both jobs end together): one by UUID.
        third_env = (home / f"env.{third}").read_text()
        assert any(f"CUDA_VISIBLE_DEVICES=MIG-sim-local1-0-{i}\n" in third_env for i in (0, 1)), third_env
    finally:
        c.close()


# ---- the MPS directories against a hostile user (issue 18, finding 1) ---------------------------

def _victim() -> Path:
    """A root-owned directory, the stand-in for /etc: nothing of a job's may ever own or write it."""
    d = Path(tempfile.mkdtemp(prefix="hai-victim-", dir="/tmp"))
    os.chmod(d, 0o755)
    return d


def test_a_job_cannot_make_root_chown_a_directory_through_the_mps_dirs(cluster):
    """Job A swaps its MPS log directory for a symlink to a root-owned directory (or renames it
    away); job B of the same user then gets the card's daemon. Before the fix, root's chown by
    path followed the link and gave the directory to the user."""
    victim = _victim()
    try:
        home = user_dir(cluster.workdir, TEST_USER)
        attack = (f'base=$(dirname "$CUDA_MPS_PIPE_DIRECTORY"); '
                  f'(rm -rf "$base/log" && ln -s {victim} "$base/log") 2>>{home}/attack.err; '
                  f'(mv "$base/pipe" "$base/pipe.old" && ln -s {victim} "$base/pipe") 2>>{home}/attack.err; '
                  f'ls -ld "$base" > {home}/base.txt')
        a = cluster.submit("--gpus-per-node=0.25", "--wrap", attack)
        assert cluster.wait_state(a, "COMPLETED", "FAILED")["state"] == "COMPLETED"
        b = cluster.submit("--gpus-per-node=0.25", f"--dependency=afterany:{a}", "--wrap",
                           f"touch {victim}/owned 2>/dev/null; echo b-ran > {home}/b.out")
        assert cluster.wait_state(b, "COMPLETED", "FAILED")["state"] == "COMPLETED"
        assert (home / "b.out").read_text() == "b-ran\n"
        st = victim.stat()
        assert (st.st_uid, st.st_gid) == (0, 0) and list(victim.iterdir()) == []
        assert "Permission denied" in (home / "attack.err").read_text()  # the user could not swap them
        assert (home / "base.txt").read_text().split()[2] == "root"
    finally:
        shutil.rmtree(victim)


def test_a_fifo_or_device_for_the_mps_pid_file_stalls_no_one(cluster):
    """The pid file is in the user's pipe directory. Made a FIFO (or a symlink to /dev/zero),
    root's read of it blocked (or never ended) in the idle-daemon cleanup, and every other
    user's finished jobs stayed RUNNING. Now root reads it non-blocking, as a regular file only."""
    home = user_dir(cluster.workdir, TEST_USER)
    for swap in ('mkfifo "$p"', 'ln -s /dev/zero "$p"'):
        a = cluster.submit("--gpus-per-node=0.25", "--wrap",
                           f'p="$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid"; rm -f "$p"; {swap}')
        assert cluster.wait_state(a, "COMPLETED", "FAILED")["state"] == "COMPLETED"
        # another user's jobs, started and ended after A's end ran the cleanup
        for _ in range(2):
            c = cluster.submit("--gpus-per-node=1", "--wrap", "true", user=OTHER_USER)
            assert cluster.wait_state(c, "COMPLETED", "FAILED", timeout=30)["state"] == "COMPLETED"
    # the owner's next sharing job still gets a daemon (a new one: the broken one is not trusted)
    b = cluster.submit("--gpus-per-node=0.25", "--wrap", f"echo ok > {home}/after.out")
    assert cluster.wait_state(b, "COMPLETED", "FAILED")["state"] == "COMPLETED"


STALLING_MPS = """#!/bin/sh
# As FAKE_MPS, but the quit of one user's daemon never returns (the user stopped the control
# program, which runs as them: SIGSTOP, or anything that keeps it from answering).
if [ "$1" = "-d" ]; then touch "$CUDA_MPS_PIPE_DIRECTORY/control"; exit 0; fi
[ "$(id -u)" = "$STALL_UID" ] && exec sleep 45.5
read cmd; [ "$cmd" = quit ] && rm -f "$CUDA_MPS_PIPE_DIRECTORY/control"
exit 0
"""


def test_a_stalled_mps_quit_of_one_user_holds_up_no_one_else():
    """The idle-daemon cleanup ran on the agent's spool watch, under one lock for every daemon:
    a user whose daemon's quit never answered held every other run's end (and every MPS start) for
    the control program's 30 s timeout. Now the cleanup is a task of its own, locks are per daemon."""
    tool_dir = Path(tempfile.mkdtemp(prefix="hai-mps-", dir="/tmp"))
    os.chmod(tool_dir, 0o755)
    tool = tool_dir / "nvidia-cuda-mps-control"
    tool.write_text(STALLING_MPS.replace("$STALL_UID", str(pwd.getpwnam(TEST_USER).pw_uid)))
    tool.chmod(0o755)
    c = start_local_cluster(gpus=2, agent_toml=f'[sharing]\ngpus = [0, 1]\nmps_control = "{tool}"\n')
    try:
        stalled = c.submit("--gpus-per-node=0.25", "--wrap", "true")  # its end starts the stalled quit
        assert c.wait_state(stalled, "COMPLETED", "FAILED")["state"] == "COMPLETED"
        wait_for(lambda: "sleep 45.5" in subprocess.run(["ps", "-u", TEST_USER, "-o", "args"], capture_output=True,
                                                         text=True).stdout, 20, what="the stalled quit")
        t = time.monotonic()
        for args in (["--gpus-per-node=1"], ["--gpus-per-node=0.25"]):  # an end, and an MPS start
            job = c.submit(*args, "--wrap", "true", user=OTHER_USER)
            assert c.wait_state(job, "COMPLETED", "FAILED", timeout=60)["state"] == "COMPLETED"
        assert time.monotonic() - t < 15, "another user's jobs waited for the stalled quit"
    finally:
        subprocess.run(["pkill", "-u", TEST_USER, "-f", "sleep 45.5"])
        c.close()
        shutil.rmtree(tool_dir)
