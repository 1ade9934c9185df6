"""What the store's rows are made of and read as: a job's columns from its spec, the policy's
node and job views, and a job's whole spec.

One place builds each: the snapshot, the applier's re-check, the submission's fit check and the
--test-only probe all get their JobView from job_view()."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Mapping, Sequence

from sqlalchemy import select

from ..core.constraint import parse_constraint
from ..core.model import GpuInfo, JobSpec, JobView, NodeView
from ..core.sharing import share_of
from ..core.states import JobState
from . import statements as st
from .schema import gpus, nodes


def required_runtime(spec: JobSpec) -> str | None:
    """What a node must offer to run this job (None: anything, as plain processes do)."""
    if spec.runtime and spec.runtime != "none":
        return spec.runtime
    return "container" if spec.container_image and not spec.runtime else None


def spec_columns(spec: JobSpec) -> dict:
    """The job table's columns that copy the spec, for the snapshot and the listings: derived here
    alone, when a job is submitted and whenever its spec changes (update_pending)."""
    return dict(
        name=spec.name, priority=spec.priority, nodes=spec.nodes, gpus_per_node=spec.gpus_per_node,
        cpus_per_task=spec.cpus_per_task, tasks_per_node=spec.tasks_per_node, mem_mb=spec.mem_mb,
        time_limit=spec.time_limit,
        preemptible=spec.requeue, resumes=spec.resumes, runtime=required_runtime(spec),
        exclusive=spec.exclusive, required_nodes=",".join(spec.required_nodes) or None,
        excluded_nodes=",".join(spec.excluded_nodes) or None, constraint=spec.constraint, qos=spec.qos,
        nice=spec.nice, reservation=spec.reservation, interactive=spec.interactive, overcommit=spec.overcommit,
        begin_time=spec.begin_time,
        dependency=spec.dependency, gpu_fraction=spec.gpu_fraction, gpu_mem_mb=spec.gpu_mem_mb,
        gpu_compute=spec.gpu_compute, gpu_qos=spec.gpu_qos)


def job_columns(spec: JobSpec, *, user: str, uid: int, gid: int, partition: str, now: float,
                account: str = "default") -> dict:
    """The job table's columns of a new job: its spec's, and the state of a job just submitted."""
    return dict(
        spec_columns(spec), user=user, uid=uid, gid=gid, partition=partition,
        # a held job's reason is known now (the pass that would set it is not woken: api.submit)
        state=JobState.PENDING.value, reason=spec.reason_at_submission or "None", submit_time=now,
        hold=spec.hold, restart_count=0, attempts=0, nodelist="", attained_gpu_seconds=0.0, version=1,
        pending_since=now, hold_admin=False, account=account)


def probe_view(spec: JobSpec, *, job_id: int, user: str, partition: str, now: float,
               account: str = "default", dependency: str | None = None) -> JobView:
    """The view a job of `spec` would have once submitted (the fit check, --test-only)."""
    row = SimpleNamespace(id=job_id, start_time=None, last_run_end=None, array_job_id=None, array_task_limit=None,
                          **job_columns(spec, user=user, uid=-1, gid=-1, partition=partition, now=now,
                                        account=account))
    return job_view(row, dependency=dependency)


def full_spec(c, job) -> dict:
    """A job row's spec: an array task's is its array's (stored once) with the task's own changes."""
    if job.array_job_id is not None:
        base = c.execute(st.ARRAY_SPEC_OF, {"p_id": job.array_job_id}).scalar()
        if base is not None:
            return {**base, **job.spec}
    return job.spec


def live_ranks(c, names: Sequence[str] | None = None) -> list:
    """The ranks not ended (of runs on `names`, or everywhere), with their job and charge, in rank order."""
    if names is None:
        return c.execute(st.LIVE_RANKS).all()
    return c.execute(st.LIVE_RANKS_ON, {"p_names": list(names)}).all()


def shared_use(ranks) -> tuple[tuple[int, int, int, int], ...]:
    """Per card holding shares: (index, MiB, reserved compute %, ranks), from live sharing ranks."""
    use: dict[int, list[int]] = {}
    for r in ranks:
        if r.gpu_mem_mb is not None:
            for i in r.gpus:
                u = use.setdefault(i, [0, 0, 0])
                u[0], u[1], u[2] = u[0] + r.gpu_mem_mb, u[1] + (r.gpu_compute or 0), u[2] + 1
    return tuple((i, *u) for i, u in sorted(use.items()))


def node_views(c, live, names: Sequence[str] | None = None) -> tuple[NodeView, ...]:
    """The nodes (all, or those named) as the policy sees them, holding the `live` ranks."""
    if names is None:
        node_rows = c.execute(select(nodes)).all()
        gpu_rows = c.execute(select(gpus).order_by(gpus.c.node, gpus.c.index)).all()
    else:
        node_rows = c.execute(st.NODES_NAMED, {"p_names": list(names)}).all()
        gpu_rows = c.execute(st.GPUS_ON, {"p_names": list(names)}).all()
    used: dict[str, list] = {}
    for r in live:
        used.setdefault(r.node, []).append(r)
    node_gpus: dict[str, list[GpuInfo]] = {}
    for g in gpu_rows:
        node_gpus.setdefault(g.node, []).append(GpuInfo(
            g.index, g.uuid, g.name, g.memory_mb, shareable=g.shareable, isolation=g.isolation,
            links=tuple(tuple(x) for x in g.links or ()), mig=tuple(tuple(m) for m in g.mig or ())))
    return tuple(
        NodeView(
            name=n.name, gpus=tuple(node_gpus.get(n.name, ())), cpus=n.cpus, mem_mb=n.mem_mb,
            partitions=tuple(n.partitions), state=n.state, responding=n.responding,
            used_gpus=frozenset(i for r in used.get(n.name, ()) for i in r.gpus),
            used_cpus=sum(r.cpus for r in used.get(n.name, ())),
            used_mem_mb=sum(r.mem_mb for r in used.get(n.name, ())),
            runtimes=tuple(n.runtimes or ("none",)), container_runtime=n.container_runtime,
            shared=shared_use(used.get(n.name, ())),
            mig_used=frozenset(r.mig_uuid for r in used.get(n.name, ()) if r.mig_uuid),
            features=frozenset(n.features or ()),
        )
        for n in node_rows
    )


def job_view(j, ranks=(), dependency: str | None = None) -> JobView:
    """A job row (the snapshot's columns at least) as the policy sees it, holding `ranks`."""
    return JobView(
        id=j.id, user=j.user, state=JobState(j.state), submit_time=j.submit_time, nodes=j.nodes,
        gpus_per_node=j.gpus_per_node, cpus_per_task=j.cpus_per_task, tasks_per_node=j.tasks_per_node,
        overcommit=bool(j.overcommit), mem_mb=j.mem_mb,
        partition=j.partition, priority=j.priority, hold=j.hold, held_by_admin=j.hold_admin,
        restart_count=j.restart_count,
        attained_gpu_seconds=j.attained_gpu_seconds, run_start=j.start_time,
        nodelist=tuple(x for x in j.nodelist.split(",") if x),
        allocation=tuple((r.node, tuple(r.gpus)) for r in ranks),
        preemptible=j.preemptible, resumable=j.resumes is not None, exclusive=bool(j.exclusive),
        required_nodes=tuple(j.required_nodes.split(",")) if j.required_nodes else (),
        excluded_nodes=tuple(j.excluded_nodes.split(",")) if j.excluded_nodes else (),
        constraint=parse_constraint(j.constraint) if j.constraint else None, qos=j.qos or "normal", nice=j.nice or 0, reservation=j.reservation,
        pending_since=j.pending_since, last_run_end=j.last_run_end,
        time_limit=j.time_limit, runtime=j.runtime, begin_time=j.begin_time, array_job_id=j.array_job_id,
        array_task_limit=j.array_task_limit, dependency=dependency, account=j.account or "default",
        gpu_share=share_of(j.gpu_fraction, j.gpu_mem_mb, j.gpu_compute, j.gpu_qos),
        gpu_charge=(ranks[0].gpu_charge or 0.0) if ranks else 0.0,
        mig=tuple(r.mig_uuid or "" for r in ranks) if any(r.mig_uuid for r in ranks) else (),
        interactive=bool(j.interactive), version=j.version)


class JobViews:
    """The snapshot's JobViews, those of jobs whose row is as it was last pass reused: 10,000
    pending jobs cost ~0.2 s to rebuild (a frozen dataclass of 45 fields each) and compare in a
    few ms. Only jobs holding no ranks (a running job's view is its ranks' too). Keeps the last
    snapshot's jobs only; one store thread calls it (as load_snapshot)."""

    def __init__(self) -> None:
        self._last: dict[int, tuple[tuple, JobView]] = {}

    def build(self, rows, held: Mapping[int, Sequence], waits: Mapping[int, str]) -> tuple[JobView, ...]:
        last, kept, out = self._last, {}, []
        for j in rows:
            ranks, dependency = held.get(j.id, ()), waits.get(j.id)
            if ranks:
                out.append(job_view(j, ranks, dependency))
                continue
            key = (tuple(j), dependency)
            hit = last.get(j.id)
            view = hit[1] if hit is not None and hit[0] == key else job_view(j, (), dependency)
            kept[j.id] = (key, view)
            out.append(view)
        self._last = kept
        return tuple(out)

