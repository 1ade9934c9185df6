"""Idle reclamation: a running job whose GPUs stay under its threshold for its window is warned,
and after its grace it is cancelled (or requeued) so that its GPUs go to someone who uses them.

Each scheduling pass takes the live runs' new telemetry samples from the hub and moves their idle
clocks (scheduling/idle.py: pure; the settings: config/idle.py, per partition and QOS). A warning
is an `idle_warning` event, the file `idle` in the run's control dir on each of its nodes
($HAI_CONTROL_DIR/idle, through the agent), a line on the terminal of the salloc or srun that
holds an interactive job, and a mail with --mail-type=IDLE (or ALL). A job whose GPUs get busy
again is told the warning is lifted (`idle_cleared`; the file goes). The action is recorded as the
run's and the job's reason ("IdleReclaimed: ...") and as an `idle_reclaimed` event.

Clocks live here and in the store (runs.idle_since, runs.idle_warned): written when a clock starts,
stops or warns, and read back at a start, so a restarted controller goes on with each job's
window instead of giving it a fresh one.
"""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from ..config.idle import IdleSettings
from ..core.model import JobView, Snapshot
from ..core.states import JobState
from ..core.timefmt import slurm_duration
from ..scheduling.idle import ACT, WARN, IdleClock, judge, observe_all, warned
from ..store import idle as store
from ..transport.rpc import RpcError
from .errors import StoreUnavailable
from .events import event_row
from .nodes import AGENT_ERRORS

if TYPE_CHECKING:
    from .service import Controller

log = logging.getLogger(__name__)

Key = tuple[int, int]
REASON = "IdleReclaimed"  # the reason an idle job's end is recorded with (squeue %r, sacct Reason)


def _action_of(job: JobView, s: IdleSettings) -> str:
    """requeue only for a batch job that may be requeued; every other job is cancelled."""
    return "requeue" if s.action == "requeue" and not job.interactive and job.preemptible else "cancel"


class Reclaimer:
    def __init__(self, ctl: "Controller") -> None:
        self.ctl = ctl
        self.clocks: dict[Key, IdleClock] = {}
        self.settings: dict[Key, IdleSettings] = {}
        self._stored: dict[Key, IdleClock] | None = None  # read once from the store, then merged
        # (interactive, partition, QOS) -> settings: the config is fixed for the controller's life
        self._resolved: dict[tuple, IdleSettings | None] = {}

    def fields(self, job_id: int, attempt: int) -> dict:
        """hqueue %W and show job's IdleFor=/IdleLimit=: seconds idle so far, the window (None: off)."""
        s = self.settings.get((job_id, attempt))
        if s is None:
            return {"idle_for": None, "idle_limit": None}
        clock = self.clocks.get((job_id, attempt), IdleClock())
        return {"idle_for": round(clock.idle_for), "idle_limit": s.window}

    async def check(self, snapshot: Snapshot) -> None:
        """One pass: the new samples into the clocks, then the warnings and actions they call for."""
        ctl = self.ctl
        if self._stored is None:
            try:
                self._stored = await ctl.db(store.running_clocks, ctl.repo.engine)
            except StoreUnavailable:
                return  # nothing is judged before the stored clocks are in: none starts afresh
        samples = ctl.telemetry.take_samples()
        running = {j.id: j for j in snapshot.jobs if j.state == JobState.RUNNING}
        changed: dict[Key, IdleClock] = {}
        for key, points in samples.items():
            job = running.get(key[0])
            if job is None:
                continue
            how = (job.interactive, job.partition, job.qos)
            s = self._resolved[how] if how in self._resolved else self._resolved.setdefault(
                how, ctl.cfg.idle_settings(interactive=job.interactive, partition=job.partition, qos=job.qos))
            if s is None:
                self.settings.pop(key, None)
                self.clocks.pop(key, None)
                continue
            self.settings[key] = s
            before = self.clocks.get(key)
            if before is None:
                before = self._stored.pop(key, IdleClock())
            after = observe_all(before, points, s.threshold)
            self.clocks[key] = after
            if (before.since, before.warned) != (after.since, after.warned):
                changed[key] = after
            if before.warned is not None and after.warned is None:
                self._cleared(job, key, s)
        for key in [k for k in self.clocks if k[0] not in running]:  # ended, or on its way out
            self.clocks.pop(key, None)
            self.settings.pop(key, None)
        # A verdict changes only with its clock, and a clock only with new samples.
        for key in [k for k in samples if k in self.clocks]:
            clock, job, s = self.clocks[key], running[key[0]], self.settings[key]
            verdict = judge(clock, s.window, s.grace)
            if verdict.kind == WARN:
                self.clocks[key] = changed[key] = warned(clock)
                await self._warn(job, key, s, verdict.idle_for)
            elif verdict.kind == ACT:
                del self.clocks[key]
                await self._act(job, key, s, verdict.idle_for)
        if changed:
            try:
                await ctl.db(store.save_clocks, ctl.repo.engine, list(changed.items()))
            except StoreUnavailable:
                log.warning("%d idle clock(s) not written: the store is unavailable", len(changed))

    # ---- telling the job ------------------------------------------------------------------
    def _tell_nodes(self, job: JobView, key: Key, notice: dict | None) -> None:
        for node in dict.fromkeys(n for n, _ in job.allocation):
            self.ctl.spawn(self._notice(node, key, notice))

    async def _notice(self, node: str, key: Key, notice: dict | None) -> None:
        link = self.ctl.links.get(node)
        if link is None or not link.connected:
            return
        try:
            await link.call("idle_notice", {"job_id": key[0], "attempt": key[1], "notice": notice})
        except (RpcError, *AGENT_ERRORS) as exc:
            log.info("job %d: idle notice on %s failed (%s)", key[0], node, exc)

    async def _warn(self, job: JobView, key: Key, s: IdleSettings, idle_for: float) -> None:
        ctl, action = self.ctl, _action_of(job, s)
        text = (f"job {job.id}: its GPUs have been under {s.threshold:g}% utilization for "
                f"{slurm_duration(idle_for)}; it will be {'requeued' if action == 'requeue' else 'cancelled'} "
                f"after {slurm_duration(s.grace)} more unless they get busy (idle reclamation)")
        log.info("%s", text)
        ctl.events.record("idle_warning", job.id, None, attempt=key[1], idle_for=round(idle_for),
                          threshold=s.threshold, window=round(s.window), grace=round(s.grace), action=action)
        self._tell_nodes(job, key, {"idle_for": round(idle_for), "threshold": s.threshold, "window": s.window,
                                    "grace": s.grace, "action": action, "time": time.time(), "message": text})
        ctl.client_steps.tell(job.id, text)
        try:
            record = await ctl.db(ctl.repo.job_record, job.id)
        except StoreUnavailable:
            return
        if record is not None and record.spec.mail_type:
            ctl.mail.notice(record, "IDLE", start=record.start_time, end=time.time())

    def _cleared(self, job: JobView, key: Key, s: IdleSettings) -> None:
        self.ctl.events.record("idle_cleared", job.id, None, attempt=key[1], threshold=s.threshold)
        self._tell_nodes(job, key, None)
        self.ctl.client_steps.tell(job.id, f"job {job.id}: its GPUs are busy again; the idle warning is lifted")

    async def _act(self, job: JobView, key: Key, s: IdleSettings, idle_for: float) -> None:
        ctl, action = self.ctl, _action_of(job, s)
        why = f"{REASON}: GPUs under {s.threshold:g}% for {slurm_duration(idle_for)}"
        log.info("job %d: %s; %s", job.id, why, "requeueing it" if action == "requeue" else "cancelling it")
        ctl.client_steps.tell(job.id, f"job {job.id}: {why}; {'requeued' if action == 'requeue' else 'cancelled'}")
        if action == "requeue":
            if await ctl.preempt(job.id, "requeue", why, by="idle reclamation"):
                ctl.events.record("idle_reclaimed", job.id, None, attempt=key[1], idle_for=round(idle_for),
                                  action=action)
            return
        # written with the cancel itself: no reclaimed event without the cancel, nor the reverse
        event = ctl.events.draft(lambda _: [
            event_row("idle_reclaimed", job.id, attempt=key[1], idle_for=round(idle_for), action=action),
            event_row("cancel_requested", job.id, by="idle reclamation", state=JobState.RUNNING.value)])
        if await ctl.db(ctl.repo.request_end, job.id, "cancel", why, events=event):
            event.commit()
            ctl.client_steps.revoke(job.id, JobState.CANCELLED.value)
            await ctl.dispatch.end_job(job.id, "cancel")
