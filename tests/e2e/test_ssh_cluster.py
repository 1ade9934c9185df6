"""The walking cluster end to end: controller -> sshd (one per network namespace) -> agents,
driven through the CLI as an ordinary user."""
from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from .harness import OTHER_USER, TEST_USER, Cluster, start_ssh_cluster, user_dir, wait_for

GPUS_PER_NODE = 4


@pytest.fixture(scope="module")
def cluster(ssh_nodes):
    c = start_ssh_cluster(ssh_nodes, gpus_per_node=GPUS_PER_NODE)
    yield c
    c.close()


def write_script(cluster: Cluster, name: str, body: str, user: str = TEST_USER) -> Path:
    d = user_dir(cluster.workdir, user)
    path = d / name
    path.write_text(body)
    return path


def test_a_job_on_every_node_gets_its_ranks_gpus_and_master(cluster, ssh_nodes):
    script = write_script(cluster, "env.sh", """#!/bin/bash
#SBATCH -N 2
#HAI --gpus-per-node=2
#HAI --every-node
#SBATCH -o out-%j-%N.txt
echo "rank=$HAI_NODE_RANK host=$(hostname) master=$MASTER_ADDR:$MASTER_PORT"
echo "cvd=$CUDA_VISIBLE_DEVICES nodes=$HAI_NODELIST nn=$HAI_NNODES slurm=$SLURM_JOB_ID/$SLURM_PROCID"
echo "user=$(id -un) arg=$1"
echo "head=$(hcontrol show hostnames | head -n1) all=$(hcontrol show hostnames | tr '\\n' ' ')"
""")
    job_id = cluster.submit(str(script), "hello-arg")
    job = cluster.wait_state(job_id, "COMPLETED", "FAILED")
    assert job["state"] == "COMPLETED", job
    names = sorted(n.name for n in ssh_nodes)
    master = min(ssh_nodes, key=lambda n: n.name).address
    for rank, name in enumerate(names):
        text = (script.parent / f"out-{job_id}-{name}.txt").read_text()
        assert f"rank={rank} host={name} master={master}:" in text
        assert "cvd=0,1 " in text and f"nn=2 slurm={job_id}/{rank}" in text
        assert f"user={TEST_USER} arg=hello-arg" in text
        assert f"head={names[0]} all={' '.join(names)} \n" in text  # how scripts find their head node
    acct = cluster.cli("hacct", "-X", "-j", str(job_id), "-P", "-n", "-o", "JobID,State,ExitCode,AllocGPUS").stdout
    assert acct.splitlines() == [f"{job_id}|COMPLETED|0:0|4"]
    default = cluster.cli("hacct", "-X", "-j", str(job_id)).stdout.splitlines()
    assert default[0].split() == ["JobID", "JobName", "Partition", "Account", "AllocCPUS", "State", "ExitCode"]


def test_a_job_of_tasks_on_two_nodes_holds_their_cpus_and_gpus_and_says_so_as_sbatch_does(cluster, ssh_nodes):
    script = write_script(cluster, "tasks.sh", """#!/bin/bash
#SBATCH -N 2
#SBATCH --ntasks-per-node=2
#SBATCH --gpus-per-task=1
#SBATCH -o tasks-%j-%N.txt
env | grep -E '^SLURM_(NTASKS|NPROCS|TASKS_PER_NODE|NTASKS_PER_NODE|CPUS_ON_NODE|JOB_CPUS_PER_NODE|GPUS_PER_TASK|GPUS_ON_NODE)=' | sort
echo "cvd=$CUDA_VISIBLE_DEVICES"
sleep 2
""")
    job_id = cluster.submit(str(script))
    wait_for(lambda: cluster.job(job_id)["state"] == "RUNNING", 60, what="the job to start")
    show = cluster.cli("hcontrol", "show", "job", str(job_id)).stdout
    assert "NumNodes=2 NumCPUs=4 NumTasks=4 CPUsPerTask=1" in show
    assert cluster.cli("hqueue", "-h", "-o", "%C %D", "-j", str(job_id)).stdout.split() == ["4", "2"]
    job = cluster.wait_state(job_id, "COMPLETED", "FAILED")
    assert job["state"] == "COMPLETED", job
    first, second = sorted(n.name for n in ssh_nodes)
    assert not (script.parent / f"tasks-{job_id}-{second}.txt").exists()  # the script ran once, as sbatch's
    for name in (first,):
        lines = (script.parent / f"tasks-{job_id}-{name}.txt").read_text().splitlines()
        assert lines == ["SLURM_CPUS_ON_NODE=2", "SLURM_GPUS_ON_NODE=2", "SLURM_GPUS_PER_TASK=1",
                         "SLURM_JOB_CPUS_PER_NODE=2(x2)", "SLURM_NPROCS=4", "SLURM_NTASKS=4",
                         "SLURM_NTASKS_PER_NODE=2", "SLURM_TASKS_PER_NODE=2(x2)", "cvd=0,1"]
    acct = cluster.cli("hacct", "-X", "-j", str(job_id), "-P", "-n", "-o", "JobID,AllocCPUS,AllocGPUS").stdout
    assert acct.splitlines() == [f"{job_id}|4|4"]


def test_cancel_pending_and_running(cluster, ssh_nodes):
    pidfile = user_dir(cluster.workdir, TEST_USER) / "running.pid"
    script = write_script(cluster, "sleep.sh", f"#!/bin/bash\necho $$ > {pidfile}\nsleep 300 & wait\n")
    running = cluster.submit("-N", "2", f"--gpus-per-node={GPUS_PER_NODE}", str(script))
    cluster.wait_state(running, "RUNNING")
    pid = int(wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), 30, what="job pid"))
    pending = cluster.submit("--gpus-per-node=1", "--wrap", "true")
    job = cluster.wait_state(pending, "PENDING")
    wait_for(lambda: cluster.job(pending)["reason"] == "Resources", 10, what="reason Resources")
    queue = cluster.cli("hqueue").stdout
    assert "(Resources)" in queue and f"{running}" in queue
    # hcontrol show job says, node by node, what keeps it waiting (the fit test placement uses)
    shown = cluster.cli("hcontrol", "show", "job", str(pending)).stdout
    waiting = next(line.strip() for line in shown.splitlines() if line.strip().startswith("Waiting="))
    assert waiting == "Waiting=" + "; ".join(f"{n} has 0 of {GPUS_PER_NODE} GPUs free"
                                             for n in sorted(n.name for n in ssh_nodes))
    cluster.cli("hcancel", str(pending))
    assert cluster.job(pending)["state"] == "CANCELLED"
    cluster.cli("hcancel", str(running))
    job = cluster.wait_state(running, "CANCELLED", "FAILED", "COMPLETED")
    assert job["state"] == "CANCELLED"
    # The job's processes are gone (a shell on one of the nodes; both share this machine's pid space).
    wait_for(lambda: not os.path.exists(f"/proc/{pid}"), 15, what="job process to end")
    assert [r["state"] for r in job["runs"]] == ["CANCELLED"]


def test_gpus_are_never_shared(cluster):
    d = user_dir(cluster.workdir, TEST_USER)
    script = write_script(cluster, "gpus.sh", "#!/bin/bash\necho \"$(hostname) $CUDA_VISIBLE_DEVICES\"\nsleep 2\n")
    ids = [cluster.submit("--gpus-per-node=2", "-o", f"gpus-{i}.out", str(script)) for i in range(6)]
    for j in ids:
        assert cluster.wait_state(j, "COMPLETED", "FAILED")["state"] == "COMPLETED"
    # Runs that overlapped in time never held the same GPU on the same node.
    runs = {j: cluster.job(j)["runs"][0] for j in ids}
    used = {j: (d / f"gpus-{i}.out").read_text().split() for i, j in enumerate(ids)}
    for a in ids:
        for b in ids:
            if a < b and used[a][0] == used[b][0]:
                ra, rb = runs[a], runs[b]
                overlap = ra["start_time"] < rb["end_time"] and rb["start_time"] < ra["end_time"]
                if overlap:
                    assert not set(used[a][1].split(",")) & set(used[b][1].split(","))


def test_agent_restart_keeps_the_job(cluster, ssh_nodes):
    flag = user_dir(cluster.workdir, TEST_USER) / "go"
    script = write_script(cluster, "waitflag.sh", f"#!/bin/bash\nwhile [ ! -e {flag} ]; do sleep 0.2; done\necho finished\n")
    job_id = cluster.submit("-o", "agent-restart.out", str(script))
    job = cluster.wait_state(job_id, "RUNNING")
    node = job["nodelist"]
    agent = cluster.agents[node]
    agent.kill(signal.SIGKILL)
    flag.touch()  # the job finishes while its agent is dead
    wait_for(lambda: not any(n["responding"] for n in cluster.call("nodes", {})["nodes"] if n["name"] == node),
             30, what="node to be seen as not responding")
    agent.start()
    job = cluster.wait_state(job_id, "COMPLETED", "FAILED", timeout=90)
    assert job["state"] == "COMPLETED"
    assert "finished" in (user_dir(cluster.workdir, TEST_USER) / "agent-restart.out").read_text()
    flag.unlink()


def test_controller_restart_keeps_the_job(cluster):
    flag = user_dir(cluster.workdir, TEST_USER) / "go2"
    script = write_script(cluster, "waitflag2.sh", f"#!/bin/bash\nwhile [ ! -e {flag} ]; do sleep 0.2; done\n")
    job_id = cluster.submit(str(script))
    cluster.wait_state(job_id, "RUNNING")
    cluster.controller.kill(signal.SIGKILL)
    flag.touch()
    cluster.controller.start()
    cluster.wait_nodes(2)
    job = cluster.wait_state(job_id, "COMPLETED", "FAILED", timeout=90)
    assert job["state"] == "COMPLETED" and len(job["runs"]) == 1


@pytest.mark.parametrize("argv, message", [
    (["--gpus-per-node=abc", "--wrap", "true"], "gpus-per-node"),
    (["--gpus-per-node=9", "--wrap", "true"], "Requested node configuration is not available"),
    (["-N", "3", "--wrap", "true"], "Requested node configuration is not available"),
    (["--ntasks-per-node=500", "--wrap", "true"], "Requested node configuration is not available"),
    (["-N", "2", "-n", "3", "--wrap", "true"], "3 tasks cannot be spread evenly over 2 nodes"),
    (["--frobnicate", "--wrap", "true"], "frobnicate"),
    (["-p", "nosuch", "--wrap", "true"], "invalid partition"),
])
def test_bad_submissions_change_nothing(cluster, argv, message):
    before = len(cluster.call("jobs", {"all": True})["jobs"])
    proc = cluster.cli("hsubmit", *argv, check=False)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr
    assert len(cluster.call("jobs", {"all": True})["jobs"]) == before


def test_unknown_directive_names_the_line(cluster):
    script = write_script(cluster, "bad.sh", "#!/bin/bash\n#SBATCH -J ok\n#SBATCH --bogus-option=1\ntrue\n")
    proc = cluster.cli("hsubmit", str(script), check=False)
    assert proc.returncode != 0 and "line 3" in proc.stderr and "bogus-option" in proc.stderr


def test_cancel_errors(cluster):
    proc = cluster.cli("hcancel", "999999", check=False)
    assert proc.returncode != 0 and "Invalid job id specified: 999999" in proc.stderr
    theirs = cluster.submit("--hold", "--wrap", "true", user=OTHER_USER)
    proc = cluster.cli("hcancel", str(theirs), check=False)
    assert proc.returncode != 0 and "Access/permission denied" in proc.stderr
    assert cluster.job(theirs)["state"] == "PENDING"
    cluster.cli("hcancel", str(theirs), user=OTHER_USER)
    assert cluster.job(theirs)["state"] == "CANCELLED"
    proc = cluster.cli("hcontrol", "show", "job", "424242", check=False)
    assert proc.returncode != 0 and "Invalid job id" in proc.stderr


def test_hinfo_and_hqueue_formats(cluster):
    info = cluster.cli("hinfo").stdout.splitlines()
    assert info[0].split() == ["PARTITION", "AVAIL", "TIMELIMIT", "NODES", "STATE", "GPUS(A/T)", "NODELIST"]
    assert info[1].split()[:3] == ["gpu*", "up", "UNLIMITED"]  # the default partition is marked
    nodes = cluster.cli("hinfo", "-N", "-h").stdout.splitlines()
    assert len(nodes) == 2 and all("/4" in line for line in nodes)
    header = cluster.cli("hqueue").stdout.splitlines()[0].split()
    assert header == ["JOBID", "PARTITION", "NAME", "USER", "ST", "TIME", "NODES", "LEVEL", "NODELIST(REASON)"]
    held = cluster.submit("--hold", "-J", "heldjob", "--wrap", "true")
    row = [line for line in cluster.cli("hqueue", "-h").stdout.splitlines() if line.split()[0] == str(held)]
    assert row and row[0].split()[2:5] == ["heldjob", TEST_USER, "PD"] and row[0].endswith("(JobHeldUser)")
    out = cluster.cli("hqueue", "-h", "-o", "%i %T %r", "-j", str(held)).stdout.split()
    assert out == [str(held), "PENDING", "JobHeldUser"]
    cluster.cli("hcancel", str(held))


def test_wait_returns_the_exit_code_and_test_only_submits_nothing(cluster):
    proc = cluster.cli("hsubmit", "-W", "--wrap", "exit 7", check=False)
    assert proc.returncode == 7 and proc.stdout.startswith("Submitted batch job ")
    assert cluster.cli("hsubmit", "--wait", "--parsable", "--wrap", "true").returncode == 0
    before = len(cluster.call("jobs", {"all": True})["jobs"])
    proc = cluster.cli("hsubmit", "--test-only", "--gpus-per-node=2", "--wrap", "true")
    assert "Job would start now on nodes " in proc.stderr and "partition gpu" in proc.stderr
    assert proc.stderr.split("on nodes ")[1].split()[0] in cluster.agents
    # the probe is the job as it would be stored: its begin time and dependency count
    proc = cluster.cli("hsubmit", "--test-only", "--begin=now+3600", "--wrap", "true")
    assert "Job would wait in partition gpu: BeginTime" in proc.stderr
    blocker = cluster.submit("-N", "2", f"--gpus-per-node={GPUS_PER_NODE}", "--wrap", "sleep 1000")
    cluster.wait_state(blocker, "RUNNING")
    proc = cluster.cli("hsubmit", "--test-only", f"--dependency=afterok:{blocker}", "--wrap", "true")
    assert "Job would wait in partition gpu: Dependency" in proc.stderr
    proc = cluster.cli("hsubmit", "--test-only", "--gpus-per-node=1", "--wrap", "true")
    assert "Job would wait in partition gpu: Resources" in proc.stderr
    assert len(cluster.call("jobs", {"all": True})["jobs"]) == before + 1  # only the blocker
    cluster.cli("hcancel", str(blocker))
    cluster.wait_state(blocker, "CANCELLED")


def test_begin_time_holds_a_job_until_then(cluster):
    job = cluster.submit("--begin=now+4", "--wrap", "true")
    assert cluster.job(job)["state"] == "PENDING"
    wait_for(lambda: cluster.job(job)["reason"] == "BeginTime", 10, what="reason BeginTime")
    done = cluster.wait_state(job, "COMPLETED", timeout=60)
    assert done["runs"][0]["start_time"] >= done["begin_time"]
    proc = cluster.cli("hsubmit", "--begin=whenever", "--wrap", "true", check=False)
    assert proc.returncode != 0 and "--begin=whenever" in proc.stderr
