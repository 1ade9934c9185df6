"""Slurm's job model end to end: the batch script runs once, on the job's first node, and `srun`
starts job steps of tasks across the allocation. The nodes are behind sshd in network namespaces
and their agents' spools are apart: the tasks' output reaches srun over the cluster's own links.
Expected values are Slurm 22.05's, from the same scripts run on the Slurm peer."""
from __future__ import annotations

import os
import pwd
import re
import signal
import time

import pytest

from .harness import OTHER_USER, TEST_USER, start_ssh_cluster, user_dir, wait_for

GPUS_PER_NODE = 4


@pytest.fixture(scope="module")
def cluster(ssh_nodes):
    c = start_ssh_cluster(ssh_nodes, gpus_per_node=GPUS_PER_NODE)
    yield c
    c.close()


@pytest.fixture(autouse=True)
def nothing_left_running(cluster):
    yield
    cluster.cancel_left()


@pytest.fixture(scope="module")
def names(ssh_nodes):
    return sorted(n.name for n in ssh_nodes)


def run_script(cluster, name: str, body: str, *argv: str, state: str = "COMPLETED", timeout: float = 90) -> str:
    d = user_dir(cluster.workdir, TEST_USER)
    (d / name).write_text(body)
    out = d / f"{name}.out"
    job_id = cluster.submit("-o", str(out), *argv, str(d / name))
    try:
        job = cluster.wait_state(job_id, "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", timeout=timeout)
        assert out.exists(), job
    except AssertionError:
        import subprocess
        print(subprocess.run(f"cd {cluster.workdir}; tail -n 30 controller.log */agent.log; cat {out}; tail -n 20 */spool/runs/*/shepherd.log", shell=True, capture_output=True, text=True).stdout)
        raise
    text = out.read_text()
    assert job["state"] == state, (job, text)
    return text


def test_the_script_runs_once_and_srun_starts_every_task_with_slurms_variables(cluster, names):
    text = run_script(cluster, "env.sh", """#!/bin/bash
#SBATCH -N 2 --ntasks-per-node=2 --gpus-per-task=1
echo "batch on $SLURMD_NODENAME procid=$SLURM_PROCID"
srun bash -c 'echo "t=$SLURM_PROCID l=$SLURM_LOCALID n=$SLURM_NODEID sid=$SLURM_STEP_ID/$SLURM_STEPID \
nt=$SLURM_STEP_NUM_TASKS nn=$SLURM_STEP_NUM_NODES nl=$SLURM_STEP_NODELIST tpn=$SLURM_STEP_TASKS_PER_NODE \
node=$SLURMD_NODENAME host=$(hostname) rank=$RANK/$LOCAL_RANK/$WORLD_SIZE cvd=$CUDA_VISIBLE_DEVICES \
pid=$([ "$SLURM_TASK_PID" = $$ ] && echo ok)"' | sort
echo "rc=$?"
srun -n 3 bash -c 'echo "n3 t=$SLURM_PROCID n=$SLURM_NODEID tpn=$SLURM_STEP_TASKS_PER_NODE sid=$SLURM_STEP_ID"' | sort
""")
    a, b = names
    lines = text.splitlines()
    assert lines[0] == f"batch on {a} procid=0"
    assert lines.count(lines[0]) == 1 and not any(line.startswith("batch on") for line in lines[1:])
    tasks = [line for line in lines if line.startswith("t=")]
    nl = cluster.cli("hcontrol", "show", "hostlist", f"{a},{b}").stdout.strip()
    assert tasks == [
        f"t={t} l={t % 2} n={t // 2} sid=0/0 nt=4 nn=2 nl={nl} tpn=2(x2) node={node} host={node} "
        f"rank={t}/{t % 2}/4 cvd={t % 2} pid=ok"
        for t, node in enumerate([a, a, b, b])], text
    assert "rc=0" in lines
    assert [line for line in lines if line.startswith("n3 ")] == [
        "n3 t=0 n=0 tpn=2,1 sid=1", "n3 t=1 n=0 tpn=2,1 sid=1", "n3 t=2 n=1 tpn=2,1 sid=1"]
    # srun warns as Slurm's does when its -n does not match the job's --ntasks-per-node
    assert ("srun: Warning: can't honor --ntasks-per-node set to 2 which doesn't match the requested tasks 3 "
            "with the number of requested nodes 2. Ignoring --ntasks-per-node.") in lines


def test_exit_codes_labels_errors_and_the_tasks_of_one_node(cluster, names):
    a, b = names
    text = run_script(cluster, "codes.sh", f"""#!/bin/bash
#SBATCH -N 2 --ntasks-per-node=2
srun -l -n 2 -w {b} bash -c 'echo hi; echo err >&2'
srun -n 2 bash -c 'exit $SLURM_PROCID'; echo "rcexit=$?"
srun -n 4 bash -c '[ $SLURM_PROCID = 3 ] && kill -9 $$; true'; echo "rcsig=$?"
srun -n 99 true; echo "rc99=$?"
srun -N 3 true; echo "rcN3=$?"
srun -N 1 true; echo "rcN1=$?"
srun nosuchcommand-xyz; echo "rcmissing=$?"
srun -x {a} -n 1 bash -c 'echo x=$SLURMD_NODENAME'
""")
    lines = text.splitlines()
    assert sorted(line for line in lines if line.endswith(("hi", "err"))) == ["0: err", "0: hi", "1: err", "1: hi"]
    assert f"srun: error: {b}: task 1: Exited with exit code 1" in lines and "rcexit=1" in lines
    assert f"srun: error: {b}: task 3: Killed" in lines and "rcsig=137" in lines
    assert "srun: error: Unable to create step for job" in text and "More processors requested than permitted" in text
    assert "rc99=1" in lines
    assert "srun: error: Only allocated 2 nodes asked for 3" in lines and "rcN3=1" in lines
    # a refused step's warnings come first, as Slurm's srun prints them
    refused = lines.index("rcN1=1")
    assert lines[refused - 2] == (
        "srun: Warning: can't honor --ntasks-per-node set to 2 which doesn't match the requested tasks 4 with the "
        "number of requested nodes 1. Ignoring --ntasks-per-node."), text
    assert re.fullmatch(r"srun: error: Unable to create step for job \d+: More processors requested than permitted",
                        lines[refused - 1]), text
    assert "slurmstepd: error: execve(): nosuchcommand-xyz: No such file or directory" in lines
    assert "rcmissing=2" in lines
    assert f"x={b}" in lines and "srun: Warning: can't run 1 processes on 2 nodes, setting nnodes to 1" in lines


def test_steps_are_accounted_and_listed_and_their_ids_outlive_a_controller_restart(cluster, names):
    a, b = names
    d = user_dir(cluster.workdir, TEST_USER)
    flag = d / "acct-go"
    flag.unlink(missing_ok=True)
    (d / "acct.sh").write_text(f"""#!/bin/bash
#SBATCH -N 2 --ntasks-per-node=2 -J accounted
srun bash -c 'echo sid=$SLURM_STEP_ID' | sort -u
srun -w {b} -N 1 -n 2 sleep 300 &
while [ ! -e {flag} ]; do sleep 0.2; done
kill %1; wait
srun -n 1 bash -c 'echo sid=$SLURM_STEP_ID; exit 3'
echo done
""")
    out = d / "acct.out"
    job_id = cluster.submit("-o", str(out), str(d / "acct.sh"))
    # step 0 may still be listed for a moment after its output is in: wait for exactly the sleep and the batch
    steps = wait_for(lambda: (text := cluster.cli("hqueue", "-s", "-j", str(job_id), "-h").stdout).count("\n") == 2
                     and f"{job_id}.1 " in text and f"{job_id}.0 " not in text and text,
                     60, what="the sleep step and the batch step in hqueue -s")
    assert [line.split()[:2] + line.split()[-1:] for line in steps.splitlines()] == [
        [f"{job_id}.1", "sleep", b], [f"{job_id}.batch", "batch", a]]
    assert cluster.cli("hqueue", "-s", f"{job_id}.1", "-o", "%i %N", "-h").stdout.split() == [f"{job_id}.1", b]
    shown = cluster.cli("hcontrol", "show", "job", str(job_id)).stdout
    assert f"Step={job_id}.1 Name=sleep State=RUNNING NumTasks=2 NodeList={b} ExitCode=0:0 RunTime=" in shown
    assert f"Step={job_id}.0 Name=bash State=COMPLETED NumTasks=4" in shown
    cluster.controller.kill(signal.SIGKILL)
    cluster.controller.start()
    cluster.wait_nodes(2)
    flag.touch()
    job = cluster.wait_state(job_id, "COMPLETED", "FAILED", timeout=90)
    text = out.read_text()
    assert job["state"] == "COMPLETED", text
    assert [line for line in text.splitlines() if line.startswith("sid=")] == ["sid=0", "sid=2"], text
    rows = [line.split("|") for line in cluster.cli(
        "hacct", "-j", str(job_id), "-P", "-n", "-o", "JobID,JobName,Partition,AllocCPUS,State,ExitCode,NodeList"
    ).stdout.splitlines()]
    nl = cluster.cli("hcontrol", "show", "hostlist", f"{a},{b}").stdout.strip()
    assert rows == [
        [str(job_id), "accounted", "gpu", "4", "COMPLETED", "0:0", nl],
        [f"{job_id}.batch", "batch", "", "2", "COMPLETED", "0:0", a],
        [f"{job_id}.0", "bash", "", "4", "COMPLETED", "0:0", nl],
        [f"{job_id}.1", "sleep", "", "2", "CANCELLED", "0:15", b],
        [f"{job_id}.2", "bash", "", "1", "FAILED", "3:0", a]], text
    assert cluster.cli("hacct", "-X", "-j", str(job_id), "-P", "-n", "-o", "JobID").stdout.split() == [str(job_id)]
    events = cluster.cli("hcontrol", "show", "events", str(job_id)).stdout
    assert f"event=step_start job={job_id} node={a} step={job_id}.2 name=bash tasks=1 nodes={a}" in events
    assert f"event=step_end job={job_id} node={a} step={job_id}.2 state=FAILED exit_code=3:0" in events


def test_srun_output_to_files_per_task_and_node_none_one_task_and_append(cluster, names):
    a, b = names
    d = user_dir(cluster.workdir, TEST_USER) / "srun-files"
    d.mkdir(exist_ok=True)
    os.chown(d, *pwd.getpwnam(TEST_USER)[2:4])  # srun opens its files as the user
    for f in d.iterdir():
        f.unlink()
    text = run_script(cluster, "files.sh", f"""#!/bin/bash
#SBATCH -N 2 --ntasks-per-node=2 -J files
cd {d}
srun -o 'task-%j.%s-%t.out' bash -c 'echo out $SLURM_PROCID; echo err $SLURM_PROCID >&2'
srun -o 'node-%N.out' -e 'err-%x.log' -l bash -c 'echo o; echo e >&2'
srun -o none bash -c 'echo hidden'
srun -o 3 bash -c 'echo only $SLURM_PROCID'
echo first > append.out
srun -n 1 -o append.out --open-mode=append echo second
srun -n 1 -o nodir/x true; echo "rcopen=$?"
""")
    lines = text.splitlines()
    tasks = sorted(d.glob("task-*.out"))
    assert [f.name.rsplit("-", 1)[1] for f in tasks] == ["0.out", "1.out", "2.out", "3.out"], text
    job_step = tasks[0].name.split("-")[1]
    assert re.fullmatch(r"\d+\.0", job_step)
    for t, f in enumerate(tasks):
        assert sorted(f.read_text().splitlines()) == [f"err {t}", f"out {t}"]
    assert sorted((d / f"node-{a}.out").read_text().splitlines()) == ["0: o", "1: o"]
    assert sorted((d / f"node-{b}.out").read_text().splitlines()) == ["2: o", "3: o"]
    assert sorted((d / "err-files.log").read_text().splitlines()) == ["0: e", "1: e", "2: e", "3: e"]
    assert "hidden" not in text and [line for line in lines if line.startswith("only")] == ["only 3"]
    assert (d / "append.out").read_text() == "first\nsecond\n"
    assert "srun: error: Could not open stdout file: No such file or directory" in lines  # as Slurm 22.05 says it
    assert "rcopen=1" in lines
    assert not any(line.startswith(("out ", "err ", "0: ")) for line in lines), text  # none reached the job's file


def test_steps_side_by_side_and_much_output_from_another_node(cluster, names):
    a, b = names
    text = run_script(cluster, "par.sh", f"""#!/bin/bash
#SBATCH -N 2
srun -w {b} -N 1 bash -c 'sleep 1; echo second-{b}' &
srun -w {a} -N 1 bash -c 'echo first-{a}' &
wait
srun -w {b} -N 1 python3 -c '
import sys
for i in range(200000):
    sys.stdout.write("line %06d %s\\n" % (i, "x" * 40))
'
echo "done rc=$?"
""")
    lines = text.splitlines()
    assert lines.index(f"first-{a}") < lines.index(f"second-{b}")
    big = [line for line in lines if line.startswith("line ")]
    assert big == ["line %06d %s" % (i, "x" * 40) for i in range(200000)]
    assert lines[-1] == "done rc=0"


def test_cancel_during_a_step_leaves_no_task_on_any_node(cluster, names):
    d = user_dir(cluster.workdir, TEST_USER)
    for f in d.glob("steptask-*.pid"):
        f.unlink()
    (d / "long.sh").write_text(f"""#!/bin/bash
#SBATCH -N 2 --ntasks-per-node=2
srun bash -c 'echo $$ > {d}/steptask-$SLURM_PROCID.pid; exec sleep 300'
""")
    job_id = cluster.submit("-o", str(d / "long.out"), str(d / "long.sh"))
    cluster.wait_state(job_id, "RUNNING")
    pids = wait_for(lambda: (len(list(d.glob("steptask-*.pid"))) == 4 and
                             [int(p.read_text()) for p in d.glob("steptask-*.pid") if p.read_text().strip()]),
                    60, what="the step's four tasks")
    assert len(pids) == 4 and all(os.path.exists(f"/proc/{p}") for p in pids)
    cluster.cli("hcancel", str(job_id))
    assert cluster.wait_state(job_id, "CANCELLED", "FAILED", "COMPLETED")["state"] == "CANCELLED"
    wait_for(lambda: not any(os.path.exists(f"/proc/{p}") for p in pids), 30, what="the tasks to end")


def test_a_job_run_on_every_node_as_before_steps(cluster, names):
    text_dir = user_dir(cluster.workdir, TEST_USER)
    (text_dir / "each.sh").write_text("#!/bin/bash\n#HAI --every-node\necho \"on $SLURMD_NODENAME rank=$SLURM_PROCID\"\n")
    job_id = cluster.submit("-N", "2", "-o", str(text_dir / "each-%N.out"), str(text_dir / "each.sh"))
    assert cluster.wait_state(job_id, "COMPLETED", "FAILED")["state"] == "COMPLETED"
    for rank, name in enumerate(names):
        assert (text_dir / f"each-{name}.out").read_text() == f"on {name} rank={rank}\n"


def test_srun_pty_in_a_batch_script_says_it_is_for_interactive_use(cluster):
    """Outside a job srun gets an allocation of its own (test_interactive.py); in a batch script
    a terminal has nobody to type into it."""
    text = run_script(cluster, "pty.sh", "#!/bin/bash\nsrun --pty true; echo \"rc=$?\"\n")
    assert text.splitlines() == ["srun: error: --pty starts a terminal for salloc's or your own srun (outside a "
                                 "batch script) only", "rc=1"]


def test_no_user_reaches_another_users_job_through_the_step_socket(cluster, names):
    """haiother, with a job of its own on the same node, names haitest's job: refused, and nothing
    of haitest's job is started; without any job there, its connection is closed at once."""
    victim = user_dir(cluster.workdir, TEST_USER)
    (victim / "hold.sh").write_text("#!/bin/bash\n#SBATCH -N 2\nsleep 120\n")
    held = cluster.submit("-o", str(victim / "hold.out"), str(victim / "hold.sh"))
    cluster.wait_state(held, "RUNNING")
    other = user_dir(cluster.workdir, OTHER_USER)
    marker = victim / "reached"
    (other / "probe.sh").write_text(f"""#!/bin/bash
srun --jobid={held} -n 1 touch {marker}; echo "rc=$?"
python3 - <<'PY'
import os, socket
s = socket.socket(socket.AF_UNIX)
s.connect(os.environ["HAI_STEP_SOCKET"])
s.sendall(b"garbage that is no frame at all" * 100)
print("garbage sent")
PY
srun -n 1 echo "own job still fine"
""")
    probe = cluster.submit("-o", str(other / "probe.out"), str(other / "probe.sh"), user=OTHER_USER)
    assert cluster.wait_state(probe, "COMPLETED", "FAILED")["state"] == "COMPLETED"
    text = (other / "probe.out").read_text()
    assert re.search(rf"srun: error: job {held} has no running part owned by you on node hai\d*-n[12]\n", text), text
    assert "rc=1" in text and "own job still fine" in text and not marker.exists()
    assert cluster.job(held)["state"] == "RUNNING"
    cluster.cli("hcancel", str(held))
    cluster.wait_state(held, "CANCELLED")


TRAIN = """import os, signal, sys, time
rank, node = os.environ["SLURM_PROCID"], os.environ["SLURMD_NODENAME"]
ck = os.path.join(os.environ["HAI_CHECKPOINT_DIR"], "rank" + rank)
os.makedirs(os.path.dirname(ck), exist_ok=True)
step = int(open(ck).read()) if os.path.exists(ck) else 0
print(f"rank {rank} on {node} run {os.environ['SLURM_RESTART_COUNT']} resumes at {step}", flush=True)
def save(*_):
    with open(ck, "w") as f:
        f.write(str(step))
    time.sleep(0.5)  # a checkpoint takes a while; srun is still there to pass this on
    print(f"rank {rank} on {node} saved at {step}", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, save)
while step < 60:
    step += 1
    time.sleep(0.1)
print(f"rank {rank} finished", flush=True)
"""


def test_a_step_is_preempted_whole_and_resumes_from_its_checkpoint(cluster, names):
    a, b = names
    d = user_dir(cluster.workdir, TEST_USER)
    (d / "train.py").write_text(TRAIN)
    (d / "steptrain.sh").write_text(f"#!/bin/bash\n#SBATCH -N 2 --ntasks-per-node=1\n#HAI --grace=20\n"
                                    f"srun python3 {d}/train.py\n")
    out = d / "steptrain.out"
    job_id = cluster.submit("-o", str(out), str(d / "steptrain.sh"))
    wait_for(lambda: out.exists() and out.read_text().count("resumes at") == 2, 60, what="both ranks to start")
    time.sleep(1.5)
    cluster.cli("hcontrol", "requeue", str(job_id))
    job = cluster.wait_state(job_id, "COMPLETED", "FAILED", timeout=120)
    text = out.read_text()
    assert job["state"] == "COMPLETED", text
    assert [r["state"] for r in job["runs"]] == ["REQUEUED", "COMPLETED"], job["runs"]
    saved = {m[0]: int(m[1]) for m in re.findall(r"rank (\d) on \S+ saved at (\d+)", text)}
    resumed = {m[0]: int(m[1]) for m in re.findall(r"rank (\d) on \S+ run 1 resumes at (\d+)", text)}
    assert set(saved) == {"0", "1"} and resumed == saved and all(v > 0 for v in saved.values()), text
    assert f"rank 1 on {b} saved at" in text  # said by the other node's task during its grace period
    assert "rank 0 finished" in text and "rank 1 finished" in text


def test_a_step_goes_on_through_an_agent_restart_and_loses_no_line(cluster, names):
    a, b = names
    d = user_dir(cluster.workdir, TEST_USER)
    (d / "restart.sh").write_text(f"""#!/bin/bash
#SBATCH -N 2
srun -w {b} -N 1 python3 -c '
import time
for i in range(80):
    print("tick", i, flush=True)
    time.sleep(0.05)
'
echo "srun rc=$?"
""")
    out = d / "restart.out"
    job_id = cluster.submit("-o", str(out), str(d / "restart.sh"))
    wait_for(lambda: out.exists() and "tick 5\n" in out.read_text(), 60, what="the step's first lines")
    agent = cluster.agents[b]
    agent.kill()
    time.sleep(0.5)
    agent.start()
    job = cluster.wait_state(job_id, "COMPLETED", "FAILED", timeout=90)
    text = out.read_text()
    assert job["state"] == "COMPLETED", text
    assert [line for line in text.splitlines() if line.startswith("tick")] == [f"tick {i}" for i in range(80)]
    assert text.endswith("srun rc=0\n")


def test_signals_to_srun_and_kill_on_bad_exit_reach_every_task(cluster, names):
    a, b = names
    text = run_script(cluster, "sig.sh", """#!/bin/bash
#SBATCH -N 2
srun bash -c 'trap "echo got-TERM-on-$SLURMD_NODENAME; exit 7" TERM; sleep 30 & wait' &
sleep 2
kill -TERM $!
wait $!; echo "rc=$?"
srun -K -n 2 bash -c '[ $SLURM_PROCID = 0 ] && exit 3; sleep 30'; echo "krc=$?"
""")
    lines = text.splitlines()
    assert sorted(line for line in lines if line.startswith("got-TERM")) == [f"got-TERM-on-{a}", f"got-TERM-on-{b}"]
    assert "rc=7" in lines
    assert f"srun: error: {a}: task 0: Exited with exit code 3" in lines and f"srun: error: {b}: task 1: Killed" in lines
    assert "krc=137" in lines


def test_a_b_signal_reaches_the_batch_shell_which_passes_it_on_through_srun(cluster, names):
    """The requeue pattern of Lightning's and submitit's users: --signal=B:USR1@T, the batch
    shell traps it and forwards it to srun, which passes it to every task on every node."""
    a, b = names
    text = run_script(cluster, "fwd.sh", """#!/bin/bash
#SBATCH -N 2 -t 0:30 --signal=B:USR1@22
srun bash -c 'trap "echo usr1-on-$SLURMD_NODENAME; kill %1; exit 0" USR1; sleep 60 & wait' &
pid=$!
trap 'echo batch-got-USR1; kill -USR1 $pid' USR1
wait $pid
wait $pid; echo "rc=$?"
""")
    lines = text.splitlines()
    assert lines[0] == "batch-got-USR1" and lines[-1] == "rc=0", lines
    assert sorted(lines[1:-1]) == [f"usr1-on-{a}", f"usr1-on-{b}"], lines
