"""The event log: every decision that matters to a job or a node, as one structured line on stderr
(journald) and as a row in the store's `events` table (`hcontrol show events`).

Lines read `event=KIND job=ID node=NAME key=value ...`, values with spaces quoted, so that
`journalctl -u hai-controller | grep 'job=42 '` gives a job's story. Rows are buffered and
written in one transaction per scheduling tick (and before any read), so logging a decision
never costs a store round trip of its own.
"""
from __future__ import annotations

import logging
import time
from typing import Any

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
    "reservation_deleted": "an admin deleted a reservation",
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


class EventLog:
    def __init__(self) -> None:
        self._pending: list[dict] = []

    def record(self, kind: str, job: int | None = None, node: str | None = None, *, now: float | None = None,
               **detail: Any) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown event kind {kind!r}")
        detail = {k: v for k, v in detail.items() if v is not None}
        log.log(logging.WARNING if kind in WARNING_KINDS else logging.INFO, "%s", format_line(kind, job, node, detail))
        self._pending.append({"time": time.time() if now is None else now, "kind": kind, "job_id": job,
                              "node": node, "detail": detail})

    def take(self) -> list[dict]:
        """The rows not yet written; the caller writes them (and puts them back if it cannot)."""
        rows, self._pending = self._pending, []
        return rows

    def put_back(self, rows: list[dict]) -> None:
        self._pending[:0] = rows
