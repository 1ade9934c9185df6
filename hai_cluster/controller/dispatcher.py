"""Telling agents what the store decided (controller/service.py calls it after each record)."""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..store.records import JobRecord
from ..store.repository import RankRef
from ..protocol.runspec import RunStatus, SpecError
from ..transport.rpc import RpcError
from .dispatch import rank_spec
from .errors import StoreUnavailable
from .nodes import AGENT_ERRORS

if TYPE_CHECKING:
    from .service import Controller

log = logging.getLogger(__name__)


class Dispatcher:
    """Tells agents what the store has decided: start a rank, end or signal a run. Every request
    is idempotent (a run is keyed by job and attempt), so what may have been lost is sent again:
    starts never confirmed and ends never acknowledged, once a tick (retry_unfinished)."""

    def __init__(self, ctl: Controller) -> None:
        self.ctl = ctl
        self.in_flight: set[tuple[int, int, str]] = set()  # start_run requests under way
        self.told_to_end: set[tuple[int, int, str, int]] = set()  # (job, attempt, node, link generation)

    def start(self, job: JobRecord, attempt: int, rank: int, nodelist, gpus, mig: str | None = None) -> None:
        """Send the rank's start in the background (the tick does not wait for agents)."""
        self.ctl.spawn(self._start(job, attempt, rank, nodelist, gpus, mig))

    async def retry_unfinished(self) -> None:
        """Re-send what may have been lost: starts never confirmed, ends never acknowledged."""
        live = await self.ctl.db(self.ctl.repo.live_ranks)
        ending = {j["id"]: j["end_request"] for j in await self.ctl.db(self.ctl.repo.open_jobs_with_end_request)}
        for r in live:
            link = self.ctl.links.get(r.node)
            if link is None or not link.connected:
                continue
            if r.job_id in ending:
                await self.tell_to_end(r, ending[r.job_id])
            elif r.state == "starting" and (r.job_id, r.attempt, r.node) not in self.in_flight:
                job = await self.ctl.db(self.ctl.repo.job_record, r.job_id)
                if job is not None:
                    self.start(job, r.attempt, r.rank, job.nodelist_names, r.gpus, r.mig)

    async def _start(self, job: JobRecord, attempt: int, rank: int, nodelist, gpus, mig: str | None) -> None:
        node = nodelist[rank]
        key = (job.id, attempt, node)
        if key in self.in_flight:
            return
        self.in_flight.add(key)
        try:
            spec = rank_spec(job, attempt, rank, list(nodelist), list(gpus), self.ctl.addresses, mig,
                             cluster_name=self.ctl.cfg.cluster_name)
            reply = await self.ctl.links[node].call("start_run", {"spec": spec.to_wire()})
            status = RunStatus.from_wire(reply.get("status") if isinstance(reply, dict) else reply)
            if status.ended:
                await self.ctl.run_ended(node, status)
            else:
                await self.ctl.mark_running((job.id, attempt, node))
        except RpcError as exc:  # the agent refused the run: it can never start there
            log.warning("job %d: node %s refused the run: %s", job.id, node, exc)
            await self.ctl.run_ended(node, RunStatus.ended_by(job.id, attempt, rank, "launch_failed", str(exc)))
        except (*AGENT_ERRORS, SpecError) as exc:  # unknown whether it started: the retry pass asks again
            log.warning("job %d: dispatch to %s not confirmed (%s); will retry", job.id, node, exc)
        except StoreUnavailable:  # started but not recorded as running: the next resync records it
            pass
        except Exception as exc:  # noqa: BLE001 - the run cannot be built (a bug): it must not hold its GPUs
            log.exception("job %d: its run for %s cannot be dispatched", job.id, node)
            try:
                await self.ctl.run_ended(node, RunStatus.ended_by(job.id, attempt, rank, "launch_failed",
                                                                  f"the controller could not build the run: {exc}"))
            except StoreUnavailable:
                pass
        finally:
            self.in_flight.discard(key)

    async def tell_to_end(self, r: RankRef, reason: str) -> None:
        link = self.ctl.links[r.node]
        key = (r.job_id, r.attempt, r.node, link.generation)
        if key in self.told_to_end:
            return
        try:
            await link.call("terminate_run", {"job_id": r.job_id, "attempt": r.attempt, "reason": reason})
            self.told_to_end.add(key)
            if reason in ("preempt", "requeue"):
                self.ctl.events.record("checkpoint_notice", r.job_id, r.node, attempt=r.attempt, request=reason)
        except (RpcError, *AGENT_ERRORS) as exc:
            log.warning("job %d: could not tell %s to end the run (%s); will retry", r.job_id, r.node, exc)

    async def end_job(self, job_id: int, reason: str = "cancel") -> None:
        for r in await self.ctl.db(self.ctl.repo.live_ranks):
            if r.job_id == job_id:
                await self.tell_to_end(r, reason)

    async def signal_job(self, job_id: int, signum: int) -> int:
        delivered = 0
        for r in await self.ctl.db(self.ctl.repo.live_ranks):
            if r.job_id == job_id:
                try:
                    reply = await self.ctl.links[r.node].call(
                        "signal_run", {"job_id": r.job_id, "attempt": r.attempt, "signal": signum})
                    delivered += bool(reply.get("delivered"))
                except (RpcError, *AGENT_ERRORS) as exc:
                    log.warning("job %d: signal to %s failed: %s", job_id, r.node, exc)
        return delivered
