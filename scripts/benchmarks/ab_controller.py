"""A/B of the controller between two checkouts, interleaved in one run (docs/BENCHMARKS.md):
controller CPU per drained job and drain rate on a one-node dev cluster, and the applier's time
per start (start_runs of 400 one-GPU starts on 50 nodes, SQLite, in a subprocess per tree).

    .venv/bin/python scripts/benchmarks/ab_controller.py OLD_TREE NEW_TREE [jobs] [reps]

A tree is a checkout (git worktree add /tmp/old <commit>); each is run through PYTHONPATH with
this venv's interpreter, C helpers and hai-dev."""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent
TICK = os.sysconf("SC_CLK_TCK")
APPLY = """
import tempfile, time
from hai_cluster.core.model import JobSpec, Placement
from hai_cluster.store.engine import make_engine, upgrade
from hai_cluster.store.repository import Repository
d = tempfile.mkdtemp()
eng = make_engine(f"sqlite:///{d}/hai.db"); upgrade(eng)
r = Repository(eng)
names = [f"n{i:02d}" for i in range(50)]
r.register_nodes([(n, "10.0.0.1", ["gpu"]) for n in names], now=0.0)
for n in names:
    r.update_inventory(n, {"cpus": 64, "mem_mb": 512000, "gpu_backend": "simulated", "gpus": [
        {"index": i, "uuid": f"{n}{i}", "name": "sim", "memory_mb": 80000} for i in range(8)]}, now=1.0)
    r.set_responding(n, True, now=1.0)
ids = [r.submit(JobSpec(script="#!/bin/sh\\ntrue\\n", workdir="/tmp", gpus_per_node=1), user="u", uid=1, gid=1,
                partition="gpu", now=2.0) for _ in range(400)]
t = time.perf_counter()
out = r.start_runs([(j, Placement((names[k // 8],), ((k % 8,),))) for k, j in enumerate(ids)], now=3.0)
assert all(out)
print(time.perf_counter() - t)
"""


def cpu_of(pid: int) -> float:
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / TICK


def drain(tree: str, jobs: int) -> tuple[float, float]:
    """(controller CPU ms per job, jobs/s) for `jobs` trivial jobs submitted one by one and drained."""
    d = Path(tempfile.mkdtemp(prefix="hai-bench-ab-", dir="/tmp"))
    env = {**os.environ, "PYTHONPATH": tree}
    up = subprocess.run([str(BIN / "hai-dev"), "up", "--dir", str(d), "--nodes", "1", "--gpus-per-node", "8",
                         "--cpus-per-node", "64", "--gpu-backend", "simulated", "--tick", "1.0"],
                        capture_output=True, text=True, cwd=d, env=env)
    if up.returncode != 0:
        raise RuntimeError(up.stderr)
    try:
        ctl = json.loads((d / "cluster.json").read_text())["procs"]["controller"]["pid"]
        env = {**env, "HAI_CONTROLLER": up.stdout.split("=", 1)[1].strip(), "PATH": f"{BIN}:{os.environ['PATH']}"}
        work = d / "work"
        work.mkdir()
        c0, t0 = cpu_of(ctl), time.time()
        for _ in range(jobs):
            subprocess.run([str(BIN / "hsubmit"), "--parsable", "-o", "/dev/null", "-D", str(work), "--wrap", "true"],
                           env=env, cwd=work, check=True, capture_output=True)
        while subprocess.run([str(BIN / "hqueue"), "-h", "-o", "%i"], env=env, capture_output=True,
                             text=True).stdout.split():
            time.sleep(0.2)
        return (cpu_of(ctl) - c0) / jobs * 1000, jobs / (time.time() - t0)
    finally:
        subprocess.run([str(BIN / "hai-dev"), "down", "--dir", str(d), "--remove"], capture_output=True, env=env)


def apply_us(tree: str) -> float:
    out = subprocess.run([sys.executable, "-c", APPLY], env={**os.environ, "PYTHONPATH": tree}, cwd="/tmp",
                         capture_output=True, text=True, check=True).stdout
    return float(out) / 400 * 1e6


def main() -> None:
    old, new = sys.argv[1], sys.argv[2]
    jobs = int(sys.argv[3]) if len(sys.argv) > 3 else 300
    reps = int(sys.argv[4]) if len(sys.argv) > 4 else 4
    res: dict[str, dict[str, list[float]]] = {n: {"cpu": [], "rate": [], "apply": []} for n in ("old", "new")}
    for r in range(reps):
        for name, tree in ((("old", old), ("new", new)) if r % 2 == 0 else (("new", new), ("old", old))):
            cpu, rate = drain(tree, jobs)
            res[name]["cpu"].append(cpu)
            res[name]["rate"].append(rate)
            res[name]["apply"] += [apply_us(tree) for _ in range(3)]
            print(f"{name}: controller {cpu:.2f} ms/job, drain {rate:.1f} jobs/s", flush=True)
    for name, v in res.items():
        print(f"{name}: controller CPU per drained job median {statistics.median(v['cpu']):.2f} ms "
              f"({', '.join(f'{x:.2f}' for x in v['cpu'])}); drain median {statistics.median(v['rate']):.1f} jobs/s; "
              f"applier median {statistics.median(v['apply']):.0f} us/start")


if __name__ == "__main__":
    main()
