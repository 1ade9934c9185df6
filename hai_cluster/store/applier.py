"""The applier: records a plan's starts, each re-checked inside its transaction.

A start holds only if the job is still pending, not held and at the version the policy saw, and
its placement still fits the nodes it touches, as they are now, by the policy's own test
(core.resources.placement_misfit, fits() rank by rank). A stale plan can then never double-book
GPUs, card shares, CPUs or memory; a refused start says why, and the next pass plans again."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from sqlalchemy import Engine

from ..core.model import NodeView, Placement
from ..core.resources import placement_misfit, take
from ..core.sharing import share_charge, share_of
from ..core.reservation import mark_nodes
from ..core.states import JobState
from . import reservations as reservation_store
from . import statements as st
from .events import Journal, journal
from .records import JobRecord, StartedRun
from .schema import jobs
from .views import full_spec, job_view, live_ranks, node_views


@dataclass(frozen=True)
class Refused:
    """A start that no longer holds, and why. False, as "nothing was started"."""
    job_id: int
    reason: str

    def __bool__(self) -> bool:
        return False


@dataclass(frozen=True)
class StartRequest:
    job_id: int
    placement: Placement
    version: int | None = None  # the job's version in the policy's snapshot; None: any


def start_runs(engine: Engine, starts: Sequence[StartRequest], now: float,
               events: Journal = None) -> list[StartedRun | Refused]:
    """Each of a pass's starts, in one transaction (a pass that starts many jobs waits for one
    sync, not one each); each is checked after those before it. `events(results)`: written in it."""
    if not starts:
        return []
    with engine.begin() as c:
        # The touched nodes as they are now, read once; each start accepted is counted in them.
        names = sorted({name for s in starts for name in s.placement.nodes})
        # ...under the reservations, as the policy saw them (a window may have opened since)
        views = {n.name: n for n in mark_nodes(node_views(c, live_ranks(c, names), names),
                                               reservation_store.live(c, now), now)}
        return journal(c, events, [start_run(c, s, now, views) for s in starts])


def start_run(c, start: StartRequest, now: float, views: dict[str, NodeView]) -> StartedRun | Refused:
    """In transaction `c`: record a run of `start`'s job on its placement, or refuse it. `views`:
    the nodes as they are in the transaction (a start recorded here is counted in them)."""
    job_id, placement = start.job_id, start.placement
    job = c.execute(st.JOB_BY_ID, {"p_id": job_id}).first()
    if job is None:
        return Refused(job_id, "no such job")
    if job.state != JobState.PENDING.value or job.hold:
        return Refused(job_id, "held" if job.hold else f"{job.state}, not pending")
    if start.version is not None and job.version != start.version:
        return Refused(job_id, "changed since the snapshot")
    view = job_view(job)
    if why := placement_misfit(view, placement, views):
        return Refused(job_id, why)
    attempt = job.attempts
    # -p a,b: the run is in the first candidate partition that holds all its nodes
    partition = next((p for p in job.partition.split(",")
                      if all(not views[n].partitions or p in views[n].partitions for n in placement.nodes)),
                     job.partition)
    started = dict(state=JobState.RUNNING.value, reason="None", start_time=now, end_time=None,
                   attempts=attempt + 1, nodelist=",".join(placement.nodes), version=job.version + 1,
                   partition=partition)
    res = c.execute(*st.update_by_id(jobs, job_id, started, version=job.version))
    if res.rowcount != 1:
        return Refused(job_id, "changed while starting")
    run_id = c.execute(st.RUN_INSERT, dict(
        job_id=job_id, attempt=attempt, state=JobState.RUNNING.value, start_time=now,
        # Whole GPUs held: a card share counts none; it is charged its share (gpu_charge).
        nodelist=",".join(placement.nodes), gpus=0 if placement.shares else sum(len(g) for g in placement.gpus),
        gpu_charge=_share_charge(job, placement, views) if placement.shares else None,
    )).inserted_primary_key[0]
    c.execute(st.RANK_INSERT, [dict(
        run_id=run_id, rank=rank, node=name, gpus=list(gpu_ids), cpus=view.rank_cpus(views[name].cpus),
        mem_mb=job.mem_mb or 0, state="starting", killed=False,
        gpu_mem_mb=placement.shares[rank][0] if placement.shares else None,
        gpu_compute=placement.shares[rank][1] if placement.shares else None,
        mig_uuid=(placement.mig[rank] or None) if placement.mig else None)
        for rank, (name, gpu_ids) in enumerate(zip(placement.nodes, placement.gpus))])
    take(view, placement, views)
    return StartedRun(JobRecord.of(job._mapping, full_spec(c, job), **started), attempt, run_id, tuple(placement.mig))


def _share_charge(job, placement: Placement, views: dict[str, NodeView]) -> float:
    """The GPU-equivalents a sharing run is charged: each rank's share of its card."""
    share = share_of(job.gpu_fraction, job.gpu_mem_mb, job.gpu_compute, job.gpu_qos)
    total = 0.0
    for rank, (name, gpu_ids) in enumerate(zip(placement.nodes, placement.gpus)):
        mem = next((g.memory_mb for g in views[name].gpus if g.index == gpu_ids[0]), 0)
        if placement.mig and placement.mig[rank]:  # a whole MIG instance: charged the instance
            inst_mem, inst_compute = placement.shares[rank]
            total += min(1.0, max(inst_mem / max(1, mem), inst_compute / 100))
        else:
            total += share_charge(share, mem)
    return round(total, 6)
