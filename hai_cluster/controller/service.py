"""The controller: its scheduling loop and tick (the policy's plan recorded by the applier,
store/applier.py), and the runs' ends. Telling agents what was decided: dispatcher.py; reconciling
the store with each agent: reconcile.py; the client API: api.py.

All store access goes through one worker thread (`db`), so writes never race each other and the
event loop never blocks on the database. Agents are only told to act after the store has
recorded the decision; every agent request is idempotent, so a lost reply is simply sent again.
"""
from __future__ import annotations

import asyncio
import logging
import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, Callable

from sqlalchemy.exc import DBAPIError

from .. import timeouts
from ..config import ControllerConfig, NodeConfig, SshConfig
from ..core.dependency import NEVER
from ..core.model import Snapshot
from ..core.reasons import WORK_LOST
from ..core.states import JobState
from ..protocol.runspec import RunStatus, SpecError
from ..scheduling.registry import make_policy
from ..store.engine import make_engine, upgrade
from ..store import submit_keys
from ..store.events import add_events, prune_events
from ..store.lease import Fenced
from ..store.applier import StartRequest
from ..store.repository import Repository
from ..transport.rpc import RpcError
from . import membership, reconcile
from .dispatcher import Dispatcher
from .batching import GroupWriter
from .errors import StoreUnavailable
from .events import EventLog, emit, end_events, event_row, start_event
from .health import on_health
from .mail import LIMIT_MARKS, LimitWatch, Mailer
from .metrics import QueueStats
from .nodes import AGENT_ERRORS, NodeLink
from .sizes import SizeLearner
from .client_steps import ClientSteps
from .step_watch import StepWatches
from .follow import OutputFollows
from .steps import StepHub
from .reclaim import Reclaimer
from .telemetry import TelemetryHub
from .tenancy import Tenancy

log = logging.getLogger(__name__)

# Seconds between full comparisons of each agent's runs with the store: an end reported while the
# store was down (the agent pushes it once) is picked up here; acknowledged ends are never lost.
RESYNC_INTERVAL = 15.0  # (reconcile.resync_all)
PRUNE_INTERVAL = 3600.0  # seconds between prunes of old events
STORE_LOG_INTERVAL = 60.0  # seconds between log lines of a store outage
# An outage ends once the store has answered this long without a failure: with its disk full,
# reads succeed between the failing writes, and "back" after each read flapped in the log.
STORE_QUIET = 10.0


class Controller:
    def __init__(self, cfg: ControllerConfig) -> None:
        self.cfg = cfg
        sched = cfg.scheduler
        self.policy = make_policy(sched.policy, config=sched.mlfq)
        self.tenancy = Tenancy(cfg)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="store")
        self._policy_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="policy")
        self.repo: Repository | None = None
        self.started = False  # start() has run: the API may use the store
        # The nodes whose inventory the last pass saw: submissions check against it (api.submit).
        self.inventory: tuple = ()
        self.links: dict[str, NodeLink] = {}
        self.addresses: dict[str, str] = {}
        self._link_tasks: dict[str, asyncio.Task] = {}
        self._wake = asyncio.Event()
        self.dispatch = Dispatcher(self)  # starts, ends and signals sent to agents
        self.steps = StepHub(self)  # srun's job steps: what the agents ask on their links
        self.client_steps = ClientSteps(self)  # salloc's and srun's outside a job: on the client socket
        self.step_watches = StepWatches(self)  # sattach on those steps
        self.follows = OutputFollows(self)  # sattach JOB.batch: a batch job's output through the controller
        self.stopping = False  # shutting down: a client's connection closing ends none of its sessions
        self._tasks: list[asyncio.Task] = []
        self.store_down = False
        self._store_logged = -math.inf  # when an outage was last logged (monotonic)
        self._store_failures = 0  # failures since then
        self._store_reported = False  # the current outage was logged: its end is too
        self._store_failed = -math.inf  # the latest failure (monotonic)
        self._last_resync = 0.0
        self._last_retry = 0.0
        self._agent_epoch: Callable[[], int] | None = None
        self.telemetry = TelemetryHub(cfg.telemetry)
        self.reclaim = Reclaimer(self)  # idle jobs warned, then cancelled or requeued (reclaim.py)
        self.sizes = SizeLearner(self)  # the job sizes learned from the jobs that ended (the policy's)
        self.last_snapshot: Snapshot | None = None  # the latest pass's, as its policy saw it
        self.mail = Mailer(cfg.mail_program, cfg.cluster_name)  # --mail-type notices
        self.limit_mails = LimitWatch()  # --mail-type=TIME_LIMIT*: when each running job's are due
        self.queue_stats = QueueStats()  # the queue, node and pass series of the metrics page
        self.events = EventLog()
        # Group commit (batching.py) for the two writes every job makes once per rank.
        self.mark_running = GroupWriter(self.db, lambda ranks: self.repo.mark_ranks_running(ranks))
        self._record_end = GroupWriter(self.db, lambda ends: self.repo.ranks_ended(
            ends, time.time(), events=lambda results: end_events(ends, results)))
        self._last_prune = 0.0

    def note_inventory(self, nodes) -> tuple:
        """Keep the nodes whose agent has reported its inventory (CPUs read 0 until then): what
        submissions are checked against. Returns them."""
        self.inventory = tuple(n for n in nodes if n.cpus > 0)
        return self.inventory

    async def db(self, fn: Callable, *args, **kw) -> Any:
        try:
            result = await asyncio.get_running_loop().run_in_executor(self._executor, lambda: fn(*args, **kw))
        except DBAPIError as exc:
            # Logged at most once a minute: a request that makes the store fail (eighth audit: a
            # query SQLite refused, in a loop) wrote two lines each, the outage and its end.
            now = time.monotonic()
            self._store_failures += 1
            self._store_failed = now
            if now - self._store_logged >= STORE_LOG_INTERVAL:
                log.error("the store is unavailable (%s); no decisions until it is back (%d failure(s))",
                          str(exc.orig).strip().splitlines()[0] if exc.orig else exc, self._store_failures)
                self._store_logged, self._store_failures, self._store_reported = now, 0, True
            self.store_down = True
            raise StoreUnavailable("the job store is unavailable; nothing was changed, try again shortly") from None
        if self.store_down and time.monotonic() - self._store_failed >= STORE_QUIET:
            if self._store_reported:
                log.warning("the store is back")
            self.store_down = self._store_reported = False
        return result

    # ---- start and stop --------------------------------------------------------------------
    async def start(self, leader=None) -> None:
        """Open the store and connect to the agents. With a `leader` (controller/leader.py), the
        store was opened and migrated by it, every write is fenced by its epoch and every agent
        command carries it."""
        def open_store() -> Repository:
            if leader is not None:
                engine = leader.fenced_engine()
            else:
                engine = make_engine(self.cfg.database)
                upgrade(engine)
            repo = Repository(engine)
            repo.register_nodes(((n.name, n.address, n.partitions) for n in self.cfg.nodes), time.time())
            return repo
        self.repo = await self.db(open_store)
        self._agent_epoch = None if leader is None else leader.agent_epoch
        for n in self.cfg.nodes:
            self.open_link(n, self.cfg.ssh)
        await membership.resume(self)  # nodes added with hcontrol node add, and removals under way
        await self.sizes.start()  # what the scheduler learned, before its first pass
        self._tasks.append(asyncio.create_task(self._loop(), name="scheduler"))
        self._tasks.append(asyncio.create_task(self._persist_telemetry(), name="telemetry"))
        self.mail.start()
        self.started = True
        # In the background: one record read per running job with a limit must not hold the API
        # gate shut, and a store error there must not fail the start.
        self.spawn(self._watch_running_limits())
        self._tasks.append(asyncio.create_task(self.client_steps.sweep(), name="abandoned-allocations"))

    def open_link(self, node: NodeConfig, ssh: SshConfig) -> None:
        self.links[node.name] = link = NodeLink(node, ssh, self.cfg.ping_interval, on_hello=self._on_hello,
                                                on_event=self._on_event, on_lost=self._on_lost,
                                                table=self.steps.table())
        link.epoch = self._agent_epoch  # the lease epoch every command carries (two controllers)
        self.addresses[node.name] = node.address
        self._link_tasks[node.name] = task = asyncio.create_task(link.run(), name=f"link-{node.name}")
        self._tasks.append(task)

    async def close_link(self, name: str) -> None:
        task = self._link_tasks.pop(name, None)
        self.links.pop(name, None)
        self.addresses.pop(name, None)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            if task in self._tasks:
                self._tasks.remove(task)

    async def stop(self) -> None:
        await self.mail.stop()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.repo is not None:
            try:
                await self.flush_events()
            except StoreUnavailable:
                log.warning("%d event(s) not written: the store is unavailable", len(self.events.take()))
            except Fenced:  # another controller took over: it writes the history from now on
                log.warning("%d event(s) not written: no longer the active controller", len(self.events.take()))
            try:
                await self.sizes.save()
            except (StoreUnavailable, Fenced):  # the next start folds in what it lacks from the store
                pass
        self._executor.shutdown(wait=True)
        self._policy_executor.shutdown(wait=True)

    def wake(self) -> None:
        self._wake.set()

    async def flush_events(self) -> None:
        """Write the buffered events (one transaction); prune old ones once an hour."""
        rows = self.events.take()
        try:
            await self.db(add_events, self.repo.engine, rows)
            if time.monotonic() - self._last_prune >= PRUNE_INTERVAL:
                self._last_prune = time.monotonic()
                await self.db(prune_events, self.repo.engine, time.time() - self.cfg.events_max_age_days * 86400)
                await self.db(submit_keys.prune, self.repo.engine, time.time() - submit_keys.KEEP_SECONDS)
        except StoreUnavailable:
            self.events.put_back(rows)
            raise

    async def decide(self, snapshot):
        """The policy is pure CPU work: off the event loop, so API calls and link pings keep flowing.
        The snapshot gets the running-GPU limits and fair-share factors first (controller/tenancy.py),
        and the job sizes learned so far."""
        snapshot = await self.db(self.tenancy.extend, self.repo.engine, snapshot)
        await self.sizes.catch_up(force=False)
        snapshot = self.last_snapshot = replace(snapshot, sizes=self.sizes.model)
        return await asyncio.get_running_loop().run_in_executor(self._policy_executor, self.policy.decide, snapshot)

    # ---- the loop --------------------------------------------------------------------------
    async def _loop(self) -> None:
        last_pass = 0.0
        while True:
            try:
                await timeouts.wait_for(self._wake.wait(), timeout=self.cfg.tick_seconds)
            except asyncio.TimeoutError:
                pass
            gap = min(self.cfg.min_pass_interval, self.cfg.tick_seconds)
            await asyncio.sleep(max(0.0, last_pass + gap - time.monotonic()))
            last_pass = time.monotonic()
            self._wake.clear()
            try:
                await self.tick()
                if time.monotonic() - self._last_resync >= RESYNC_INTERVAL:
                    self._last_resync = time.monotonic()
                    await reconcile.resync_all(self)
                await self.flush_events()
            except asyncio.CancelledError:
                raise
            except StoreUnavailable:
                pass  # logged once by db(); the next tick tries again
            except Exception:
                log.exception("scheduling tick failed; retrying next tick")

    async def tick(self) -> None:
        began = time.monotonic()
        await self._mark_silent_nodes_down()
        snapshot = await self.db(self.repo.load_snapshot, time.time())
        self.note_inventory(snapshot.nodes)
        if self.cfg.kill_invalid_depend:
            await self._cancel_unsatisfiable(snapshot)
        await self.reclaim.check(snapshot)
        plan = await self.decide(self.telemetry.mark_idle(snapshot))
        seen = {j.id: j.version for j in snapshot.jobs}  # reasons and starts only for the jobs as the policy saw them
        reasons = {w.job_id: w.reason for w in plan.waits}
        if self.cfg.telemetry.metrics_listen:  # a walk over every job: only for a page someone may scrape
            self.queue_stats.saw(snapshot, reasons)
        waiting = self.events.draft(lambda changed: [event_row("waiting", job_id, reason=reason)
                                                     for job_id, reason in changed.items()])
        await self.db(self.repo.set_reasons, reasons, seen, events=waiting)
        waiting.commit()
        for p in plan.preempts:
            await self.preempt(p.job_id, "preempt", p.reason, for_job=p.for_job, by="scheduler")
        # All of the pass's starts recorded in one transaction (with their events), before any
        # agent is told of them.
        started = self.events.draft(lambda recorded: [start_event(start, run) for start, run in
                                                      zip(plan.starts, recorded) if run])
        recorded = await self.db(self.repo.start_runs, [StartRequest(s.job_id, s.placement, seen.get(s.job_id))
                                                        for s in plan.starts], time.time(), events=started)
        started.commit()
        for start, run in zip(plan.starts, recorded):
            if not run:
                log.info("job %d: start no longer possible (%s), re-planning next tick", start.job_id, run.reason)
                continue
            if run.job.spec.mail_type:
                self.mail.notice(run.job, "BEGIN", start=run.job.start_time)
                self.limit_mails.watch(run.job, run.job.start_time, time.time())
            for rank, node in enumerate(start.placement.nodes):
                self.dispatch.start(run.job, run.attempt, rank, start.placement.nodes, start.placement.gpus[rank],
                                    run.mig[rank] if rank < len(run.mig) else None)
        now = time.time()
        for job, kind, start in self.limit_mails.due(now):
            self.mail.notice(job, kind, start=start, end=now)
        # Re-sending is the fallback for lost messages: once a tick is enough, not once per pass
        # (a burst of submissions and ends wakes a pass each; these are two queries each time).
        self.queue_stats.timed(time.monotonic() - began)
        if time.monotonic() - self._last_retry >= self.cfg.tick_seconds:
            self._last_retry = time.monotonic()
            await self.dispatch.retry_unfinished()

    async def _cancel_unsatisfiable(self, snapshot) -> None:
        """kill_invalid_depend: a job whose dependency can never be satisfied is cancelled."""
        for j in snapshot.jobs:
            if j.dependency == NEVER and await self.db(self.repo.cancel_pending, j.id, time.time(), why=NEVER):
                log.info("job %d: cancelled, its dependency can never be satisfied", j.id)

    def spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._tasks.append(task)
        task.add_done_callback(lambda t: self._tasks.remove(t) if t in self._tasks else None)

    # ---- runs --------------------------------------------------------------------------
    async def preempt(self, job_id: int, request: str, why: str, *, for_job: int | None = None,
                      by: str | None = None) -> bool:
        """Checkpoint-and-requeue a running job: record it, then tell its agents (notice + signal).

        `for_job`: the job the GPUs go to; `by`: who decided (the scheduler, or a user's name). A
        job that never said it can resume (JobSpec.resumes) loses its work: its record says so."""
        job = await self.db(self.repo.job_record, job_id)
        if request == "preempt" and job is not None and job.resumes is None:
            why = f"{why}; {WORK_LOST}"
        event = self.events.draft(lambda _: [event_row("preempted" if request == "preempt" else "requeue_requested",
                                                       job_id, for_job=for_job, by=by, reason=why)])
        if not await self.db(self.repo.request_end, job_id, request, why, events=event):
            return False
        event.commit()
        if request == "preempt":
            self.queue_stats.preemptions += 1
        await self.dispatch.end_job(job_id, request)
        return True

    async def run_ended(self, node: str, status: RunStatus) -> None:
        job_id, attempt = status.job_id, status.attempt
        result = await self._record_end((job_id, attempt, node, status))
        self.step_watches.run_ended(job_id, attempt, node)  # its srun's steps: their attachers hear the end
        if result.run_state is not None:
            for row in end_events([(job_id, attempt, node, status)], [result]):  # written with the end
                emit(row)
            await self._mail_end(job_id, attempt, result.job_state)
            if result.job_state is not None and result.job_state.is_final:  # salloc hears of its time limit now
                self.client_steps.revoke(job_id, result.job_state.value)
            rollup = self.telemetry.finish((job_id, attempt))
            if rollup is not None:
                try:
                    await self.db(self.repo.set_run_telemetry, [rollup])
                except StoreUnavailable:  # the end is recorded; only the last rollup is lost
                    log.warning("job %d attempt %d: final telemetry rollup not written", job_id, attempt)
        for peer in result.stop_ranks:
            log.info("job %d: rank on %s failed; stopping rank on %s", job_id, node, peer.node)
            await self.dispatch.tell_to_end(peer, "cancel")
        self.wake()  # the store has the end: the next pass may use the room without waiting for the ack below
        link = self.links.get(node)
        if link is not None and link.connected:
            try:  # acknowledged only after the store has the end: nothing is lost if we die before
                await link.call("forget_run", {"job_id": job_id, "attempt": attempt})
            except (RpcError, *AGENT_ERRORS) as exc:
                log.info("job %d: forget_run on %s failed (%s); the agent will report it again", job_id, node, exc)

    async def _mail_end(self, job_id: int, attempt: int, state: JobState | None) -> None:
        """--mail-type END/FAIL when the job has ended, REQUEUE when it went back to the queue."""
        if state is None or not (state.is_final or state == JobState.PENDING):
            return
        now = time.time()
        for job, kind, start in self.limit_mails.run_ended(job_id, state.is_final, now):
            self.mail.notice(job, kind, start=start, end=now)
        job = await self.db(self.repo.job_record, job_id)
        if job is None or not job.spec.mail_type:
            return
        run = next((r for r in await self.db(self.repo.runs, of_jobs=[job_id]) if r["attempt"] == attempt), None)
        times = dict(start=run["start_time"], end=run["end_time"]) if run else {}
        if state == JobState.PENDING:
            self.mail.notice(job, "REQUEUE", **times)
        else:
            self.mail.notice(job, "END", state=state.value, exit_code=job.exit_code, **times)

    async def _watch_running_limits(self) -> None:
        """After a restart: the TIME_LIMIT* mails of the running jobs still ahead (those passed
        were sent by the controller before)."""
        def load() -> list:
            rows = self.repo.jobs(states=[JobState.RUNNING.value], columns=["id", "time_limit"])
            return [r for r in (self.repo.job_record(row["id"]) for row in rows if row["time_limit"]) if r is not None]
        try:
            running = await self.db(load)
        except StoreUnavailable:
            log.warning("the TIME_LIMIT mails of the jobs running at this start are not sent: the store was "
                        "unavailable")
            return
        now = time.time()
        for job in running:
            if set(job.spec.mail_type) & set(LIMIT_MARKS):
                self.limit_mails.watch(job, job.start_time, now, skip_passed=True)

    async def _mark_silent_nodes_down(self) -> None:
        """A node silent for longer than node_down_after is down: its runs end as NODE_FAIL (and
        are requeued when they may be), and their other ranks are stopped."""
        now = time.time()
        for name in await self.db(self.repo.nodes_unreachable_since, now - self.cfg.node_down_after):
            link = self.links.get(name)
            why = f"Not responding for more than {self.cfg.node_down_after:g} s"
            if link is not None and link.last_error:
                why += f" ({link.last_error})"
            ranks = await self.db(self.repo.mark_down, name, why)
            log.warning("node %s is down: %s; failing %d run(s) there", name, why, len(ranks))
            self.events.record("node_down", None, name, reason=why, runs=len(ranks))
            for r in ranks:
                await self.run_ended(name, RunStatus.ended_by(r.job_id, r.attempt, r.rank, "node_fail",
                                                              f"node {name} stopped responding"))

    # ---- node link callbacks (controller/reconcile.py) ------------------------------------
    async def _on_hello(self, node: str, hello: dict) -> None:
        await reconcile.on_hello(self, node, hello)

    async def _persist_telemetry(self) -> None:
        """Live runs' rollups into the store now and then (their final one is written at the end)."""
        while True:
            await asyncio.sleep(self.cfg.telemetry.persist_interval)
            rows = self.telemetry.dirty_rows()
            try:
                await self.db(self.repo.set_run_telemetry, rows)
            except StoreUnavailable:
                pass  # the next round writes newer sums
            except Exception:
                log.exception("writing telemetry rollups failed")

    async def _on_event(self, node: str, name: str, body: Any) -> None:
        if name == "telemetry":
            self.telemetry.ingest(node, body)  # checks the batch; garbage is logged and dropped
        elif name == "run_exited":
            try:
                await self.run_ended(node, RunStatus.from_wire(body))
            except SpecError as exc:
                log.warning("node %s: a run_exited report is malformed (%s); dropped", node, exc)
            except StoreUnavailable:
                pass  # not acknowledged to the agent: the next resync delivers it again
        elif name == "health":
            await on_health(self, node, body)
        else:
            log.warning("node %s sent an unknown or malformed event %r", node, name)

    async def _on_lost(self, node: str, reason: str) -> None:
        self.events.record("node_lost", None, node, reason=reason)
        await self.db(self.repo.set_responding, node, False, time.time())
