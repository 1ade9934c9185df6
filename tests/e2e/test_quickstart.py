"""The README's first command: a one-machine cluster that runs the example job to COMPLETED."""
import os
import subprocess
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_quickstart_runs_the_example_job():
    d = tempfile.mkdtemp(prefix="hai-qs-", dir="/tmp")
    env = {**os.environ, "HAI_DEV_DIR": d}
    try:
        proc = subprocess.run([str(REPO / "scripts" / "quickstart")], cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        out = proc.stdout
        assert "Submitted batch job 1" in out
        assert "COMPLETED" in out.split("== hacct -l -j 1")[1]
        hello = out.split("== output")[1].split("== hcontrol")[0]
        assert hello.count("batch script on ") == 1  # once, on the first node; srun starts the tasks
        tasks = sorted(line for line in hello.splitlines() if ": task " in line)
        assert [t.split(" of ")[0] for t in tasks] == [f"{i}: task {i}" for i in range(4)], hello
        assert [t.split("CUDA_VISIBLE_DEVICES=")[1] for t in tasks] == ["0", "1", "0", "1"], hello
        # The time-slicing demo: the long job was preempted once, resumed, and lost no step.
        assert "short job: COMPLETED; long job: COMPLETED" in out
        acct = out.split("== hacct -l -j 2")[1].split("==")[0]
        rows = [line.split() for line in acct.strip().splitlines()[2:]]
        assert [r[3] for r in rows if "." not in r[0]] == ["PREEMPTED", "COMPLETED"], acct  # the runs
        # each run: its batch script, and the srun step that runs train_loop.py on both nodes
        assert [r[0].split(".")[1] for r in rows if "." in r[0]] == ["batch", "0", "batch", "0"], acct
        runs = out.split("executed (")[1].split("\n\n")[0].splitlines()[1:]
        assert len(runs) == 2 and runs[0].startswith("run 0: steps 1-") and runs[1].endswith("-100")
        assert int(runs[1].split("steps ")[1].split("-")[0]) == int(runs[0].split("-")[1]) + 1
    finally:
        subprocess.run([str(REPO / ".venv" / "bin" / "hai-dev"), "down", "--dir", d], capture_output=True)
        subprocess.run(["rm", "-rf", d])
