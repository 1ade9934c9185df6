"""The event log: every decision that matters to a job or a node, as one structured line on stderr
(journald) and as a row in the store's `events` table (`hcontrol show events`).

Lines read `event=KIND job=ID node=NAME key=value ...`, values with spaces quoted, so that
`journalctl -u hai-controller | grep 'job=42 '` gives a job's story.

An event of a change to the store (a submission, a start, an end, a cancel, a hold) is written
by the transaction that makes the change (`draft`): a controller killed at any instant leaves
no job without its `submitted` event, and no event of a change that did not commit. What the
controller observes without changing the store (a link drop, a notice sent to an agent) is
buffered (`record`) and written once per scheduling tick (and before any read).
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Iterable, Mapping

from ..core.states import JobState

log = logging.getLogger("hai.events")

# What each kind means (docs/OPERATIONS.md lists them too).
KINDS = {
    "submitted": "the job entered the queue",
    "waiting": "the job waits; the reason changed",
    "started": "a run started on these nodes and GPUs",
    "preempted": "the scheduler or an admin told the run to checkpoint and leave its GPUs",
    "requeue_requested": "the owner or an admin asked for checkpoint and requeue",
    "resumable": "the job's processes said it resumes after a preemption: time-slicing may take it",
    "checkpoint_notice": "the agent was told to write the notice and signal the run",
    "cancel_requested": "someone cancelled the job",
    "ended": "a run ended",
    "step_start": "srun started a job step of these tasks on these nodes",
    "step_end": "a job step ended (srun's report: its state and worst exit code)",
    "requeued": "the job is pending again after its run ended",
    "held": "the job was held",
    "released": "the job was released",
    "node_state": "an admin drained, resumed or downed a node",
    "node_down": "a node stopped responding for too long and went down",
    "node_lost": "the link to a node dropped",
    "node_up": "a node's agent answered and takes work",
    "node_added": "an admin registered a node",
    "node_removed": "an admin removed a node",
    "reservation_created": "an admin reserved these nodes for some users or accounts in a window",
    "reservation_updated": "an admin changed a reservation's flags",
    "reservation_deleted": "an admin deleted a reservation",
    "idle_warning": "the job's GPUs stayed under its idle threshold for its window: it was warned",
    "idle_cleared": "the warned job's GPUs got busy again: the idle warning is lifted",
    "idle_reclaimed": "the warned job stayed idle through its grace: it is cancelled or requeued",
}
WARNING_KINDS = {"node_down", "node_lost"}  # logged at WARNING: an operator should look


def quote(value: Any) -> str:
    s = str(value)
    if s == "" or any(ch in s for ch in ' "=\n\t'):
        return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    return s


def format_line(kind: str, job_id: int | None, node: str | None, detail: dict) -> str:
    parts = [f"event={kind}"]
    if job_id is not None:
        parts.append(f"job={job_id}")
    if node:
        parts.append(f"node={quote(node)}")
    parts += [f"{k}={quote(v)}" for k, v in detail.items() if v is not None]
    return " ".join(parts)


def event_row(kind: str, job: int | None = None, node: str | None = None, *, now: float | None = None,
              **detail: Any) -> dict:
    """An events-table row (detail without the None values); the kind must be one of KINDS."""
    if kind not in KINDS:
        raise ValueError(f"unknown event kind {kind!r}")
    return {"time": time.time() if now is None else now, "kind": kind, "job_id": job, "node": node,
            "detail": {k: v for k, v in detail.items() if v is not None}}


def emit(row: Mapping[str, Any]) -> None:
    """The row's one-line record on the log."""
    log.log(logging.WARNING if row["kind"] in WARNING_KINDS else logging.INFO, "%s",
            format_line(row["kind"], row["job_id"], row["node"], row["detail"]))


class Draft:
    """The events of one store transaction. The repository calls it inside the transaction with
    the change's result and writes the rows it returns there (store.events.journal); `commit()`
    logs their lines once the transaction has committed. Never called: the change did not happen
    (a duplicate submission, a job no longer pending), and nothing is logged."""

    def __init__(self, build: Callable[[Any], Iterable[dict]]) -> None:
        self._build = build
        self.rows: list[dict] = []
        self.built = False

    def __call__(self, result: Any) -> list[dict]:
        self.rows, self.built = list(self._build(result)), True  # a retried transaction builds anew
        return self.rows

    def commit(self) -> None:
        for row in self.rows:
            emit(row)


class EventLog:
    def __init__(self) -> None:
        self._pending: list[dict] = []

    def record(self, kind: str, job: int | None = None, node: str | None = None, *, now: float | None = None,
               **detail: Any) -> None:
        """An observation that changes nothing in the store: logged now, written with the next flush."""
        row = event_row(kind, job, node, now=now, **detail)
        emit(row)
        self._pending.append(row)

    @staticmethod
    def draft(build: Callable[[Any], Iterable[dict]]) -> Draft:
        return Draft(build)

    def take(self) -> list[dict]:
        """The rows not yet written; the caller writes them (and puts them back if it cannot)."""
        rows, self._pending = self._pending, []
        return rows

    def put_back(self, rows: list[dict]) -> None:
        self._pending[:0] = rows


def start_event(start: Any, run: Any) -> dict:
    """The `started` row of a plan's Start (scheduling.plan) recorded as `run` (store.records.StartedRun)."""
    p = start.placement
    return event_row("started", run.job.id, ",".join(p.nodes), attempt=run.attempt,
                     gpus=" ".join(f"{n}:{','.join(map(str, g))}" for n, g in zip(p.nodes, p.gpus) if g) or None,
                     reason=start.reason)


def end_events(ends: Iterable[tuple], results: Iterable[Any]) -> list[dict]:
    """`ended` (and `requeued`) rows of rank ends (job id, attempt, node, RunStatus) whose store
    results (store.repository.RankEnd) finished a run."""
    rows = []
    for (job_id, attempt, node, status), result in zip(ends, results):
        if result.run_state is None:
            continue
        rows.append(event_row("ended", job_id, node, attempt=attempt, state=result.run_state.value,
                              exit_code=status.exit_code, signal=status.signal, reason=status.reason))
        if result.job_state == JobState.PENDING:
            rows.append(event_row("requeued", job_id, attempt=attempt, after=result.run_state.value))
    return rows
