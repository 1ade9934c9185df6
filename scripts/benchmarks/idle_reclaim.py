"""Idle reclamation's cost on the controller's scheduling pass (controller/reclaim.py): one
Reclaimer.check over N running interactive jobs of 8 GPUs with S new samples each, busy, idle
(the clocks start: one store write of N rows, stubbed here), idle again, and a pass with no new
samples. The store and the agents are stubs: this is the pass's CPU work only.

    .venv/bin/python scripts/benchmarks/idle_reclaim.py 1000 1
"""
import asyncio
import sys
import time
from types import SimpleNamespace
from hai_cluster.config.controller import ControllerConfig
from hai_cluster.config import TelemetryConfig
from hai_cluster.controller.telemetry import Rollup, TelemetryHub
from hai_cluster.controller.reclaim import Reclaimer
from hai_cluster.controller.events import EventLog
from hai_cluster.core.model import JobView, Snapshot
from hai_cluster.core.states import JobState
from hai_cluster.store import idle as store

N, S = int(sys.argv[1]), int(sys.argv[2])
hub = TelemetryHub(TelemetryConfig())
saved = []
async def db(fn, *a, **kw):
    if fn is store.running_clocks: return {}
    if fn is store.save_clocks: saved.append(len(a[1])); return None
    raise AssertionError(fn)
ctl = SimpleNamespace(cfg=ControllerConfig(), telemetry=hub, db=db, repo=SimpleNamespace(engine=None),
                      events=EventLog(), links={}, spawn=lambda c: c.close(),
                      client_steps=SimpleNamespace(tell=lambda *a: None))
r = Reclaimer(ctl)
jobs = tuple(JobView(id=i, user="u", state=JobState.RUNNING, submit_time=0, nodes=1, gpus_per_node=8,
                     interactive=True, allocation=(("n1", tuple(range(8))),)) for i in range(N))
snap = Snapshot(now=0.0, jobs=jobs, nodes=())
def feed(t0, util):
    gpus = [{"index": g, "util": util, "mem_used_mb": 0, "mem_total_mb": 1, "power_w": 1.0, "temp_c": 1, "sm_mhz": 1,
             "ecc_corrected": 0, "ecc_uncorrected": 0} for g in range(8)]
    for s in range(S):
        for i in range(N):
            rollup = hub.rollups.setdefault((i, 0), Rollup())
            rollup.add([float(util)] * 8, 8.0, 1.0, 0, 1.0, t0 + s, 0)
async def main():
    for label, util in (("busy", 90), ("idle (clocks start: one store write)", 0), ("idle (clocks running)", 0)):
        feed(time.time(), util)
        t = time.perf_counter()
        await r.check(snap)
        print(f"{label}: {N} jobs x {S} samples: {1000 * (time.perf_counter() - t):.1f} ms, rows written {saved[-1] if saved else 0}")
        saved.clear()
    t = time.perf_counter()
    await r.check(snap)
    print(f"no new samples: {N} jobs: {1000 * (time.perf_counter() - t):.1f} ms")
asyncio.run(main())
