"""sattach on the steps that srun starts inside a batch script, as Slurm's sattach attaches to
any running step: a 2-node batch job whose step prints on both nodes (task 0 on srun's own node,
whose output srun copies to the controller only while someone is attached; task 1 on the other,
whose output passes through the controller anyway). Replay first, then the live output, `-l`
labels, --output-filter, the end with the failed tasks' codes; another user refused, input
refused, an ended step refused with Slurm's words; and the job's own --output file still gets
every line once. Checked against Slurm 22.05 on the peer (../shared/peers/slurm): there
`sattach JOB.0` on such a step replays from the first line, labels `0: ...` with -l, prints
`sattach: error: task 1 exited with exit code 1` and exits with the highest code when the step
ends, and an ended step's is `Could not get job step info: Invalid job id specified` (1)."""
from __future__ import annotations

import os
import re
import signal

from .harness import OTHER_USER, TEST_USER, user_dir, wait_for
# test_sattach's module-scoped cluster (one of this module's own) and its clean-up after each test
from .test_sattach import Proc, cluster, names, nothing_left  # noqa: F401 - fixtures


SCRIPT = """#!/bin/bash
srun -N2 -n2 bash -c 'i=0; while [ ! -e B-STOP1 ]; do i=$((i+1)); echo "task $SLURM_PROCID line $i"
  echo "err $SLURM_PROCID $i" >&2; sleep 0.3; done; exit $((SLURM_PROCID + 2))'
echo "srun=$?"
while [ ! -e B-STOP2 ]; do sleep 0.2; done
srun -O -N1 -n2 -w {first} bash -c 'i=0; while [ ! -e B-STOP3 ]; do i=$((i+1)); echo "one-node $SLURM_PROCID $i"
  sleep 0.3; done'
echo "srun=$?"
"""


def lines_of(lines: list[str], task: int, pattern: str) -> list[str]:
    return [x for x in lines if re.fullmatch(pattern.format(task=task), x)]


def test_sattach_attaches_to_the_steps_of_a_batch_job(cluster, names):
    a, b = names
    d = user_dir(cluster.workdir, TEST_USER)
    for n in (1, 2, 3):
        (d / f"B-STOP{n}").unlink(missing_ok=True)
    (d / "battach.sh").write_text(SCRIPT.format(first=a))
    os.chmod(d / "battach.sh", 0o755)
    job = int(cluster.cli("sbatch", "--parsable", "-N2", "-n2", "-w", f"{a},{b}", "-o", str(d / "battach.%j"),
                          str(d / "battach.sh")).stdout.strip())
    out = d / f"battach.{job}"
    attachers: list[Proc] = []
    try:
        layout = wait_for(lambda: (r := cluster.cli("sattach", "--layout", f"{job}.0", check=False)).returncode == 0
                          and r, 90, what="step 0 to run")
        assert f"Node 0 ({a}), 1 task(s): 0 \n\tNode 1 ({b}), 1 task(s): 1 \n" in layout.stdout  # task 0: srun's node
        wait_for(lambda: out.exists() and all(len(lines_of(out.read_text().splitlines(), t, r"task {task} line \d+"))
                                              >= 4 for t in (0, 1)), 60, what="four lines of each task in the file")
        plain = Proc(cluster, ["sattach", f"{job}.0"])
        labelled = Proc(cluster, ["sattach", "-l", f"{job}.0"])
        only0 = Proc(cluster, ["sattach", "--output-filter=0", f"{job}.0"])
        attachers += [plain, labelled, only0]
        # the replay (from the first line: less than 64 KiB so far), then the live lines, of both tasks
        for t in (0, 1):
            wait_for(lambda: f"task {t} line 1" in plain.out
                     and len(lines_of(plain.out, t, r"task {task} line \d+")) >= 10, 60,
                     what=f"task {t}'s first and later lines through sattach: {plain.out[-4:]}")
            wait_for(lambda: f"{t}: task {t} line 1" in labelled.out
                     and len(lines_of(labelled.out, t, r"{task}: task {task} line \d+")) >= 10, 60,
                     what=f"task {t}'s lines through sattach -l: {labelled.out[-4:]}")
        assert "err 0 1" in plain.err and "err 1 1" in plain.err, plain.err[:4]  # stderr to stderr
        wait_for(lambda: len(only0.out) >= 10, 30, what="task 0's lines")
        assert all(re.fullmatch(r"task 0 line \d+", x) for x in only0.out), only0.out
        # Ctrl-C detaches: sattach dies of it; the step and the other attachers go on
        only0.p.send_signal(signal.SIGINT)
        assert only0.wait() == -signal.SIGINT
        seen = len(labelled.out)
        wait_for(lambda: len(labelled.out) >= seen + 6, 30, what="more output after the other sattach detached")
        for argv, user, err in (
                ([f"{job}.0"], OTHER_USER, "Could not get job step info: Access/permission denied"),
                ([f"{job}.1"], TEST_USER, "Could not get job step info: Invalid job id specified"),
                (["--input-filter=0", f"{job}.0"], TEST_USER,
                 f"Could not attach to step {job}.0: it is a step of a batch job, whose tasks read its srun's stdin "
                 f"in the batch script; sattach sends input (--input-filter, --pty) to the steps of salloc and srun "
                 f"allocations only: attach without them to see its output")):
            r = cluster.cli("sattach", *argv, user=user, check=False)
            assert (r.returncode, r.stderr, r.stdout) == (1, f"sattach: error: {err}\n", ""), (argv, user)
        # the step's end: the attachers say which tasks failed and exit with the highest code
        (d / "B-STOP1").write_text("")
        for p in (plain, labelled):
            assert p.wait(90) == 3
            assert p.err[-2:] == ["sattach: error: task 0 exited with exit code 2",
                                  "sattach: error: task 1 exited with exit code 3"], p.err[-3:]
        wait_for(lambda: "srun=3" in out.read_text(), 60, what="srun's end in the script")
        r = cluster.cli("sattach", f"{job}.0", check=False)  # the job runs on; its step 0 has ended
        assert (r.returncode, r.stderr) == (1, "sattach: error: Could not get job step info: Invalid job id "
                                               "specified\n")
        # every line of the file came through sattach once and in order, and the file has each once
        text = out.read_text().splitlines()
        for t in (0, 1):
            mine = lines_of(text, t, r"task {task} line \d+")
            assert mine == [f"task {t} line {i}" for i in range(1, len(mine) + 1)], mine
            assert lines_of(plain.out, t, r"task {task} line \d+") == mine
            assert lines_of(labelled.out, t, r"{task}: task {task} line \d+") == [f"{t}: {x}" for x in mine]
            assert lines_of(plain.err, t, r"err {task} \d+") == lines_of(text, t, r"err {task} \d+")
        # a step all on srun's own node (no task passes through the controller by itself)
        (d / "B-STOP2").write_text("")
        wait_for(lambda: cluster.cli("sattach", "--layout", f"{job}.1", check=False).returncode == 0, 60,
                 what=f"step 1 to run: {out.read_text().splitlines()[-3:]}")
        wait_for(lambda: "one-node 1 3" in out.read_text(), 60, what="step 1's lines in the file")
        # the last attacher leaves (srun's copy stops), another comes (it starts again, with the replay)
        first = Proc(cluster, ["sattach", f"{job}.1"])
        attachers.append(first)
        wait_for(lambda: {"one-node 0 1", "one-node 1 1"} <= set(first.out) and len(first.out) >= 8, 60,
                 what=f"step 1's lines through the first sattach: {first.out[-4:]}")
        first.p.send_signal(signal.SIGINT)
        assert first.wait() == -signal.SIGINT
        seen = out.read_text().count("one-node 0 ")
        wait_for(lambda: out.read_text().count("one-node 0 ") >= seen + 3, 60, what="step 1 printing on")
        local = Proc(cluster, ["sattach", "-l", f"{job}.1"])
        attachers.append(local)
        for t in (0, 1):
            try:
                wait_for(lambda: f"{t}: one-node {t} 1" in local.out
                         and len(lines_of(local.out, t, r"{task}: one-node {task} \d+")) >= 6, 60,
                         what=f"step 1's task {t} through sattach -l")
            except AssertionError as exc:
                raise AssertionError(f"{exc}: {local.out[-4:]} {local.err[-4:]} {local.p.poll()}") from None
        (d / "B-STOP3").write_text("")
        assert local.wait(90) == 0
        assert local.err == [], local.err
        assert cluster.wait_state(job, "COMPLETED", "FAILED", timeout=90)["state"] == "COMPLETED"
        text = out.read_text().splitlines()
        for t in (0, 1):
            mine = lines_of(text, t, r"one-node {task} \d+")
            assert mine == [f"one-node {t} {i}" for i in range(1, len(mine) + 1)], mine
            assert lines_of(local.out, t, r"{task}: one-node {task} \d+") == [f"{t}: {x}" for x in mine]
        assert text.count("srun=3") == 1 and text.count("srun=0") == 1, text[-3:]
    finally:
        for p in attachers:
            p.kill()
        for n in (1, 2, 3):
            (d / f"B-STOP{n}").unlink(missing_ok=True)
    r = cluster.cli("sattach", f"{job}.1", check=False)
    assert (r.returncode, r.stderr) == (1, "sattach: error: Could not get job step info: Job/step already "
                                           "completing or completed\n")


def test_sattach_on_a_batch_step_ends_when_its_job_is_cancelled(cluster, names):
    """scancel of the job: srun and its tasks go, and the attached sattach hears the step's end
    (it does not wait for output that will never come)."""
    a, b = names
    d = user_dir(cluster.workdir, TEST_USER)
    job = int(cluster.cli("sbatch", "--parsable", "-N2", "-n2", "-w", f"{a},{b}", "-o", str(d / "bcancel.%j"),
                          "--wrap", "srun -N2 -n2 bash -c 'while true; do echo tick $SLURM_PROCID; sleep 0.3; done'")
              .stdout.strip())
    wait_for(lambda: cluster.cli("sattach", "--layout", f"{job}.0", check=False).returncode == 0, 90,
             what="step 0 to run")
    p = Proc(cluster, ["sattach", "-l", f"{job}.0"])
    try:
        wait_for(lambda: {"0: tick 0", "1: tick 1"} <= set(p.out), 60, what="both tasks' lines through sattach")
        cluster.cli("scancel", str(job))
        p.wait(90)  # ended by the step's end, not killed
        assert not [x for x in p.err if "dropped" in x or "lost the connection" in x], p.err
    finally:
        p.kill()
    assert cluster.wait_state(job, "CANCELLED", timeout=90)["state"] == "CANCELLED"
    r = cluster.cli("sattach", f"{job}.0", check=False)
    assert (r.returncode, r.stderr) == (1, "sattach: error: Could not get job step info: Job/step already "
                                           "completing or completed\n")
