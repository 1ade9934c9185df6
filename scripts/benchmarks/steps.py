"""Job steps, hai-cluster and Slurm side by side: one batch script, submitted to both.

The script (SCRIPT below) asks for 4 nodes x 8 tasks and, from inside the allocation, times with
`date +%s.%N` around each call:
  - `srun hostname` over the 32 tasks, R times (a step's launch, its tasks' run and its end, as a
    training script's `srun torchrun ...` pays it once per launch);
  - one step whose 32 tasks each write 10 MB of 100-byte lines to srun's stdout, redirected to a
    file: bytes that arrive and seconds.
The script itself checks that every `srun hostname` printed 32 lines and that every byte arrived.
hai-cluster runs it on `hai-dev up --nodes 4 --cpus-per-node 64` (jobs as root, simulated GPUs),
Slurm on the peer `../shared/peers/slurm` (4 slurmd x 64 CPUs, its defaults), one after the
other, never both at once."""
from __future__ import annotations

import os
import re
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from . import slurm_peer
from .cluster_ops import DevCluster, log, pct

TASK_BYTES = 10_000_000
SCRIPT = """#!/bin/bash
#SBATCH -N 4 --ntasks-per-node=8 -J steps-bench
#SBATCH -o {out}/steps-%j.out
set -o pipefail
cd {out}
for i in $(seq {reps}); do
  t0=$(date +%s.%N); n=$(srun hostname | wc -l); rc=$?; t1=$(date +%s.%N)
  echo "launch $t0 $t1 $n $rc"
done
line=$(printf 'x%.0s' $(seq 99))
t0=$(date +%s.%N)
srun sh -c "yes $line | head -c {task_bytes}" > bytes.$SLURM_JOB_ID
rc=$?
t1=$(date +%s.%N)
echo "bytes $t0 $t1 $(wc -c < bytes.$SLURM_JOB_ID) $rc"
rm -f bytes.$SLURM_JOB_ID
echo done
"""


def parse(text: str, tasks: int = 32) -> dict:
    launches, bad = [], 0
    for m in re.finditer(r"^launch (\S+) (\S+) (\d+) (\d+)$", text, re.M):
        t0, t1, n, rc = float(m[1]), float(m[2]), int(m[3]), int(m[4])
        if n != tasks or rc != 0:
            bad += 1
        launches.append(t1 - t0)
    m = re.search(r"^bytes (\S+) (\S+) (\d+) (\d+)$", text, re.M)
    if not launches or not m:
        raise RuntimeError(f"the steps job printed no results:\n{text[-2000:]}")
    return {"launch_s": launches, "launch_bad": bad, "bytes_s": float(m[2]) - float(m[1]),
            "bytes_seen": int(m[3]), "bytes_rc": int(m[4]), "bytes_expected": tasks * TASK_BYTES}


def _wait_done(path: Path, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            text = path.read_text(errors="replace")
            if re.search(r"^done$", text, re.M):
                return text
        time.sleep(0.5)
    raise RuntimeError(f"{path} did not finish within {timeout} s: "
                       f"{path.read_text(errors='replace')[-1000:] if path.exists() else 'absent'}")


def _script(out: Path, reps: int) -> Path:
    path = out / "steps.sbatch"
    path.write_text(SCRIPT.format(out=out, reps=reps, task_bytes=TASK_BYTES))
    return path


def measure_hai(reps: int, timeout: float = 900) -> dict:
    c = DevCluster(nodes=4, gpus_per_node=8)
    try:
        script = _script(c.work, reps)
        jid = int(c.cli("hsubmit", "--parsable", str(script)).strip())
        return parse(_wait_done(c.work / f"steps-{jid}.out", timeout))
    finally:
        c.down()


def measure_slurm(reps: int, timeout: float = 900) -> dict:
    out = Path(tempfile.mkdtemp(prefix="hai-bench-steps-slurm-", dir="/tmp"))
    try:
        env_line = slurm_peer._peer("up")
        m = re.search(r"SLURM_CONF=(\S+)", env_line)
        if not m:
            raise RuntimeError(f"slurm peer up printed no SLURM_CONF: {env_line[-500:]}")
        env = {**os.environ, "SLURM_CONF": m[1].strip("'\"")}
        script = _script(out, reps)
        p = subprocess.run(["sbatch", "--parsable", str(script)], env=env, cwd=out, capture_output=True,
                           text=True, timeout=60)
        if p.returncode != 0:
            raise RuntimeError(f"sbatch failed: {p.stderr.strip()}")
        jid = int(p.stdout.strip().split(";")[0])
        r = parse(_wait_done(out / f"steps-{jid}.out", timeout))
        r["version"] = subprocess.run(["sbatch", "--version"], capture_output=True, text=True, env=env).stdout.strip()
        return r
    finally:
        try:
            slurm_peer._peer("down", timeout=120)
        finally:
            subprocess.run(["rm", "-rf", str(out)])


def _row(label: str, unit: str, mine: float, theirs: float | None) -> str:
    if theirs is None:
        return f"| {label} | {unit} | {mine:.3f} | — | — |"
    return f"| {label} | {unit} | {mine:.3f} | {theirs:.3f} | {mine / theirs:.2f}× |"


def section(args) -> str:
    reps = max(args.reps * 4, 10)
    log(f"steps: hai-dev, {reps} x srun hostname over 4 x 8 tasks, then 32 x 10 MB")
    ours = measure_hai(reps)
    theirs, how = None, "not measured (`--slurm none`)"
    if args.slurm == "live":
        log("steps: the same script on the Slurm peer")
        try:
            theirs = measure_slurm(reps)
            how = f"{theirs['version']}, measured live right after hai-cluster"
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            log(f"steps: the Slurm peer failed: {exc}")
            how = f"the Slurm peer failed ({str(exc)[:200]})"
    rows = ["| measurement | unit | hai-cluster | Slurm | hai / Slurm |", "|---|---|---|---|---|"]
    for q in (50, 95):
        rows.append(_row(f"`srun hostname`, 4 nodes x 8 tasks, p{q} of {len(ours['launch_s'])}", "s",
                         pct(ours["launch_s"], q), pct(theirs["launch_s"], q) if theirs else None))
    rows.append(_row("`srun` of 32 tasks x 10 MB of lines into one file", "s", ours["bytes_s"],
                     theirs["bytes_s"] if theirs else None))
    mb = ours["bytes_expected"] / 1e6
    rows.append(_row("… throughput", "MB/s", mb / ours["bytes_s"], mb / theirs["bytes_s"] if theirs else None))

    def checked(r):
        return (f"{r['bytes_seen']:,} of {r['bytes_expected']:,} bytes arrived (srun exit {r['bytes_rc']}), "
                f"{len(r['launch_s']) - r['launch_bad']} of {len(r['launch_s'])} launches printed 32 lines "
                f"(median {statistics.median(r['launch_s']):.3f} s)")
    return ("### Job steps: `srun` inside a 4-node job\n\n"
            "One batch script for both (`scripts/benchmarks/steps.py`): `#SBATCH -N 4 --ntasks-per-node=8`; "
            "inside it, `date +%s.%N` around each `srun hostname | wc -l` (launch, run and end of a "
            "32-task step) and around one `srun` whose 32 tasks write 10 MB of 100-byte lines each into "
            "srun's stdout, a file. hai-cluster: `hai-dev up --nodes 4 --cpus-per-node 64` (jobs as root; "
            f"srun's tasks on other nodes go agent → controller → agent). Slurm: {how}, the peer "
            "`../shared/peers/slurm` (4 slurmd on this machine, its defaults).\n\n"
            + "\n".join(rows) + f"\n\nChecked by the script: hai-cluster {checked(ours)}"
            + (f"; Slurm {checked(theirs)}." if theirs else "."))
