"""Interactive work as a user at a terminal does it: salloc, srun outside a job, srun --pty. The
nodes are behind sshd in network namespaces, and the client (salloc, srun) runs here with no
agent of its own: everything it sees comes through the controller. Expected words and codes are
Slurm 22.05's, from the same commands on the Slurm peer (../shared/peers/slurm)."""
from __future__ import annotations

import os
import pwd
import re
import signal
import subprocess
import time

import pytest

from .harness import BIN, TEST_USER, start_ssh_cluster, user_dir, user_processes, wait_for
from .terminal import Terminal


@pytest.fixture(scope="module")
def cluster(ssh_nodes):
    c = start_ssh_cluster(ssh_nodes, gpus_per_node=2)
    yield c
    c.close()


@pytest.fixture(scope="module")
def names(ssh_nodes):
    return sorted(n.name for n in ssh_nodes)




@pytest.fixture(autouse=True)
def nothing_left(cluster):
    """Every test ends with no job running and no process of the test user left, on any node (the
    nodes' namespaces share this machine's process table), of this cluster (other test workers
    run their own at the same time)."""
    yield
    cluster.cancel_left()
    wait_for(lambda: not user_processes(TEST_USER, cluster.workdir), 30,
             what=f"no process of {TEST_USER} left: {user_processes(TEST_USER, cluster.workdir)}")


def env_of(cluster, **extra) -> dict:
    pw = pwd.getpwnam(TEST_USER)
    return {"PATH": f"{BIN}:/usr/bin:/bin", "HOME": pw.pw_dir, "USER": TEST_USER, "LANG": "C.UTF-8",
            "TERM": "xterm", "SHELL": "/bin/bash", "HAI_CONTROLLER": cluster.socket, **extra}


def acct(cluster, job_id: int) -> list[list[str]]:
    out = cluster.cli("hacct", "-j", str(job_id), "-P", "-n", "-o", "JobID,JobName,State,ExitCode,NodeList").stdout
    return [line.split("|") for line in out.splitlines()]


def idle(cluster) -> None:
    """The last allocation has let go of its nodes (its release ends it a moment after srun exits):
    the next one starts at once, with no "queued" line."""
    wait_for(lambda: not cluster.call("jobs", {"states": ["RUNNING", "COMPLETING"]})["jobs"], 30,
             what="the nodes to be free")


def job_of(stderr: str, word: str = "Granted job allocation") -> int:
    return int(re.search(rf"{word} (\d+)", stderr).group(1))


def test_salloc_runs_its_command_with_the_allocations_variables_and_sruns_start_steps_there(cluster, names):
    a, b = names
    d = user_dir(cluster.workdir, TEST_USER)
    (d / "alloc.sh").write_text("""#!/bin/bash
echo "job=$SLURM_JOB_ID/$SLURM_JOBID name=$SLURM_JOB_NAME nodes=$SLURM_JOB_NODELIST nn=$SLURM_NNODES \
nt=$SLURM_NTASKS tpn=$SLURM_TASKS_PER_NODE host=$SLURM_SUBMIT_HOST node=${SLURMD_NODENAME:-none}"
srun bash -c 'echo "task $SLURM_PROCID on $(hostname) step $SLURM_STEP_ID job $SLURM_JOB_ID"' | sort
echo "rc1=$?"
srun -n 2 -l bash -c 'exit $SLURM_PROCID'
echo "rc2=$?"
exit 3
""")
    os.chmod(d / "alloc.sh", 0o755)
    proc = cluster.cli("salloc", "-N", "2", "-n", "4", str(d / "alloc.sh"), check=False)
    assert proc.returncode == 3, proc.stderr
    job = job_of(proc.stderr)
    err = proc.stderr.splitlines()
    assert err[0] == f"salloc: Granted job allocation {job}", err
    assert err[-1] == f"salloc: Relinquishing job allocation {job}", err
    assert f"srun: error: {b}: task 1: Exited with exit code 1" in err  # -n 2 on two nodes: one each
    nl = cluster.cli("hcontrol", "show", "hostlist", f"{a},{b}").stdout.strip()
    lines = proc.stdout.splitlines()
    assert lines[0] == (f"job={job}/{job} name=interactive nodes={nl} nn=2 nt=4 tpn=2(x2) host={os.uname().nodename} "
                        f"node=none")
    assert lines[1:5] == [f"task {t} on {node} step 0 job {job}" for t, node in enumerate([a, a, b, b])]
    assert lines[5:] == ["rc1=0", "rc2=1"]
    wait_for(lambda: acct(cluster, job)[0][2] != "RUNNING", 30, what="the allocation to end")
    assert acct(cluster, job) == [  # no batch step: an allocation runs no script
        [str(job), "interactive", "FAILED", "3:0", nl],
        [f"{job}.0", "bash", "COMPLETED", "0:0", nl],
        [f"{job}.1", "bash", "FAILED", "1:0", nl]]


def test_srun_outside_a_job_gets_an_allocation_runs_its_step_and_ends_it(cluster, names):
    a, b = names
    proc = cluster.cli("srun", "-N2", "-n4", "-l", "hostname", check=False)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert sorted(proc.stdout.splitlines()) == [f"0: {a}", f"1: {a}", f"2: {b}", f"3: {b}"]
    idle(cluster)
    proc = cluster.cli("srun", "-N", "2", "bash", "-c", "echo $SLURM_JOB_NAME $SLURM_NNODES; exit $((SLURM_PROCID + 3))",
                       check=False)
    assert proc.returncode == 4
    assert proc.stdout.splitlines() == ["bash 2", "bash 2"]
    assert proc.stderr.splitlines() == [f"srun: error: {a}: task 0: Exited with exit code 3",
                                        f"srun: error: {b}: task 1: Exited with exit code 4"]
    job = max(int(j["id"]) for j in cluster.call("jobs", {"all": True})["jobs"])
    wait_for(lambda: cluster.job(job)["state"] != "RUNNING", 30, what="srun's job to end")
    assert acct(cluster, job)[0][1:4] == ["bash", "FAILED", "4:0"]
    assert acct(cluster, job)[1][1:4] == ["bash", "FAILED", "4:0"]
    # a refused allocation is said as Slurm's srun says it
    proc = cluster.cli("srun", "-N", "3", "true", check=False)
    assert proc.returncode == 1 and proc.stderr.startswith("srun: error: Job submit/allocate failed: "), proc.stderr


def test_stdin_reaches_the_tasks_on_every_node(cluster, names):
    a, b = names
    proc = cluster.cli("srun", "-N2", "-n2", "bash", "-c", 'read x; echo "$SLURM_PROCID got $x"', input="hello\n",
                       check=False)
    assert proc.returncode == 0 and sorted(proc.stdout.splitlines()) == ["0 got hello", "1 got hello"]
    proc = cluster.cli("srun", "-N2", "-n2", "-i", "1", "bash", "-c", 'read x; echo "$SLURM_PROCID got $x"',
                       input="only\n", check=False)
    assert sorted(proc.stdout.splitlines()) == ["0 got ", "1 got only"], proc.stderr
    big = "".join(f"line {i:07d}\n" for i in range(200_000))  # 2.6 MB, many chunks, to the other node
    proc = cluster.cli("srun", "-w", b, "sha256sum", input=big, check=False)
    import hashlib
    assert proc.stdout.split()[0] == hashlib.sha256(big.encode()).hexdigest(), proc.stderr


def test_srun_pty_is_a_real_terminal_on_the_node(cluster, names):
    a, b = names
    d = user_dir(cluster.workdir, TEST_USER)
    t = Terminal([str(BIN / "srun"), "-w", b, "--pty", "bash", "--norc", "--noprofile"], user=TEST_USER,
                 env=env_of(cluster, PS1="P$ "), cwd=str(d), rows=24, cols=80)
    try:
        before = t.attrs()
        t.expect(r"P\$ ")
        t.send("tty; hostname; stty size\r")
        t.expect(rf"/dev/pts/\d+\r\n{b}\r\n24 80\r\n")
        t.resize(30, 100)  # the window changes: the remote terminal follows (SIGWINCH to srun)
        wait_for(lambda: (t.send("stty size\r"), t.expect(r"(\d+ \d+)\r\n"))[1].group(1) == b"30 100", 10,
                 interval=0.3, what="the new window size on the node")
        (d / "vimtest.txt").unlink(missing_ok=True)
        t.send("vim -u NONE -N -n vimtest.txt\r")  # full screen: the alternate screen, keys one by one
        t.expect(r'"vimtest.txt" \[New\]')
        t.send("ihello from vim\x1b:wq\r")
        t.expect(r"P\$ ")
        t.send("cat vimtest.txt\r")
        t.expect(r"hello from vim\r\n")
        t.send("sleep 60; echo after\r")
        time.sleep(1)
        t.send("\x03")  # Ctrl-C: the foreground process, not the shell
        t.expect(r"\^C")
        t.send("echo rc=$?\r")
        t.expect(r"rc=130\r\n")
        t.send("sleep 60\r")
        time.sleep(1)
        t.send("\x1a")  # Ctrl-Z: job control
        t.expect(r"Stopped\s+sleep 60")
        t.send("fg\r")
        time.sleep(0.5)
        t.send("\x03")
        t.send("exit 4\r")  # Ctrl-D's effect with an exit code
        assert t.wait(30) == 4
        t.expect(rf"srun: error: {b}: task 0: Exited with exit code 4")
        assert t.attrs() == before  # the terminal as it was
    finally:
        t.close()


def test_salloc_in_a_terminal_gives_a_shell_whose_srun_works_and_exit_relinquishes(cluster, names):
    a, b = names
    d = user_dir(cluster.workdir, TEST_USER)
    t = Terminal([str(BIN / "salloc"), "-N", "2"], user=TEST_USER, env=env_of(cluster, PS1="S$ "), cwd=str(d))
    try:
        m = t.expect(r"salloc: Granted job allocation (\d+)")
        job = int(m.group(1))
        t.send("PS1='S$ '; echo id=$SLURM_JOB_ID\r")
        t.expect(rf"id={job}\r\n")
        t.send("srun hostname | sort\r")
        t.expect(rf"{a}\r\n{b}\r\n")
        t.send("exit 7\r")
        t.expect(rf"salloc: Relinquishing job allocation {job}")
        assert t.wait(30) == 7
    finally:
        t.close()
    assert cluster.wait_state(job, "FAILED", "COMPLETED")["exit_code"] == 7


def test_scancel_revokes_a_salloc_and_its_steps(cluster, names):
    d = user_dir(cluster.workdir, TEST_USER)
    marker = d / "revoked-task.pid"
    marker.unlink(missing_ok=True)
    script = (f"trap 'echo got-TERM; exit 6' TERM; srun -N2 bash -c 'echo $$ > {marker}.$SLURM_PROCID; exec sleep 300' & "
              f"wait")
    pw = pwd.getpwnam(TEST_USER)
    proc = subprocess.Popen([str(BIN / "salloc"), "-K", "-N", "2", "bash", "-c", script], user=pw.pw_uid,
                            group=pw.pw_gid, extra_groups=[], env=env_of(cluster), cwd=str(d),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        pids = wait_for(lambda: all(os.path.exists(f"{marker}.{i}") and open(f"{marker}.{i}").read().strip()
                                    for i in (0, 1)) and [int(open(f"{marker}.{i}").read()) for i in (0, 1)],
                        60, what="the step's tasks")
        job = int(cluster.call("jobs", {})["jobs"][0]["id"])
        cluster.cli("scancel", str(job))
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert f"salloc: Job allocation {job} has been revoked." in err.splitlines(), err
    assert "got-TERM" in out and proc.returncode == 6, (out, err)
    wait_for(lambda: not any(os.path.exists(f"/proc/{p}") for p in pids), 30, what="the tasks to end")
    assert cluster.wait_state(job, "CANCELLED", "COMPLETED", "FAILED")["state"] == "CANCELLED"


def test_salloc_no_shell_immediate_and_a_time_limit(cluster, names):
    proc = cluster.cli("salloc", "--no-shell", "-N", "2", "--exclusive", "-t", "1", check=False)
    assert proc.returncode == 0
    held = job_of(proc.stderr)
    assert cluster.job(held)["state"] == "RUNNING"
    # the allocation outlives salloc; srun --jobid reaches it from outside
    proc = cluster.cli("srun", f"--jobid={held}", "-N", "1", "echo", "reached", check=False)
    assert proc.stdout == "reached\n", proc.stderr
    proc = cluster.cli("salloc", "--immediate", "-N", "1", "true", check=False)
    assert proc.returncode == 1
    assert proc.stderr == ("salloc: error: Unable to allocate resources: Immediate execution impossible, "
                           "insufficient priority\n")
    proc = cluster.cli("salloc", "--immediate=2", "-N", "1", "true", check=False)
    assert proc.returncode == 1
    waited = job_of(proc.stderr, "Pending job allocation")
    assert proc.stderr.splitlines()[1:] == [f"salloc: job {waited} queued and waiting for resources",
                                            "salloc: error: Unable to allocate resources: Connection timed out"]
    assert cluster.wait_state(waited, "CANCELLED")
    shown = cluster.cli("scontrol", "show", "job", str(held)).stdout
    assert "BatchFlag=0" in shown and "Class=interactive" in shown and "Preemptible=never" in shown
    assert "CLASS" in cluster.cli("hqueue", "-l").stdout.splitlines()[0]
    assert " interactive " in cluster.cli("hqueue", "-l", "-h").stdout
    cluster.cli("scancel", str(held))
    cluster.wait_state(held, "CANCELLED")
    # a salloc whose allocation reaches its time limit is told so, as Slurm's says it
    proc = cluster.cli("salloc", "-N", "1", "-t", "0:03", "bash", "-c", "sleep 8; echo after", check=False)
    job = job_of(proc.stderr)
    assert f"salloc: Job {job} has exceeded its time limit and its allocation has been revoked." in proc.stderr
    assert proc.stdout == "after\n" and proc.returncode == 0  # without -K the command is only told


def test_a_terminal_session_goes_on_through_an_agent_restart(cluster, names):
    """The node's agent restarts under a running `srun --pty`: the step server and its terminal
    stay, and once the link is back what is typed and shown flows again."""
    a, b = names
    d = user_dir(cluster.workdir, TEST_USER)
    t = Terminal([str(BIN / "srun"), "-w", b, "--pty", "bash", "--norc", "--noprofile"], user=TEST_USER,
                 env=env_of(cluster, PS1="R$ "), cwd=str(d))
    try:
        t.expect(r"R\$ ")
        t.send("echo one-$((40 + 2))\r")
        t.expect(r"one-42\r\n")
        agent = cluster.agents[b]
        agent.kill()
        agent.start()
        cluster.wait_nodes(2)

        def echoed():
            t.send("echo two-$((40 + 2))\r")
            try:
                return t.expect(r"two-42\r\n", timeout=2)
            except AssertionError:
                return None
        wait_for(echoed, 60, interval=0.5, what="the session to answer after the agent's restart")
        t.send("exit 0\r")
        assert t.wait(30) == 0
    finally:
        t.close()


def test_a_terminal_session_goes_on_through_a_controller_restart(cluster, names):
    """The controller is killed under a running `srun --pty` and started again: srun connects
    again and takes its step back; what the task printed meanwhile waited; the job still ends
    with the session."""
    a, b = names
    d = user_dir(cluster.workdir, TEST_USER)
    t = Terminal([str(BIN / "srun"), "-w", b, "--pty", "bash", "--norc", "--noprofile"], user=TEST_USER,
                 env=env_of(cluster, PS1="C$ "), cwd=str(d))
    try:
        t.expect(r"C\$ ")
        job = int(cluster.call("jobs", {})["jobs"][0]["id"])
        t.send("sleep 2; echo late-$((40 + 2))\r")  # printed while the controller is away
        cluster.controller.kill(signal.SIGKILL)
        cluster.controller.start()
        cluster.wait_nodes(2)
        t.expect(r"late-42\r\n", timeout=60)
        t.send("echo back-$((40 + 2))\r")
        t.expect(r"back-42\r\n", timeout=30)
        t.send("exit 3\r")
        assert t.wait(60) == 3
    finally:
        t.close()
    assert cluster.wait_state(job, "FAILED", "COMPLETED", "CANCELLED")["exit_code"] == 3
