"""Preemption overhead added by the platform, on a real dev cluster (controller + local agent).

A long checkpointing job holds the only GPU past its quantum; a short job arrives. Timeline, from
what the jobs write:
  submit  the short job is submitted (the scheduler decides within one tick)
  notice  the agent writes the preempt notice into the long job's control dir, then signals it
  exit    the long job has saved its checkpoint and exits
  start   the short job's first line runs
overhead = (start - submit) - (exit - notice): what the platform adds on top of the job's own
checkpoint time (scheduler tick, store writes, SSH/RPC, process launch)."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .polling import wait_until

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _cli(env, *argv) -> str:
    return subprocess.run([str(BIN / argv[0]), *argv[1:]], env=env, check=True, capture_output=True,
                          text=True).stdout


def _wait(pred, timeout=60.0):
    return wait_until(pred, timeout, "a job's state")


def _state(env, job) -> str:
    return _cli(env, "hqueue", "-h", "-j", str(job), "-o", "%T").strip()


# The long job: polls should_checkpoint() like a training loop, and on the notice writes the
# notice's time and its own exit time (after a token checkpoint) to $1.
LONG_JOB = """#!/bin/sh
exec python3 - "$@" <<'PY'
import json, sys, time
from hai_cluster import job
job.install()
while not job.should_checkpoint():
    time.sleep(0.005)
job.save_checkpoint({"step": 1})
with open(sys.argv[1], "w") as f:
    json.dump({"notice": job.notice()["time"], "exit": time.time()}, f)
PY
"""


def measure(reps: int = 5, tick: float = 0.5) -> dict:
    d = Path(tempfile.mkdtemp(prefix="hai-bench-", dir="/tmp"))
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "HAI_EXAMPLES": str(REPO / "examples")}
    up = subprocess.run([str(BIN / "hai-dev"), "up", "--dir", str(d), "--nodes", "1", "--gpus-per-node", "1",
                         "--gpu-backend", "simulated", "--tick", str(tick), "--thresholds", "1,100000",
                         "--quanta", "0,0,0"], capture_output=True, text=True, check=True)
    env["HAI_CONTROLLER"] = up.stdout.split("=", 1)[1].strip()
    work = d / "work"
    work.mkdir()
    samples = []
    try:
        script = work / "long.sh"
        script.write_text(LONG_JOB)
        for i in range(reps):
            times = work / f"long-{i}.json"
            long = int(_cli(env, "hsubmit", "--parsable", "-D", str(work), "--gpus-per-node=1", "-o", "/dev/null",
                            str(script), str(times)))
            _wait(lambda: _state(env, long) == "RUNNING")
            time.sleep(1.5)  # past level 0 (1 GPU-second) and its quantum
            marker = work / f"start-{i}"
            t_submit = time.time()
            short = int(_cli(env, "hsubmit", "--parsable", "-D", str(work), "--gpus-per-node=1", "-o", "/dev/null",
                             "--wrap", f"python3 -c 'import time; print(time.time())' > {marker}"))
            _wait(lambda: _state(env, short) == "COMPLETED")
            t_start = float(marker.read_text())
            long_times = json.loads(times.read_text())
            checkpoint = long_times["exit"] - long_times["notice"]
            samples.append({"submit_to_start": t_start - t_submit, "checkpoint": checkpoint,
                            "overhead": (t_start - t_submit) - checkpoint})
            _cli(env, "hcancel", str(long))
            _wait(lambda: _state(env, long) == "CANCELLED")
    finally:
        subprocess.run([str(BIN / "hai-dev"), "down", "--dir", str(d)], capture_output=True)
        subprocess.run(["rm", "-rf", str(d)])
    return {"tick_s": tick, "reps": reps, "samples": samples,
            "overhead_median_s": statistics.median(s["overhead"] for s in samples),
            "overhead_max_s": max(s["overhead"] for s in samples),
            "checkpoint_median_s": statistics.median(s["checkpoint"] for s in samples)}
