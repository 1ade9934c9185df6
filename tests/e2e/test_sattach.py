"""sattach as a user at the submit host uses it: attach to a running step of a salloc allocation,
see its recent and later output (labels, filters), send it input, detach with Ctrl-C (SIGINT)
while the step runs on, and have another user refused. The nodes are behind sshd in network
namespaces; everything sattach sees comes through the controller. Words, layout and exit codes
are Slurm 22.05's sattach's, from the same commands on the Slurm peer (../shared/peers/slurm)."""
from __future__ import annotations

import os
import pwd
import re
import signal
import subprocess
import threading
import time

import pytest

from .harness import BIN, OTHER_USER, TEST_USER, start_ssh_cluster, user_dir, user_processes, wait_for
from .terminal import Terminal
from .test_interactive import env_of


@pytest.fixture(scope="module")
def cluster(ssh_nodes):
    c = start_ssh_cluster(ssh_nodes, gpus_per_node=2)
    yield c
    c.close()


@pytest.fixture(scope="module")
def names(ssh_nodes):
    return sorted(n.name for n in ssh_nodes)


def ours(cluster) -> list[str]:
    """The test user's processes of this cluster: other test processes run as the same user."""
    return user_processes(TEST_USER, cluster.workdir)


@pytest.fixture(autouse=True)
def nothing_left(cluster):
    """Every test ends with no job running and no process of its own left."""
    yield
    cluster.cancel_left()
    wait_for(lambda: not ours(cluster), 30, what=f"no process of {TEST_USER} left: {ours(cluster)}")


class Proc:
    """A command of the test user, its stdout and stderr read as they come."""

    def __init__(self, cluster, argv: list[str], *, stdin=subprocess.DEVNULL) -> None:
        pw = pwd.getpwnam(TEST_USER)
        self.p = subprocess.Popen([str(BIN / argv[0]), *argv[1:]], user=pw.pw_uid, group=pw.pw_gid,
                                  extra_groups=[], env=env_of(cluster), cwd=str(user_dir(cluster.workdir, TEST_USER)),
                                  stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.out: list[str] = []
        self.err: list[str] = []
        self.threads = [threading.Thread(target=self._read, args=(f, into), daemon=True)
                        for f, into in ((self.p.stdout, self.out), (self.p.stderr, self.err))]
        for t in self.threads:
            t.start()

    @staticmethod
    def _read(f, into: list[str]) -> None:
        for line in f:
            into.append(line.decode(errors="replace").rstrip("\n"))

    def wait(self, timeout: float = 60) -> int:
        rc = self.p.wait(timeout)
        for t in self.threads:
            t.join(10)
        return rc

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait(10)


SCRIPT = """
srun -n1 true
mkfifo in.fifo; exec 3<>in.fifo; rm -f in.fifo STOP
srun -N2 -n2 -l bash -c 'i=0; while [ ! -e STOP ]; do i=$((i+1)); echo "task $SLURM_PROCID line $i"; sleep 0.3; done
  if [ $SLURM_PROCID = 0 ]; then read -t 30 x; echo "got $x"; fi; exit $((SLURM_PROCID + 2))' <&3
echo "srun=$?"
"""


def test_sattach_follows_a_running_step_detaches_and_refuses_other_users(cluster, names):
    a, b = names
    d = user_dir(cluster.workdir, TEST_USER)
    (d / "STOP").unlink(missing_ok=True)
    salloc = Proc(cluster, ["salloc", "-N2", "-n2", "bash", "-c", SCRIPT])
    attachers: list[Proc] = []
    try:
        job = int(wait_for(lambda: re.search(r"Granted job allocation (\d+)", "\n".join(salloc.err)), 60,
                           what="the allocation").group(1))
        layout = wait_for(lambda: (r := cluster.cli("sattach", "--layout", f"{job}.1", check=False)).returncode == 0
                          and r, 60, what="step 1 to run")
        nl = cluster.cli("hcontrol", "show", "hostlist", f"{a},{b}").stdout.strip()
        assert layout.stdout == (f"Job step layout:\n\t2 tasks, 2 nodes ({nl})\n\n"
                                 f"\tNode 0 ({a}), 1 task(s): 0 \n\tNode 1 ({b}), 1 task(s): 1 \n")
        wait_for(lambda: len(salloc.out) >= 4, 30, what="the step's first lines")
        labelled = Proc(cluster, ["sattach", "-l", f"{job}.1"])
        attachers.append(labelled)
        only1 = Proc(cluster, ["sattach", "--output-filter=1", f"{job}.1"])
        attachers.append(only1)
        feeder = Proc(cluster, ["sattach", "-Q", "--input-filter=0", f"{job}.1"], stdin=subprocess.PIPE)
        attachers.append(feeder)
        # the recent output first (replayed), then what comes, with labels as srun -l writes them
        wait_for(lambda: {"0: task 0 line 1", "1: task 1 line 1"} <= set(labelled.out)
                 and any(re.fullmatch(r"0: task 0 line ([5-9]|\d\d+)", x) for x in labelled.out), 30,
                 what=f"task 0's and task 1's lines through sattach -l: {labelled.out}")
        wait_for(lambda: len(only1.out) >= 3, 30, what="task 1's lines")
        assert all(re.fullmatch(r"task 1 line \d+", x) for x in only1.out), only1.out
        # Ctrl-C detaches: sattach dies of the signal, as Slurm's does; the step runs on
        only1.p.send_signal(signal.SIGINT)
        assert only1.wait() == -signal.SIGINT
        seen = len(labelled.out)
        wait_for(lambda: len(labelled.out) >= seen + 4, 30, what="more output after the other sattach detached")
        assert salloc.p.poll() is None
        # another user is refused; a step that ended, a job nobody knows, an operand that is no step
        for argv, user, err in (
                ([f"{job}.1"], OTHER_USER, "Could not get job step info: Access/permission denied"),
                (["--layout", f"{job}.1"], OTHER_USER, "Could not get job step info: Access/permission denied"),
                ([f"{job}.0"], TEST_USER, "Could not get job step info: Invalid job id specified"),
                (["999999.0"], TEST_USER, "Could not get job step info: Invalid job id specified")):
            r = cluster.cli("sattach", *argv, user=user, check=False)
            assert (r.returncode, r.stderr, r.stdout) == (1, f"sattach: error: {err}\n", ""), (argv, user)
        r = cluster.cli("sattach", str(job), check=False)
        assert (r.returncode, r.stderr, r.stdout) == (
            1, "sattach: error: Failed to parse stepid from command line options\n",
            "Usage: sattach [options] <jobid.stepid>\n")
        # its stdin reaches task 0 (--input-filter) through the controller
        feeder.p.stdin.write(b"hello\n")
        feeder.p.stdin.flush()
        (d / "STOP").write_text("")
        # the step's end: every attacher says which tasks failed and exits with the highest code
        for p in (labelled, feeder):
            assert p.wait() == 3
            assert p.err == ["sattach: error: task 0 exited with exit code 2",
                             "sattach: error: task 1 exited with exit code 3"], p.err
        assert "0: got hello" in labelled.out, labelled.out[-5:]
        assert "got hello" in feeder.out
        assert salloc.wait() == 0
        assert "srun=3" in salloc.out and "0: got hello" in salloc.out, salloc.out[-5:]
    finally:
        for p in (salloc, *attachers):
            p.kill()
        (d / "STOP").unlink(missing_ok=True)
    wait_for(lambda: cluster.job(job)["state"] not in ("RUNNING", "COMPLETING"), 30, what="the allocation to end")
    r = cluster.cli("sattach", f"{job}.1", check=False)
    assert (r.returncode, r.stderr) == (1, "sattach: error: Could not get job step info: Job/step already "
                                           "completing or completed\n")


STDIN_SCRIPT = """#!/bin/bash
printf 'one\\ntwo\\n' | srun -l bash -c 'read a; read b; echo "[$a] [$b]"' | sort
echo hello | srun -i 1 bash -c 'read a; echo "$SLURM_PROCID got [$a]"' | sort
echo hello | srun -i none bash -c 'read a; echo "$SLURM_PROCID none [$a] $?"' | sort
srun bash -c 'read a; echo "$SLURM_PROCID batch [$a] $?"' | sort
seq 1 100000 | srun -N1 -n1 -w {b} sha256sum
seq 1 100000 | sha256sum
"""


def test_stdin_reaches_the_tasks_of_srun_inside_a_batch_script(cluster, names):
    """srun -i all (the default), a task id, none; the batch script's own stdin is /dev/null. The
    expected output is what Slurm 22.05 printed for the same script on the peer (-N2 -n2)."""
    a, b = names
    d = user_dir(cluster.workdir, TEST_USER)
    (d / "stdin.sh").write_text(STDIN_SCRIPT.format(b=b))
    os.chmod(d / "stdin.sh", 0o755)
    job = int(cluster.cli("sbatch", "--parsable", "-N2", "-n2", "-o", str(d / "stdin.%j"), str(d / "stdin.sh"))
              .stdout.strip())
    assert cluster.wait_state(job, "COMPLETED", "FAILED", timeout=120)["state"] == "COMPLETED"
    lines = (d / f"stdin.{job}").read_text().splitlines()
    assert lines[:8] == ["0: [one] [two]", "1: [one] [two]", "0 got []", "1 got [hello]", "0 none [] 1",
                         "1 none [] 1", "0 batch [] 1", "1 batch [] 1"], lines
    assert lines[8] == lines[9] and lines[8].endswith("  -"), lines  # 588 KB to the other node, whole


FOLLOW_SCRIPT = """#!/bin/bash
i=0
while [ ! -e {stop} ]; do i=$((i+1)); echo "line $i"; sleep 0.2; done
echo "to stderr" >&2
echo "last line"
exit 5
"""


def test_sattach_follows_a_batch_jobs_output_through_the_controller_across_its_restart(cluster, names):
    """`sattach JOB.batch` on a submit host that cannot see the output file (a mount namespace with
    an empty file system over its directory): the bytes come through the controller, from the
    file's beginning. Two controller restarts are bridged with nothing lost or repeated: across
    the first the job runs on and is followed live again; during the second it ends, and the
    follower gets the file's rest and the job's end all the same, exiting with the script's code."""
    a, b = names
    d = user_dir(cluster.workdir, TEST_USER)
    out_dir = d / "follow-out"
    out_dir.mkdir(exist_ok=True)
    os.chown(out_dir, pwd.getpwnam(TEST_USER).pw_uid, pwd.getpwnam(TEST_USER).pw_gid)
    stop = d / "FOLLOW-STOP"
    stop.unlink(missing_ok=True)
    (d / "follow.sh").write_text(FOLLOW_SCRIPT.format(stop=stop))
    os.chmod(d / "follow.sh", 0o755)
    job = int(cluster.cli("sbatch", "--parsable", "-w", b, "-o", str(out_dir / "f.%j"), str(d / "follow.sh"))
              .stdout.strip())
    path = out_dir / f"f.{job}"
    wait_for(lambda: path.exists() and path.read_text().count("\n") >= 3, 60, what="the job's first lines")
    pw = pwd.getpwnam(TEST_USER)
    hidden = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
              f'mount -t tmpfs none "$0" && exec setpriv --reuid={pw.pw_uid} --regid={pw.pw_gid} --clear-groups '
              f'"$@"', str(out_dir)]
    argv = [*hidden, str(BIN / "sattach"), f"{job}.batch"]
    follower = subprocess.Popen(argv, env=env_of(cluster), cwd="/", stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    got = bytearray()
    reader = threading.Thread(target=lambda: [got.extend(chunk) for chunk in iter(
        lambda: os.read(follower.stdout.fileno(), 65536), b"")], daemon=True)
    reader.start()
    try:
        probe = subprocess.run([*hidden, "ls", "-A", str(out_dir)], capture_output=True, text=True, timeout=30)
        assert probe.returncode == 0 and probe.stdout == "", probe  # the follower's view: no file there
        r = cluster.cli("sattach", f"{job}.batch", user=OTHER_USER, check=False)
        assert (r.returncode, r.stderr) == (1, "sattach: error: Could not get job step info: Access/permission "
                                               "denied\n")
        time.sleep(1)
        cluster.controller.kill(signal.SIGKILL)  # a restart while it follows: it asks again from its byte
        written = path.read_text().count("\n")
        cluster.controller.start()
        cluster.wait_nodes(2)
        wait_for(lambda: got.count(b"\n") > written + 5, 60, what="lines followed live after the restart")
        cluster.controller.kill(signal.SIGKILL)  # and one during which the job ends
        stop.write_text("")
        wait_for(lambda: path.read_text().endswith("last line\n"), 30, what="the job's last line")
        cluster.controller.start()
        cluster.wait_nodes(2)
        follower.wait(90)  # its stderr is a few lines: the pipe does not fill
        err = follower.stderr.read()
        reader.join(30)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait(10)
        stop.unlink(missing_ok=True)
    assert follower.returncode == 5, err
    assert err.decode().splitlines()[-1] == f"sattach: error: batch job {job} ended FAILED, exit code 5:0", err
    assert bytes(got).decode() == path.read_text()  # the whole file, once, in order (stderr went there too)
    lines = bytes(got).decode().splitlines()
    assert lines[0] == "line 1" and lines[-2:] == ["to stderr", "last line"], lines[-3:]
    assert [int(x.split()[1]) for x in lines[:-2]] == list(range(1, len(lines) - 1))
    r = cluster.cli("sattach", f"{job}.batch", check=False)
    assert (r.returncode, r.stderr) == (1, "sattach: error: Could not get job step info: Job/step already "
                                           "completing or completed\n")


def test_sattach_pty_types_into_an_srun_pty_session(cluster, names):
    """`sattach --pty` on an `srun --pty` step: this terminal is raw, what it types reaches the
    session's terminal (both see the echo), and the session's end ends it with its code."""
    a, b = names
    d = user_dir(cluster.workdir, TEST_USER)
    first = Terminal([str(BIN / "srun"), "-w", b, "--pty", "bash", "--norc", "--noprofile"], user=TEST_USER,
                     env=env_of(cluster, PS1="P$ "), cwd=str(d))
    second = None
    try:
        first.expect(r"P\$ ")
        job = int(cluster.call("jobs", {})["jobs"][0]["id"])
        second = Terminal([str(BIN / "sattach"), "--pty", f"{job}.0"], user=TEST_USER, env=env_of(cluster),
                          cwd=str(d))
        before = second.attrs()
        second.expect(r"P\$ ")  # the replay: the prompt already shown
        second.send("echo from-$((40 + 2))\r")
        first.expect(r"from-42\r\n")
        second.expect(r"from-42\r\n")
        second.send("exit 3\r")
        assert first.wait(30) == 3
        assert second.wait(30) == 3
        second.expect(r"sattach: error: task 0 exited with exit code 3")
        assert second.attrs() == before  # the terminal as it was
    finally:
        first.close()
        if second is not None:
            second.close()
