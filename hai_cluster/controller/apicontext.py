"""What every API handler shares: the controller, the store, and the request helpers that need
them (a job named by id or array task, a listing's page, a job as listings show it)."""
from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from ..core.dependency import parse_dependency
from ..core.jobids import JobRef
from ..core.optionvalues import MAX_DEPENDENCY_TEXT
from ..core.model import attained_service
from ..core.sizemodel import SizeModel
from ..core.states import FINAL_STATES, JobState
from ..scheduling.learned import level_now
from ..store.generation import WriteGeneration
from ..store.records import JobRecord
from ..store.repository import LISTING_COLUMNS
from ..transport.rpc import RequestError
from .access import Caller, deny, may_act_on
from .leader import STARTING
from .listing_cache import ListingCache
from .outputcheck import RecentlyWritable
from .requests import expect
from .submitrate import OverRate, SubmitRate

if TYPE_CHECKING:
    from .service import Controller

NOT_FINAL = [s.value for s in JobState if s not in FINAL_STATES and s not in (JobState.PREEMPTED,
                                                                              JobState.REQUEUED)]


# Rows of one reply (jobs, acct; events): it is built and encoded on the event loop, so a listing of
# half a million jobs took 20 s and 3 GB there. Clients page with "after" (the last id they got).
PAGE_ROWS = 10_000
PARSE_ON_LOOP = 64 * 1024  # a script under this is parsed on the event loop (microseconds)
MAX_EVENTS = 10_000


# What a listing may ask for (`fields`): the job table's columns but the spec, and what _public adds.
# Job listing keys that are not columns: computed by _public, from live telemetry, or by the store.
TELEMETRY_FIELDS = frozenset({"gpu_util", "gpu_mem_used_mb", "cpu_pct", "idle", "idle_for", "idle_limit"})
DERIVED_FIELDS = frozenset({"code", "attained_now", "level", "gpu_share_mb"}) | TELEMETRY_FIELDS
LISTING_FIELDS = frozenset(c.name for c in LISTING_COLUMNS) | DERIVED_FIELDS
PUBLIC_NEEDS = ("state", "attained_gpu_seconds", "start_time", "nodes", "gpus_per_node", "user", "name")
TELEMETRY_NEEDS = ("id", "attempts")  # with_telemetry: the live run's key
SHARE_NEEDS = ("id", "gpu_fraction", "gpu_mem_mb")  # the store's gpu_share_mb


def _public(job: dict, mlfq, now: float, sizes: SizeModel | None = None) -> dict:
    out = dict(job)
    out.pop("spec", None)
    state = JobState(job["state"])
    out["code"] = state.code
    rate = job["nodes"] * job["gpus_per_node"] or job.get("gpu_charge") or 0.0  # sharing: its share
    attained = attained_service(job["attained_gpu_seconds"], rate,
                                job["start_time"] if state.holds_resources and job["start_time"] else None, now)
    out["attained_now"] = attained
    # The level in the order the policy runs (gittins: from what it learned of job sizes).
    out["level"] = level_now(mlfq, sizes or SizeModel(), rate, job.get("user") or "", job.get("name") or "", attained)
    return out


class ApiContext:
    """The state the handlers share (built once with the table, controller/api.py)."""

    def __init__(self, ctl: Controller) -> None:
        self.ctl = ctl
        self.writable = RecentlyWritable()
        self.rate = SubmitRate(ctl.cfg.access.submit_rate, ctl.cfg.access.submit_burst, time.monotonic)
        self.probe_lock = asyncio.Lock()  # --test-only probes, one at a time (api_submit.would_start)
        self.priority_lock = asyncio.Lock()  # sprio's order, computed once at a time (api_priority.py)
        self.priority_cache: tuple[float, float, list] | None = None  # (monotonic, now, rows)
        self._listings: ListingCache | None = None  # squeue's and sacct's pages (listing_cache.py)

    async def take_rate(self, caller: Caller, jobs: int) -> None:
        """Tokens of the caller's submission bucket ([access] submit_rate): a submission's jobs,
        a requeue's new run (each a run row and more, as a job is), a hold, release or update of a
        job (a write and an event row)."""
        try:
            wait = self.rate.take(caller.uid, jobs)
        except OverRate as exc:
            raise RequestError(str(exc)) from None
        if wait:
            await asyncio.sleep(wait)

    @property
    def repo(self):
        repo = self.ctl.repo  # the store opens after the table is built, and after the lease
        if repo is None:  # a request in between got "'NoneType' object has no attribute" (CI)
            raise RequestError(STARTING)
        return repo

    @property
    def listings(self) -> ListingCache:
        """The listing cache of the open store (a new one if the store was opened again)."""
        engine = self.repo.engine
        if self._listings is None or self._listings.generation.engine is not engine:
            if self._listings is not None:
                self._listings.generation.close()
            self._listings = ListingCache(WriteGeneration(engine))
        return self._listings

    def public(self, job: dict) -> dict:
        return _public(job, self.ctl.cfg.scheduler.mlfq, time.time(), self.ctl.sizes.model)

    async def own_job(self, body: Any, caller: Caller, action: str, *, operators: bool = True) -> JobRecord:
        """The job (or array task) named in the body, if the caller may `action` it (owner or
        admin, and operators unless `operators` is false)."""
        job_id = await self.task_job_id(body)
        job = await self.ctl.db(self.repo.job_record, job_id)
        if job is None:
            raise RequestError(f"Invalid job id specified: {job_id}")
        if not may_act_on(caller, job.user, operators=operators):
            raise deny(caller, f"{action} of job {job_id} (owned by {job.user})")
        return job

    async def task_job_id(self, body: Any) -> int:
        """'job_id', or 'array_job_id' with 'task_id' (hcontrol ... 12_4): the job id of that task."""
        task = expect(body, "task_id", int)
        if task is None:
            return expect(body, "job_id", int, required=True)
        array_id = expect(body, "job_id", int, required=True)
        rows = await self.ctl.db(self.repo.jobs, tasks=[(array_id, task)])
        if not rows:
            raise RequestError(f"Invalid job id specified: {array_id}_{task}")
        return rows[0]["id"]

    def page(self, body: Any) -> tuple[int | None, int]:
        """A listing's page: ids after `after`, at most `limit` (PAGE_ROWS at most) rows; the reply
        says `more` and the `next` after to ask with (cli.common.call_pages)."""
        after, limit = expect(body, "after", int), expect(body, "limit", int, default=PAGE_ROWS)
        if limit <= 0:
            raise RequestError("limit must be positive")
        return after, min(limit, PAGE_ROWS)

    def with_telemetry(self, job: dict) -> dict:
        """A live run's latest GPU utilization and memory, its idle flag and idle clock (hqueue -o %g %G %I %W)."""
        if JobState(job["state"]).holds_resources and job.get("attempts"):
            job.update(self.ctl.telemetry.run_fields((job["id"], job["attempts"] - 1)))
            job.update(self.ctl.reclaim.fields(job["id"], job["attempts"] - 1))  # the idle clock (reclaim.py)
        return job

    async def checked_dependency(self, text: str) -> str:
        if len(text) > MAX_DEPENDENCY_TEXT:  # before the parse: its cost grows with the text
            raise RequestError(f"invalid dependency specification: too long (at most {MAX_DEPENDENCY_TEXT} characters)")
        try:
            dep = parse_dependency(text)
        except ValueError as exc:
            raise RequestError(f"invalid dependency specification: {exc}") from None
        if len(dep.text) > 1000:
            raise RequestError("invalid dependency specification: too long (at most 1000 characters)")
        missing = await self.ctl.db(self.repo.missing_targets, dep.targets)
        if missing:
            names = ", ".join(str(JobRef(j, (t,) if t is not None else None)) for j, t in missing)
            raise RequestError(f"Job dependency problem: no such job {names}")
        return dep.text
