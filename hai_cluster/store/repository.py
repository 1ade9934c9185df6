"""Reads and writes of the job table. Synchronous; the controller runs it on one worker thread.

Starts are recorded by the applier (store/applier.py), which re-checks each one in its transaction.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import Any, Iterable, Mapping, Sequence

from sqlalchemy import ColumnElement, Engine, and_, bindparam, case, delete, func, insert, or_, select, update

from ..core.constraint import FEATURE_NAME
from ..core.dependency import Target, Targets, summarize
from ..core.jobids import parse_array
from ..core.model import JobSpec, JobView, NodeView, Placement, Snapshot, held_reason
from ..core.outcome import combine, job_state_after
from ..core.resources import why_waiting
from ..core.states import ACTIVE_STATES, FINAL_STATES, JobState
from ..protocol.runspec import RunStatus
from . import applier, listing, submit_keys
from . import reservations as reservation_store
from . import statements as st
from .applier import Refused, StartRequest
from .dependencies import DependencyBook
from .events import Journal, journal
from .records import JobRecord, StartedRun
from .schema import array_specs, gpus, jobs, nodes, run_ranks, runs
from .steps import StepBook, close_open
from .views import JobViews, full_spec, job_columns, job_view, live_ranks, node_views, probe_view, spec_columns

ACTIVE = [s.value for s in ACTIVE_STATES]
FINAL = [s.value for s in FINAL_STATES]
NOT_RESPONDING = "Not responding"
REASON_LEN = 200  # jobs.reason and runs.reason (schema.py)
RUNS_SHOWN = 1000  # runs of one job in a reply (show job, hacct, hstat): the newest
CANCEL_CHUNK = 500  # ids per IN (...): SQLite before 3.32 takes at most 999 parameters
SNAPSHOT_COLUMNS = [jobs.c[name] for name in (
    "id", "user", "state", "submit_time", "nodes", "gpus_per_node", "cpus_per_task", "mem_mb", "partition",
    "priority", "hold", "hold_admin", "version", "restart_count", "attained_gpu_seconds", "start_time", "nodelist",
    "preemptible", "pending_since", "last_run_end", "time_limit", "runtime", "begin_time", "array_job_id",
    "array_task_limit", "dependency", "name", "account", "gpu_fraction", "gpu_mem_mb", "gpu_compute", "gpu_qos",
    "tasks_per_node", "resumes", "exclusive", "required_nodes", "excluded_nodes", "constraint", "qos", "nice", "reservation",
    "interactive", "overcommit")]
# What job listings return: everything but the spec (script and environment can be large).
LISTING_COLUMNS = [c for c in jobs.c if c.name not in ("spec", "spec_bytes")]


@dataclass(frozen=True)
class RankRef:
    job_id: int
    attempt: int
    rank: int
    node: str
    gpus: tuple[int, ...]
    state: str  # starting | running
    mig: str | None = None  # the MIG instance a sharing rank holds


@dataclass(frozen=True)
class RankEnd:
    """What the controller must do after a rank's end was recorded."""
    recorded: bool  # False: the rank was unknown or already ended (a duplicate report)
    run_state: JobState | None = None  # set when the whole run has ended
    job_state: JobState | None = None
    stop_ranks: tuple[RankRef, ...] = ()  # other ranks still alive after a failure


def _row(r) -> dict:
    return dict(r._mapping)


def usage_of(ranks: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A run's cgroup figures from its ranks': CPU seconds summed, memory peaks' max and mean
    (None where no rank had a cgroup to tell)."""
    cpu = [r["cpu_seconds"] for r in ranks if r.get("cpu_seconds") is not None]
    peaks = [r["mem_peak_kb"] for r in ranks if r.get("mem_peak_kb") is not None]
    return {"cpu_seconds": round(sum(cpu), 3) if cpu else None, "max_rss_kb": max(peaks) if peaks else None,
            "ave_rss_kb": round(sum(peaks) / len(peaks)) if peaks else None}


def _ended_rank(ranks: Sequence[Mapping[str, Any]], node: str) -> int | None:
    return next((r["rank"] for r in ranks if r["node"] == node), None)


def spec_size(wire: Mapping[str, Any]) -> int:
    """The bytes a spec takes in the store (its JSON), as [limits] max_pending_bytes counts them."""
    return len(json.dumps(wire, separators=(",", ":")).encode())


# What leaves the store when a job is final: its script and environment (all but a few hundred
# bytes of the spec). Slurm, too, keeps a batch script only while the job lives. Without this a
# user submitting and cancelling 4 MiB held jobs in a loop grew the store by 39 MB/s.
PAYLOAD = {"script": "", "environment": {}}


def _without_payload(spec: Mapping[str, Any]) -> dict:
    return {**spec, **{k: v for k, v in PAYLOAD.items() if k in spec}}


def drop_payloads(c, job_ids: Sequence[int]) -> None:
    """In transaction `c`: the final jobs `job_ids` keep their spec without its payload, and an
    array's spec (array_specs) loses its payload once the last of its tasks is final."""
    if not job_ids:
        return
    rows = c.execute(select(jobs.c.id, jobs.c.spec, jobs.c.array_job_id).where(jobs.c.id.in_(list(job_ids)))).all()
    changed = [st.update_by_id(jobs, r.id, {"spec": spec, "spec_bytes": spec_size(spec)})
               for r in rows if any(r.spec.get(k) for k in PAYLOAD) for spec in [_without_payload(r.spec)]]
    if changed:
        c.execute(changed[0][0], [params for _, params in changed])  # one executemany
    for array_id in {r.array_job_id for r in rows if r.array_job_id is not None}:
        live = c.execute(select(jobs.c.id).where(jobs.c.array_job_id == array_id,
                                                  jobs.c.state.notin_(FINAL))).first()
        base = c.execute(st.ARRAY_SPEC_OF, {"p_id": array_id}).scalar()
        if live is None and base is not None and any(base.get(k) for k in PAYLOAD):
            base = _without_payload(base)
            c.execute(update(array_specs).where(array_specs.c.array_job_id == array_id).values(spec=base))
            c.execute(*st.update_by_id(jobs, array_id, {"spec_bytes": spec_size(base)}))


def _selected(c, ids: Sequence[int] | None, tasks: Sequence[tuple[int, int]] | None):
    """Jobs named by id (an array's id names all its tasks) or by (array id, task id). Tasks are
    first turned into job ids, a few arrays a query (seeks in ix_jobs_array_task): SQLite plans a
    row-value IN of two pairs or more as a scan of the whole table (eleventh audit: 0.38 s)."""
    terms = []
    if ids:
        terms += [jobs.c.id.in_(list(ids)), jobs.c.array_job_id.in_(list(ids))]
    if tasks:
        terms.append(jobs.c.id.in_(_task_ids(c, tasks)))
    return or_(*terms)


def _task_ids(c, tasks: Sequence[tuple[int, int]]) -> list[int]:
    return [r.id for r in _task_rows(c, tasks, jobs.c.id)]


def _task_rows(c, tasks: Sequence[tuple[int, int]], *columns) -> list:
    """`columns` of the jobs that are these (array id, task id) pairs: seeks, a few arrays a query."""
    return [r for chunk in _task_chunks(sorted(set(tasks))) for r in c.execute(select(*columns).where(or_(*(
        and_(jobs.c.array_job_id == a, jobs.c.array_task_id.in_(ts)) for a, ts in chunk))))]


def _id_rows(c, ids: Sequence[int], *columns) -> list:
    """`columns` of the jobs with these ids: primary-key seeks, CANCEL_CHUNK ids a query."""
    ids = sorted(set(ids))
    return [r for k in range(0, len(ids), CANCEL_CHUNK)
            for r in c.execute(select(*columns).where(jobs.c.id.in_(ids[k:k + CANCEL_CHUNK])))]


def _id_walks(c, ids: Sequence[int], tasks: Sequence[tuple[int, int]]) -> list[tuple[ColumnElement, ...] | listing.NamedIds]:
    """The walks of a listing by ids (store/listing.py): one down ix_jobs_array_id for each array
    named by its id (its first task's job id, whose row says array_job_id = id), and one down the
    primary key for the other jobs named, tasks named by (array, task) among them. A page then
    examines a budget of rows, not every task of every array named (eleventh audit: 1,000 array
    ids sorted their 1,000,000 tasks for each page, 0.4-0.6 s)."""
    named = {r.id: r.array_job_id for r in _id_rows(c, ids, jobs.c.id, jobs.c.array_job_id)}  # id -> its array
    named.update((r.id, r.array_job_id) for r in _task_rows(c, tasks, jobs.c.id, jobs.c.array_job_id))
    arrays = sorted({i for i in ids if named.get(i, -1) == i})
    if len(arrays) > listing.MAX_FILTER_VALUES:
        raise listing.TooManyValues(f"at most {listing.MAX_FILTER_VALUES} arrays in one listing by id, "
                                    f"got {len(arrays)}")
    whole = set(arrays)
    others = sorted(i for i, a in named.items() if a not in whole)
    walks = [(jobs.c.array_job_id == a,) for a in arrays]
    return walks + ([listing.NamedIds(tuple(others))] if others else [])


def _task_chunks(tasks: Sequence[tuple[int, int]], arrays: int = 100) -> list[list[tuple[int, list[int]]]]:
    """(array id, its task ids) groups, a few arrays and CANCEL_CHUNK task ids a query: SQLite
    seeks `array_job_id = ? AND array_task_id IN (...)` in ix_jobs_array_task, where a row-value
    IN of the pairs scans the whole index."""
    by_array: dict[int, list[int]] = {}
    for a, t in tasks:
        by_array.setdefault(a, []).append(t)
    chunks: list[list[tuple[int, list[int]]]] = [[]]
    size = 0
    for a, ts in by_array.items():
        for k in range(0, len(ts), CANCEL_CHUNK):
            part = ts[k:k + CANCEL_CHUNK]
            if chunks[-1] and (len(chunks[-1]) == arrays or size + len(part) > CANCEL_CHUNK):
                chunks.append([])
                size = 0
            chunks[-1].append((a, part))
            size += len(part)
    return [c for c in chunks if c]


def _with_shares(c, rows: list[dict]) -> list[dict]:
    """Add gpu_share_mb, the card memory the current run of a sharing job got (rank 0's), and
    gpu_charge, the GPU-equivalents that run is charged."""
    ids = [r["id"] for r in rows if r.get("gpu_fraction") is not None or r.get("gpu_mem_mb") is not None]
    if ids:
        given: dict[int, tuple] = {}
        mig: dict[int, list[str]] = {}
        for j, rank, mb, charge, inst in c.execute(
                select(runs.c.job_id, run_ranks.c.rank, run_ranks.c.gpu_mem_mb, runs.c.gpu_charge, run_ranks.c.mig_uuid)
                .join(runs, runs.c.id == run_ranks.c.run_id)
                .where(runs.c.job_id.in_(ids), st.LIVE).order_by(run_ranks.c.rank)):
            if rank == 0:
                given[j] = (mb, charge)
            mig.setdefault(j, []).append(inst or "")
        for r in rows:
            r["gpu_share_mb"], r["gpu_charge"] = given.get(r["id"], (None, None))
            r["gpu_mig"] = mig[r["id"]] if any(mig.get(r["id"], ())) else []
    return rows


def _gpu_sharing(g: Mapping[str, Any]) -> dict[str, Any]:
    """The sharing fields of an agent's GPU report; agents that predate sharing send none."""
    isolation = str(g.get("isolation") or "none")
    links = [[int(x) for x in link][:3] for link in g.get("links") or () if len(link) >= 3]
    mig = [[str(m[0]), str(m[1]), int(m[2]), int(m[3])] for m in g.get("mig") or () if len(m) >= 4]
    return {"shareable": bool(g.get("shareable", False)),
            "isolation": isolation if isolation in ("mps", "mig", "none") else "none", "links": links, "mig": mig}


class Repository:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        # What of each pending job's dependency is still open, from pass to pass (one store
        # thread calls load_snapshot, so no lock).
        self._dependencies = DependencyBook()
        self._views = JobViews()  # the last snapshot's, for the next (load_snapshot alone)
        self.steps = StepBook(engine)

    # ---- submission and user actions -------------------------------------------------------
    def submit(self, spec: JobSpec, *, user: str, uid: int, gid: int, partition: str, now: float,
               account: str = "default", key: str | None = None, events: Journal = None) -> int:
        """Record a job, or every task of an array in one transaction. Returns the (array) job id.
        `key`: the client's idempotency key; a submission with a key this uid used within the day
        records nothing and returns that job (a retry after a lost reply). `events(job id)`: the
        submission's events, written in its transaction (not called for such a retry)."""
        with self.engine.begin() as c:
            if key is not None and (known := submit_keys.job_of(c, uid, key)) is not None:
                return known
            job_id = self._insert_job(c, spec, user=user, uid=uid, gid=gid, partition=partition, now=now,
                                      account=account)
            if key is not None:
                submit_keys.add(c, uid, key, job_id, now)
            return journal(c, events, job_id)

    @staticmethod
    def _insert_job(c, spec: JobSpec, *, user: str, uid: int, gid: int, partition: str, now: float,
                    account: str) -> int:
        row = job_columns(spec, user=user, uid=uid, gid=gid, partition=partition, now=now, account=account)
        wire = spec.to_wire()
        size = spec_size(wire)
        if spec.array is None:
            return int(c.execute(st.JOB_INSERT, {**row, "spec": wire, "spec_bytes": size}).inserted_primary_key[0])
        array = parse_array(spec.array, None)
        first = None
        for task in array.indices:  # the spec once, in array_specs; each task only its own changes
            job_id = int(c.execute(insert(jobs).values(
                **row, spec={}, spec_bytes=size if first is None else 0, array_job_id=first,
                array_task_id=task, array_task_limit=array.limit)).inserted_primary_key[0])
            if first is None:
                first = job_id
                c.execute(update(jobs).where(jobs.c.id == first).values(array_job_id=first))
                c.execute(st.ARRAY_SPEC_INSERT, {"array_job_id": first, "spec": wire})
        return first

    def missing_targets(self, targets: Iterable[tuple[int, int | None]]) -> list[tuple[int, int | None]]:
        """The (job id, task id or None) a dependency names that no job is."""
        with self.engine.connect() as c:
            found = self._targets(set(targets), c)
        return sorted((t for t in set(targets) if t not in found), key=lambda t: (t[0], t[1] or -1))

    @staticmethod
    def _targets(wanted: set[tuple[int, int | None]], c) -> dict[tuple[int, int | None], Targets]:
        """What each (job id, task id or None) stands for now; one not found is left out."""
        if not wanted:
            return {}
        ids = sorted({job_id for job_id, _ in wanted})
        # In chunks: one IN of every target ran past SQLite's 250,000 bound parameters (and would
        # past PostgreSQL's 65,535), which stopped every pass (sixth audit).
        rows = [r for k in range(0, len(ids), CANCEL_CHUNK) for r in c.execute(
            select(jobs.c.id, jobs.c.array_job_id, jobs.c.array_task_id, jobs.c.state, jobs.c.attempts,
                   jobs.c.start_time, jobs.c.end_time).where(
                or_(jobs.c.id.in_(ids[k:k + CANCEL_CHUNK]), jobs.c.array_job_id.in_(ids[k:k + CANCEL_CHUNK]))))]
        found: dict[tuple[int, int | None], list[Target]] = {}
        for r in rows:
            t = Target(JobState(r.state), r.attempts > 0, r.start_time if r.start_time is not None else r.end_time)
            if r.array_job_id is not None:
                found.setdefault((r.array_job_id, None), []).append(t)
                found.setdefault((r.array_job_id, r.array_task_id), []).append(t)
            if r.array_job_id is None or r.id != r.array_job_id:
                found.setdefault((r.id, None), []).append(t)  # a task is also its own job
        return {key: summarize(ts) for key, ts in found.items()}

    def _dependency_reasons(self, c, job_rows, book: DependencyBook, now: float) -> dict[int, str | None]:
        """Each pending job's dependency, evaluated now: None (satisfied), Dependency or
        DependencyNeverSatisfied. Not a held job's: it cannot start whatever the verdict (and
        thousands of held jobs with long lists cost every pass their lookups)."""
        rows = {j.id: j for j in job_rows if j.dependency and j.state == JobState.PENDING.value and not j.hold}

        def singletons_clear(job_ids) -> dict[int, bool]:
            names = {(rows[i].user, rows[i].name) for i in job_ids}
            first: dict[tuple[str, str], int] = {}  # the earliest unfinished of each (user, name)
            for r in c.execute(select(jobs.c.id, jobs.c.user, jobs.c.name).where(
                    jobs.c.state.in_([JobState.PENDING.value] + ACTIVE),  # (name, state) seeks, not a walk
                    jobs.c.user.in_({u for u, _ in names}), jobs.c.name.in_({n for _, n in names}))):
                key = (r.user, r.name)
                first[key] = min(r.id, first.get(key, r.id))
            return {i: first.get((rows[i].user, rows[i].name), i) >= i for i in job_ids}

        return book.verdicts({i: j.dependency for i, j in rows.items()},
                             lambda keys: self._targets(keys, c), singletons_clear, now)

    def cancel_pending(self, job_id: int, now: float, by_uid: int | None = None, why: str | None = None,
                       events: Journal = None) -> bool:
        return self.cancel_pendings([job_id], now, by_uid, why, events) == [job_id]

    def cancel_pendings(self, job_ids: Sequence[int], now: float, by_uid: int | None = None,
                        why: str | None = None, events: Journal = None) -> list[int]:
        """Cancel those of the jobs that are pending, in one transaction (an hcancel of a thousand
        waited for a thousand commits); the ids it cancelled (and `events(ids)` written with them)."""
        done: list[int] = []
        with self.engine.begin() as c:
            for i in range(0, len(job_ids), CANCEL_CHUNK):
                chunk = list(job_ids[i:i + CANCEL_CHUNK])
                pending = (jobs.c.id.in_(chunk), jobs.c.state == JobState.PENDING.value)
                ids = [r.id for r in c.execute(select(jobs.c.id).where(*pending).with_for_update())]
                if ids:
                    c.execute(update(jobs).where(jobs.c.id.in_(ids), jobs.c.state == JobState.PENDING.value).values(
                        state=JobState.CANCELLED.value, end_time=now, version=jobs.c.version + 1,
                        reason=why or (f"cancelled by {by_uid}" if by_uid is not None else "None")))
                    drop_payloads(c, ids)
                done += ids
            return journal(c, events, done)

    def request_end(self, job_id: int, request: str, why: str | None = None, events: Journal = None) -> bool:
        """Ask a running job to end: cancel, or preempt/requeue (it comes back to the queue).

        The agents are told by the controller; the run's end moves the job on. A cancel overrides
        a preemption under way; a preemption never overrides a cancel."""
        state = JobState.COMPLETING if request == "cancel" else JobState.PREEMPTING
        with self.engine.begin() as c:
            q = update(jobs).where(jobs.c.id == job_id, jobs.c.state.in_(ACTIVE))
            if request != "cancel":
                q = q.where(jobs.c.state == JobState.RUNNING.value)
            # A second cancel (salloc letting go of an allocation already ended) keeps the first's
            # reason: an idle reclamation's or a time limit's must not read "cancelled by <uid>".
            reason = case((jobs.c.end_request == "cancel", jobs.c.end_reason), else_=why) if request == "cancel" else why
            res = c.execute(q.values(end_request=request, end_reason=reason, state=state.value,
                                     version=jobs.c.version + 1))
            return res.rowcount == 1 and journal(c, events, True)

    def set_hold(self, job_id: int, hold: bool, *, admin: bool, events: Journal = None) -> str | None:
        """Hold or release a pending job. Returns an error text, or None when done."""
        with self.engine.begin() as c:
            job = c.execute(st.JOB_BY_ID, {"p_id": job_id}).first()
            if job is None:
                return f"Invalid job id specified: {job_id}"
            if job.state != JobState.PENDING.value:
                return f"Job {job_id} is {job.state}, only pending jobs can be held or released"
            if not hold and job.hold_admin and not admin:
                return f"Access/permission denied: job {job_id} was held by an administrator"
            c.execute(update(jobs).where(jobs.c.id == job_id).values(
                hold=hold, hold_admin=hold and admin, version=jobs.c.version + 1,
                reason=held_reason(admin) if hold else "None"))
            return journal(c, events, None)

    def announce_resumable(self, job_id: int, uid: int) -> str | None:
        """A running job's processes said it can resume (hai_cluster.job): time-slicing may
        preempt it from now on. Its `resumes` as it now is (None: --no-requeue, or not the uid's)."""
        with self.engine.begin() as c:
            c.execute(update(jobs).where(jobs.c.id == job_id, jobs.c.uid == uid, jobs.c.preemptible.is_(True),
                                         jobs.c.resumes.is_(None)).values(resumes="announced"))
            row = c.execute(select(jobs.c.resumes, jobs.c.uid).where(jobs.c.id == job_id)).first()
            return row.resumes if row is not None and row.uid == uid else None

    def hold_running(self, job_id: int, *, admin: bool) -> bool:
        """requeuehold: the running job is held now, so that it waits when its run has ended."""
        with self.engine.begin() as c:
            res = c.execute(update(jobs).where(jobs.c.id == job_id, jobs.c.state == JobState.RUNNING.value)
                            .values(hold=True, hold_admin=admin, version=jobs.c.version + 1))
            return res.rowcount == 1

    def update_pending(self, job_id: int, changes: Mapping[str, Any]) -> str | None:
        """hcontrol update JobId=: change time_limit, partition or dependency of a pending job: its
        spec, and the columns derived from it. Returns an error text, or None when done."""
        with self.engine.begin() as c:
            job = c.execute(select(jobs.c.state, jobs.c.spec, jobs.c.array_job_id).where(jobs.c.id == job_id)).first()
            if job is None:
                return f"Invalid job id specified: {job_id}"
            if job.state != JobState.PENDING.value:
                return f"Job {job_id} is {job.state}; only a pending job can be updated"
            spec = JobSpec.from_wire({**full_spec(c, job), **changes})
            # The partition column is the admitted one (update admits it again), not spec_columns'.
            partition = {"partition": changes["partition"]} if "partition" in changes else {}
            # An array task's own spec holds only its changes (full_spec): these few fields.
            c.execute(update(jobs).where(jobs.c.id == job_id).values(
                **spec_columns(spec), **partition, spec={**job.spec, **changes}, version=jobs.c.version + 1))
            return None

    # ---- scheduling ----------------------------------------------------------------------
    def load_snapshot(self, now: float) -> Snapshot:
        with self.engine.connect() as c:
            # Only what the policy looks at: the spec (script, environment) is large and not needed.
            job_rows = c.execute(select(*SNAPSHOT_COLUMNS).where(
                jobs.c.state.in_([JobState.PENDING.value] + ACTIVE))).all()
            live = live_ranks(c)
            nodes_now = node_views(c, live)
            waits = self._dependency_reasons(c, job_rows, self._dependencies, now)
            held_for = reservation_store.live(c, now)
        held: dict[int, list] = {}  # job id -> its live ranks, in rank order
        for r in live:
            held.setdefault(r.job_id, []).append(r)
        return Snapshot(now=now, jobs=self._views.build(job_rows, held, waits), nodes=nodes_now, reservations=held_for)

    def probe(self, spec: JobSpec, *, user: str, partition: str, now: float, account: str) -> JobView:
        """--test-only: the job as the policy would see it if it were submitted now, its
        dependency evaluated as the snapshot evaluates those of the queue."""
        view = probe_view(spec, job_id=-1, user=user, partition=partition, now=now, account=account)
        if not spec.dependency:
            return view
        newest = 2**62  # later than every job in the store (singleton counts the ones before it)
        with self.engine.connect() as c:
            probe = SimpleNamespace(id=newest, state=JobState.PENDING.value, hold=False, user=user, name=spec.name,
                                    dependency=spec.dependency)
            verdict = self._dependency_reasons(c, [probe], DependencyBook(), now)
        return replace(view, dependency=verdict.get(newest))

    def why_waiting(self, job_id: int) -> str | None:
        """For a pending job: what keeps it from starting now, node by node (core.resources)."""
        with self.engine.connect() as c:
            j = c.execute(st.JOB_BY_ID, {"p_id": job_id}).first()
            if j is None or j.state != JobState.PENDING.value:
                return None
            nodes_now = node_views(c, live_ranks(c))
        return why_waiting(job_view(j), nodes_now)

    def load_nodes(self) -> tuple[NodeView, ...]:
        """The nodes as the policy sees them, without the jobs (e.g. to check a submission fits)."""
        with self.engine.connect() as c:
            return node_views(c, live_ranks(c))

    def set_reasons(self, reasons: Mapping[int, str], versions: Mapping[int, int] | None = None,
                    events: Journal = None) -> dict[int, str]:
        """Store the pending reasons that changed (most do not, tick after tick); returns those.
        `versions`: the row versions the reasons were decided on; a job changed since (released
        while the pass ran) keeps its reason until the next pass, which sees it as it is (else its
        history said "released", then "waiting reason=JobHeldUser")."""
        if not reasons:
            return {}
        with self.engine.begin() as c:
            current = {r.id: (r.reason, r.version) for r in c.execute(
                select(jobs.c.id, jobs.c.reason, jobs.c.version).where(jobs.c.state == JobState.PENDING.value))}
            changed = [{"jid": job_id, "new": reason, "ver": current[job_id][1]} for job_id, reason in reasons.items()
                       if job_id in current and current[job_id][0] != reason
                       and (versions is None or versions.get(job_id) == current[job_id][1])]
            if changed:
                c.execute(update(jobs).where(jobs.c.id == bindparam("jid"), jobs.c.state == JobState.PENDING.value,
                                             jobs.c.version == bindparam("ver"))
                          .values(reason=bindparam("new")), changed)
            return journal(c, events if changed else None, {r["jid"]: r["new"] for r in changed})

    def start_runs(self, starts: Sequence[StartRequest | tuple], now: float,
                   events: Journal = None) -> list[StartedRun | Refused]:
        """Record a pass's starts (store/applier.py): a run each, or why not."""
        return applier.start_runs(self.engine, [s if isinstance(s, StartRequest) else StartRequest(*s)
                                                for s in starts], now, events)

    def start_run(self, job_id: int, placement: Placement, now: float, version: int | None = None) -> StartedRun | Refused:
        return self.start_runs([StartRequest(job_id, placement, version)], now)[0]

    # ---- what agents report --------------------------------------------------------------
    def live_ranks(self, node: str | None = None, job_id: int | None = None) -> list[RankRef]:
        q = (select(runs.c.job_id, runs.c.attempt, run_ranks.c.rank, run_ranks.c.node, run_ranks.c.gpus,
                    run_ranks.c.state, run_ranks.c.mig_uuid)
             .join(runs, runs.c.id == run_ranks.c.run_id).where(st.LIVE))
        if node is not None:
            q = q.where(run_ranks.c.node == node)
        if job_id is not None:
            q = q.where(runs.c.job_id == job_id)
        with self.engine.connect() as c:
            return [RankRef(r.job_id, r.attempt, r.rank, r.node, tuple(r.gpus), r.state, r.mig_uuid)
                    for r in c.execute(q)]

    def mark_rank_running(self, job_id: int, attempt: int, node: str) -> None:
        self.mark_ranks_running([(job_id, attempt, node)])

    def mark_ranks_running(self, ranks: Sequence[tuple[int, int, str]]) -> None:
        """The agents confirmed these (job id, attempt, node) ranks started: one transaction."""
        with self.engine.begin() as c:
            for job_id, attempt, node in ranks:
                run_id = self._run_id(c, job_id, attempt)
                if run_id is not None:
                    c.execute(st.RANK_RUNNING, {"p_run": run_id, "p_node": node})

    @staticmethod
    def _run_id(c, job_id: int, attempt: int) -> int | None:
        return c.execute(st.RUN_ID_OF_ATTEMPT, {"p_job": job_id, "p_attempt": attempt}).scalar()

    def rank_ended(self, job_id: int, attempt: int, node: str, status: RunStatus, now: float) -> RankEnd:
        """Record one rank's final status; when it is the last, finish the run and move the job."""
        return self.ranks_ended([(job_id, attempt, node, status)], now)[0]

    def ranks_ended(self, ends: Sequence[tuple[int, int, str, RunStatus]], now: float,
                    events: Journal = None) -> list[RankEnd]:
        """rank_ended for each (job id, attempt, node, status), in order, in one transaction;
        `events(results)` written with them."""
        with self.engine.begin() as c:
            return journal(c, events, [self._rank_ended(c, job_id, attempt, node, status, now)
                                       for job_id, attempt, node, status in ends])

    def _rank_ended(self, c, job_id: int, attempt: int, node: str, status: RunStatus, now: float) -> RankEnd:
        """rank_ended on the caller's transaction."""
        run = c.execute(st.RUN_OF_ATTEMPT, {"p_job": job_id, "p_attempt": attempt}).first()
        if run is None:
            return RankEnd(False)
        res = c.execute(st.RANK_ENDED, {
            "p_run": run.id, "p_node": node, "p_exit_code": status.exit_code, "p_signal": status.signal,
            "p_reason": status.reason, "p_killed": status.killed, "p_message": status.message,
            "p_end_time": status.end_time or now, "p_cpu_seconds": status.cpu_seconds,
            "p_mem_peak_kb": status.mem_peak_kb})
        if res.rowcount == 0:
            return RankEnd(False)
        ranks = [_row(r) for r in c.execute(st.RANKS_OF_RUN, {"p_run": run.id})]
        job = c.execute(st.JOB_BY_ID, {"p_id": job_id}).first()
        alive = [r for r in ranks if r["state"] != "ended"]
        if alive:
            failed = status.exit_code != 0 or status.signal or status.reason
            # the batch script's end is the job's: the step servers of the other nodes go too
            failed = failed or (_ended_rank(ranks, node) == 0 and JobSpec.from_wire(full_spec(c, job)).script_once)
            stop = tuple(RankRef(job_id, attempt, r["rank"], r["node"], tuple(r["gpus"]), r["state"])
                         for r in alive) if failed else ()
            return RankEnd(True, stop_ranks=stop)
        outcome = combine(({"exit_code": r["exit_code"], "signal": r["exit_signal"], "reason": r["reason"],
                            "message": r["message"]} for r in ranks), job.end_request)
        end = max(r["end_time"] or now for r in ranks)
        why = outcome.message
        if outcome.state in (JobState.PREEMPTED, JobState.REQUEUED):
            late = any(r["killed"] for r in ranks)
            why = (job.end_reason or outcome.state.value.lower()) + (
                "; did not exit within its grace period, killed" if late else "; exited within its grace period")
        elif outcome.state == JobState.CANCELLED and job.end_request == "cancel":
            why = job.end_reason or "cancelled"
        # The columns hold 200 characters (PostgreSQL refuses more, and the end would never be
        # recorded: seventh audit); the whole message stays in the rank's (run_ranks.message).
        why = why[:REASON_LEN] if why else why
        c.execute(*st.update_by_id(runs, run.id, dict(
            state=outcome.state.value, end_time=end, exit_code=outcome.exit_code,
            exit_signal=outcome.signal, reason=why, **usage_of(ranks))))
        close_open(c, run.id, end)
        spec = JobSpec.from_wire(full_spec(c, job))
        new_state = job_state_after(outcome.state, spec.requeue)
        gpu_seconds = max(0.0, end - run.start_time) * (run.gpu_charge or run.gpus)
        values: dict[str, Any] = dict(
            state=new_state.value, exit_code=outcome.exit_code, exit_signal=outcome.signal,
            end_request=None, end_reason=None, last_run_end=end,
            attained_gpu_seconds=job.attained_gpu_seconds + gpu_seconds, version=job.version + 1)
        if new_state == JobState.PENDING:
            if spec.partition and "," in spec.partition:  # back to all its candidate partitions
                values["partition"] = spec.partition
            values.update(restart_count=job.restart_count + 1, nodelist="", start_time=None, pending_since=end,
                          reason="Preempted" if outcome.state == JobState.PREEMPTED else "Requeued")
        else:
            values.update(end_time=end, reason=why or "None")
        c.execute(*st.update_by_id(jobs, job_id, values))
        if new_state in FINAL_STATES:
            drop_payloads(c, [job_id])
        return RankEnd(True, run_state=outcome.state, job_state=new_state)

    # ---- nodes ---------------------------------------------------------------------------
    def register_nodes(self, configured: Iterable[tuple[str, str, Sequence[str]]], now: float) -> None:
        """Make sure every configured node has a row. All start as not responding, and get the
        full grace time from now to reconnect before they are declared down."""
        with self.engine.begin() as c:
            existing = {r.name for r in c.execute(select(nodes.c.name))}
            for name, address, partitions in configured:
                if name in existing:
                    c.execute(update(nodes).where(nodes.c.name == name).values(
                        address=address, partitions=list(partitions), responding=False, unreachable_since=now))
                else:
                    c.execute(insert(nodes).values(name=name, address=address, state="up", responding=False,
                                                   cpus=0, mem_mb=0, partitions=list(partitions),
                                                   unreachable_since=now))

    def update_inventory(self, name: str, hello: Mapping[str, Any], now: float) -> None:
        with self.engine.begin() as c:
            c.execute(update(nodes).where(nodes.c.name == name).values(
                cpus=int(hello["cpus"]), mem_mb=int(hello["mem_mb"]), gpu_backend=str(hello["gpu_backend"]),
                last_seen=now, runtimes=[str(r) for r in hello.get("runtimes") or ["none"]],
                container_runtime=hello.get("default_container_runtime"),
                features=declared_features(hello.get("features"))))
            c.execute(delete(gpus).where(gpus.c.node == name))
            for g in hello["gpus"]:
                c.execute(insert(gpus).values(node=name, index=int(g["index"]), uuid=str(g["uuid"]),
                                              name=str(g["name"]), memory_mb=int(g["memory_mb"]),
                                              **_gpu_sharing(g)))

    def set_responding(self, name: str, responding: bool, now: float) -> None:
        with self.engine.begin() as c:
            if responding:
                c.execute(update(nodes).where(nodes.c.name == name).values(
                    responding=True, last_seen=now, unreachable_since=None))
                # A node that went down only because it stopped answering is back.
                c.execute(update(nodes).where(nodes.c.name == name, nodes.c.state == "down",
                                              nodes.c.reason.like(f"{NOT_RESPONDING}%")).values(state="up", reason=None))
            else:
                c.execute(update(nodes).where(nodes.c.name == name).values(responding=False))
                c.execute(update(nodes).where(nodes.c.name == name, nodes.c.unreachable_since.is_(None))
                          .values(unreachable_since=now))

    def nodes_unreachable_since(self, before: float) -> list[str]:
        """Nodes still up (or draining) that have not answered since `before`."""
        with self.engine.connect() as c:
            return [r.name for r in c.execute(select(nodes.c.name).where(
                nodes.c.responding.is_(False), nodes.c.state != "down", nodes.c.unreachable_since < before))]

    def mark_down(self, name: str, reason: str) -> list[RankRef]:
        """The node is down: it gets no work; its live ranks are returned for the caller to fail."""
        with self.engine.begin() as c:
            c.execute(update(nodes).where(nodes.c.name == name).values(state="down", reason=reason))
        return self.live_ranks(name)

    def set_node_state(self, name: str, state: str, reason: str | None) -> bool:
        """Administrative state: up (resume), drain (finish what runs, start nothing), down."""
        with self.engine.begin() as c:
            res = c.execute(update(nodes).where(nodes.c.name == name).values(
                state=state, reason=None if state == "up" else reason))
            return res.rowcount == 1

    # ---- queries for the CLI -------------------------------------------------------------
    def known_jobs(self, ids: Sequence[int], tasks: Sequence[tuple[int, int]]) -> tuple[set[int], set[tuple[int, int]]]:
        """Which of these job ids and (array id, task id) pairs exist, in any state: one seek
        each, never the rows of an array's tasks (an array's id is its first task's job id)."""
        with self.engine.connect() as c:
            pairs = _task_rows(c, tasks, jobs.c.array_job_id, jobs.c.array_task_id)
            return {r.id for r in _id_rows(c, ids, jobs.c.id)}, {(r.array_job_id, r.array_task_id) for r in pairs}

    def jobs(self, **filters) -> list[dict]:
        """Job rows as jobs_page finds them, for a caller that asks no limit (every row) or
        takes a short page as it comes."""
        return self.jobs_page(**filters).rows

    def jobs_page(self, *, ids: Sequence[int] | None = None, states: Sequence[str] | None = None,
                  users: Sequence[str] | None = None, names: Sequence[str] | None = None,
                  partitions: Sequence[str] | None = None, columns: Sequence[str] | None = None,
                  tasks: Sequence[tuple[int, int]] | None = None, after_id: int | None = None,
                  limit: int | None = None, ended_since: float | None = None) -> listing.Page:
        """Job rows without the spec; `columns`: only these (names in LISTING_COLUMNS). `ids` also
        name every task of an array; `tasks` are (array id, task id). A page: ids above
        `after_id`, at most `limit`, and where the next starts if the page ended short of its
        rows examined (store/listing.py); `ended_since`: only jobs not ended before then."""
        cols = LISTING_COLUMNS if columns is None else [jobs.c[n] for n in columns]
        q = select(*cols, *([] if columns is None or "id" in columns else [jobs.c.id]))
        if ended_since is not None:
            q = q.where(or_(jobs.c.end_time.is_(None), jobs.c.end_time >= ended_since))
        by_id = bool(ids or tasks)
        walk, values = (None, None) if by_id else listing.leading(users, names, partitions)
        for column, given in ((jobs.c.user, users), (jobs.c.name, names), (jobs.c.partition, partitions)):
            if given and column is not walk:
                q = q.where(column.in_(list(given)))
        walks = None
        if walk is None or limit is None:  # every row asked for (hcancel -u): the plain filters
            if walk is not None:
                q = q.where(walk.in_(values))
            if states:
                q = q.where(jobs.c.state.in_(list(states)))
        with self.engine.connect() as c:
            if limit is None:
                if by_id:  # every row (hcancel): one query; its callers filter by live states
                    q = q.where(_selected(c, ids, tasks))
            elif walk is not None or by_id:  # (value, state) walks, or one per array named and the other ids
                walks = (listing.walks_of(c, walk, values, states) if walk is not None
                         else _id_walks(c, ids or (), tasks or ()))
                if not walks:
                    return listing.Page([])
            if ended_since is not None and not by_id:
                key_walk = walk is None and limit is not None
                few = listing.not_ended_ids(ended_since, after_id if after_id is not None else -1,
                                            listing.EXAMINED_PER_ROW * limit, c) if key_walk else None
                if few is not None:
                    q, after_id = q.where(jobs.c.id.in_(few)), None  # those few, not the walk from the oldest
                else:
                    if after_id is None:  # start at the first job that can match, found through ix_jobs_end_time
                        first = listing.first_not_ended_before(c, ended_since)
                        if first is None:
                            return listing.Page([])
                        after_id = first - 1
                    if key_walk:
                        walks = [()]  # the primary key, a budget of rows at a time: most may have ended before
            if walks is not None:  # never the whole history for one page
                page = listing.merged_page(c, q, walks, after_id, limit)
            else:
                if after_id is not None:
                    q = q.where(jobs.c.id > after_id)
                page = listing.Page(c.execute(q.order_by(jobs.c.id).limit(limit)).all())
            keys = [col.name for col in cols]
            rows = [dict(zip(keys, r)) for r in page.rows]  # a third of the time of r._mapping per row
            return listing.Page(_with_shares(c, rows), page.resume_after)

    def job_record(self, job_id: int) -> JobRecord | None:
        """The job with its whole spec, typed (what a run is built from)."""
        with self.engine.connect() as c:
            r = c.execute(st.JOB_BY_ID, {"p_id": job_id}).first()
            return JobRecord.of(r._mapping, full_spec(c, r)) if r else None

    def job(self, job_id: int) -> dict | None:
        with self.engine.connect() as c:
            r = c.execute(st.JOB_BY_ID, {"p_id": job_id}).first()
            return _with_shares(c, [{**_row(r), "spec": full_spec(c, r)}])[0] if r else None

    def runs(self, *, job_ids: Sequence[int] | None = None, users: Sequence[str] | None = None,
             tasks: Sequence[tuple[int, int]] | None = None, of_jobs: Sequence[int] | None = None) -> list[dict]:
        """Runs of the jobs named (`job_ids` as in jobs(): an array's id names its tasks), or of
        exactly the jobs `of_jobs` (a page of a listing): each job's newest RUNS_SHOWN (its
        attempts are numbered 0.. in order). A job requeued 100,000 times made one reply 34 MB,
        built on the event loop (seventh audit)."""
        q = (select(runs, jobs.c.name, jobs.c.user, jobs.c.partition, jobs.c.state.label("job_state"),
                    jobs.c.array_job_id, jobs.c.array_task_id, jobs.c.account)
             .join(jobs, jobs.c.id == runs.c.job_id).where(runs.c.attempt >= jobs.c.attempts - RUNS_SHOWN)
             .order_by(runs.c.job_id, runs.c.attempt))
        if of_jobs is not None:
            q = q.where(runs.c.job_id.in_(list(of_jobs)))
        if users:
            q = q.where(jobs.c.user.in_(list(users)))
        with self.engine.connect() as c:
            if job_ids or tasks:
                q = q.where(_selected(c, job_ids, tasks))
            return [_row(r) for r in c.execute(q)]

    def nodes(self) -> list[dict]:
        with self.engine.connect() as c:
            rows = [_row(r) for r in c.execute(select(nodes).order_by(nodes.c.name))]
            gpu_count = dict(c.execute(select(gpus.c.node, func.count()).group_by(gpus.c.node)).all())
            modes = c.execute(select(gpus.c.node, gpus.c.isolation, gpus.c.shareable)).all()
            live = c.execute(select(run_ranks.c.node, run_ranks.c.gpus, run_ranks.c.cpus)
                             .where(st.LIVE)).all()
        for r in rows:
            mine = [x for x in live if x.node == r["name"]]
            r["gpus_total"] = gpu_count.get(r["name"], 0)
            r["gpus_alloc"] = len({g for x in mine for g in x.gpus})  # a card with several shares counts once
            mine_modes = [m for m in modes if m.node == r["name"]]
            r["isolation"] = ",".join(sorted({m.isolation for m in mine_modes})) or None  # mps | mig | none
            r["gpus_shared"] = sum(1 for m in mine_modes if m.shareable)
            r["cpus_alloc"] = sum(x.cpus for x in mine)
            r["jobs"] = len(mine)
        return rows

    def set_run_telemetry(self, rollups: Sequence[Mapping[str, Any]]) -> None:
        """Write runs' telemetry rollups (each: job_id, attempt and the 0006 columns)."""
        if not rollups:
            return
        cols = ("gpu_util_mean", "gpu_util_max", "gpu_mem_max_mb", "energy_j", "cpu_mean", "telemetry_samples")
        with self.engine.begin() as c:
            c.execute(update(runs).where(runs.c.job_id == bindparam("jid"), runs.c.attempt == bindparam("att"))
                      .values({k: bindparam(f"v_{k}") for k in cols}),
                      [{"jid": r["job_id"], "att": r["attempt"], **{f"v_{k}": r[k] for k in cols}} for r in rollups])

    def open_jobs_with_end_request(self) -> list[dict]:
        with self.engine.connect() as c:
            return [_row(r) for r in c.execute(select(jobs.c.id, jobs.c.end_request).where(
                jobs.c.end_request.is_not(None), jobs.c.state.in_(ACTIVE)))]


def declared_features(raw: Any) -> list[str]:
    """An agent's features as the store keeps them: valid names only, at most 256."""
    if not isinstance(raw, list):
        return []
    return [f for f in raw if isinstance(f, str) and FEATURE_NAME.fullmatch(f)][:256]


__all__ = ["Repository", "RankRef", "RankEnd"]
