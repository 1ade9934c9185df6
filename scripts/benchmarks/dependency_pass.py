"""What pending jobs' long --dependency lists cost a scheduling pass (Repository.load_snapshot).

Two stores of one user's jobs (SQLite in a temporary directory, built through Repository.submit):
- settled: 2,742 pending jobs, each `afterok` on 61 jobs of which 60 have completed and one runs
  (the tenth audit's flood);
- open: 5 held arrays of 1,000 tasks and 5,000 pending jobs, each `afterok` on the 5 arrays and
  65 of their tasks, nothing decided (the most one user's default max_pending of 10,000 allows).
Each is timed with the store's dependency book kept from pass to pass (as the controller runs)
and with a fresh book every pass (every term looked up and evaluated anew, as before the book).
"""
from __future__ import annotations

import random
import statistics
import tempfile
import time
from pathlib import Path

from hai_cluster.core.model import JobSpec
from hai_cluster.store.dependencies import DependencyBook
from hai_cluster.store.engine import make_engine, upgrade
from hai_cluster.store.repository import Repository


def _spec(**kw) -> JobSpec:
    return JobSpec.from_wire({"script": "#!/bin/sh\ntrue\n", "workdir": "/tmp", **kw})


def _submit(repo: Repository, **kw) -> int:
    return repo.submit(_spec(**kw), user="u", uid=1, gid=1, partition="gpu", now=1.0)


def _settled(repo: Repository) -> None:
    running = _submit(repo)
    done = [_submit(repo) for _ in range(3000)]
    with repo.engine.begin() as c:
        c.exec_driver_sql("UPDATE jobs SET state='COMPLETED', attempts=1 WHERE id > ?", (running,))
        c.exec_driver_sql("UPDATE jobs SET state='RUNNING', attempts=1 WHERE id = ?", (running,))
    for k in range(2742):
        ids = [running] + [done[(k * 61 + j) % len(done)] for j in range(60)]
        _submit(repo, dependency="afterok:" + ":".join(map(str, ids)))


def _open(repo: Repository) -> None:
    arrays = [_submit(repo, array="0-999", hold=True) for _ in range(5)]
    rng = random.Random(1)
    for _ in range(5000):
        terms = [str(a) for a in arrays] + [f"{rng.choice(arrays)}_{rng.randrange(1000)}" for _ in range(65)]
        _submit(repo, dependency="afterok:" + ":".join(terms))


def _passes(repo: Repository, reps: int, keep: bool) -> float:
    repo.load_snapshot(10.0)  # the first pass reads every dependency either way
    times = []
    for _ in range(reps):
        if not keep:
            repo._dependencies = DependencyBook()
        t0 = time.perf_counter()
        repo.load_snapshot(10.0)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(reps: int = 5) -> list[dict]:
    rows = []
    for name, fill in (("settled", _settled), ("open", _open)):
        with tempfile.TemporaryDirectory() as d:
            engine = make_engine(f"sqlite:///{Path(d) / 'hai.db'}")
            upgrade(engine)
            repo = Repository(engine)
            fill(repo)
            pending = len(repo.load_snapshot(10.0).jobs)
            rows.append({"store": name, "jobs": pending, "kept_s": _passes(repo, reps, True),
                         "fresh_s": _passes(repo, reps, False)})
            engine.dispose()
    return rows


def section(args=None) -> str:
    reps = getattr(args, "reps", 5)
    lines = ["| store | jobs in the snapshot | pass, book kept (as run) | pass, book afresh |", "|---|---|---|---|"]
    for r in measure(reps):
        lines.append(f"| {r['store']} | {r['jobs']} | {r['kept_s'] * 1000:.0f} ms | {r['fresh_s'] * 1000:.0f} ms |")
    return ("### Long dependency lists in a scheduling pass\n\n" + __doc__.split("\n\n", 1)[1].strip()
            + f" Median of {reps} passes.\n\n" + "\n".join(lines))
