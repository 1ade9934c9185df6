"""Trace loaders: detect the format by its header, return jobs in submit order.

Formats (times in seconds unless said otherwise; extra columns are ignored):
  elasticflow  job_id,submission_time,duration,num_gpu
  tiresias     job_id,num_gpu,submit_time,iterations,model_name,duration,interval
  philly       timestamp,duration,num_gpus,gpu_time,cluster   (Pollux/Sia processed Philly; the
               timestamp is a datetime or epoch seconds, rows are unsorted, `cluster` is the
               virtual cluster that --vc selects)
  canonical    submit_time,duration,gpus[,user][,priority][,name]    (ours)
Submit times are kept as the trace gives them (philly: seconds since its earliest row); only
differences matter. Rows asking for no GPUs are set aside with a reason, never silently dropped.
"""
from __future__ import annotations

import csv
import random
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Callable, Iterable

from ..core.model import PRIORITY_CLASSES


class TraceError(ValueError):
    """A trace the simulator cannot read; the message is one line for the user."""


@dataclass(frozen=True)
class TraceJob:
    id: str  # the trace's own id (the row number when it has none)
    submit: float
    duration: float  # seconds of work on its GPUs
    gpus: int | float  # a float below 1 is a share of one card (Alibaba-style traces have them)
    user: str = "user"
    priority: str = "normal"
    name: str = ""  # the job's name where the trace has one (Tiresias: model_name)


@dataclass(frozen=True)
class Trace:
    path: str
    format: str
    jobs: tuple[TraceJob, ...]  # sorted by submit time, ties in file order
    skipped: tuple[tuple[TraceJob, str], ...] = ()  # (job, reason) read but not replayable


@dataclass(frozen=True)
class _Format:
    name: str
    required: tuple[str, ...]
    row: Callable[[dict, int], TraceJob]


def _num(row: dict, key: str, line: int) -> float:
    text = (row.get(key) or "").strip()
    try:
        value = float(text)
    except ValueError:
        raise TraceError(f"line {line}: {key} {text!r} is not a number") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise TraceError(f"line {line}: {key} {text!r} is not a finite number")
    return value


def _int(row: dict, key: str, line: int) -> int:
    value = _num(row, key, line)
    if value != int(value):
        raise TraceError(f"line {line}: {key} {row.get(key)!r} is not a whole number")
    return int(value)


def _gpus(row: dict, key: str, line: int) -> int | float:
    """A GPU count: whole, or a fraction of one card (0 < x < 1)."""
    value = _num(row, key, line)
    if 0 < value < 1:
        return value
    if value != int(value):
        raise TraceError(f"line {line}: {key} {row.get(key)!r} is not a whole number (nor a fraction below 1)")
    return int(value)


def _job(line: int, ident: str | None, submit: float, duration: float, gpus: int, **kw) -> TraceJob:
    if duration < 0:
        raise TraceError(f"line {line}: negative duration {duration}")
    return TraceJob(id=(ident or "").strip() or str(line), submit=submit, duration=duration, gpus=gpus, **kw)


def _elasticflow(r: dict, line: int) -> TraceJob:
    return _job(line, r["job_id"], _num(r, "submission_time", line), _num(r, "duration", line),
                _gpus(r, "num_gpu", line))


def _tiresias(r: dict, line: int) -> TraceJob:
    return _job(line, r["job_id"], _num(r, "submit_time", line), _num(r, "duration", line),
                _gpus(r, "num_gpu", line), name=(r.get("model_name") or "").strip())


def _timestamp(text: str, line: int) -> float:
    text = (text or "").strip()
    try:
        return float(text)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(text)
    except ValueError:
        raise TraceError(f"line {line}: timestamp {text!r} is neither a datetime nor epoch seconds") from None
    return (dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)).timestamp()  # naive: no DST jumps


def _philly(r: dict, line: int) -> TraceJob:
    return _job(line, r.get("job_id") or r.get("name"), _timestamp(r["timestamp"], line),
                _num(r, "duration", line), _gpus(r, "num_gpus", line))


def _canonical(r: dict, line: int) -> TraceJob:
    priority = (r.get("priority") or "normal").strip().lower() or "normal"
    if priority not in PRIORITY_CLASSES:
        raise TraceError(f"line {line}: priority {priority!r} is not one of {', '.join(PRIORITY_CLASSES)}")
    return _job(line, r.get("job_id"), _num(r, "submit_time", line), _num(r, "duration", line),
                _gpus(r, "gpus", line), user=(r.get("user") or "user").strip() or "user", priority=priority,
                name=(r.get("name") or "").strip())


FORMATS = (
    _Format("tiresias", ("job_id", "num_gpu", "submit_time", "iterations", "model_name", "duration", "interval"),
            _tiresias),
    _Format("elasticflow", ("job_id", "submission_time", "duration", "num_gpu"), _elasticflow),
    _Format("philly", ("timestamp", "duration", "num_gpus", "gpu_time", "cluster"), _philly),
    _Format("canonical", ("submit_time", "duration", "gpus"), _canonical),
)


def detect_format(header: Iterable[str]) -> _Format:
    cols = {h.strip().lower() for h in header}
    for fmt in FORMATS:
        if set(fmt.required) <= cols:
            return fmt
    known = "; ".join(f"{f.name} ({','.join(f.required)})" for f in FORMATS)
    raise TraceError(f"unrecognised trace header {','.join(header)!r}; expected one of: {known}")


def load_trace(path: str, *, vc: str | None = None) -> Trace:
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            rows = list(csv.reader(f))
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror if isinstance(exc, OSError) else exc}") from None
    rows = [r for r in rows if any(c.strip() for c in r)]
    if not rows:
        raise TraceError(f"{path}: empty trace (no header)")
    header = [h.strip().lower() for h in rows[0]]
    fmt = detect_format(rows[0])
    if vc is not None and fmt.name != "philly":
        raise TraceError(f"--vc selects a Philly virtual cluster; {path} is a {fmt.name} trace")
    jobs, skipped, vcs = [], [], set()
    for line, values in enumerate(rows[1:], start=2):
        if len(values) < len(header):
            raise TraceError(f"{path}: line {line}: {len(values)} fields, the header has {len(header)}")
        row = dict(zip(header, values))
        if fmt.name == "philly":
            vcs.add(row["cluster"].strip())
            if vc is not None and row["cluster"].strip() != vc:
                continue
        try:
            job = fmt.row(row, line)
        except TraceError as exc:
            raise TraceError(f"{path}: {exc}") from None
        if job.gpus <= 0:
            skipped.append((job, "asks for no GPUs"))
        else:
            jobs.append(job)
    if vc is not None and not jobs and not skipped:
        raise TraceError(f"{path}: no jobs in virtual cluster {vc!r} (it has: {', '.join(sorted(vcs)) or 'none'})")
    jobs.sort(key=lambda j: j.submit)  # stable: ties keep file order
    if fmt.name == "philly" and (jobs or skipped):
        t0 = min(j.submit for j in jobs + [s for s, _ in skipped])
        jobs = [replace(j, submit=j.submit - t0) for j in jobs]
        skipped = [(replace(j, submit=j.submit - t0), why) for j, why in skipped]
    return Trace(path=path, format=fmt.name, jobs=tuple(jobs), skipped=tuple(skipped))


def prepare(jobs: Iterable[TraceJob], *, limit: int | None = None, load_scale: float = 1.0,
            seed: int | None = None) -> list[TraceJob]:
    """The first `limit` jobs, inter-arrival times divided by `load_scale` (2 = twice the load).

    A seed shuffles jobs that arrive at the same instant (their order is an artefact of the trace
    file); without one they keep file order. Either way the result is deterministic."""
    if load_scale <= 0:
        raise ValueError(f"--load-scale must be positive, got {load_scale}")
    if limit is not None and limit < 1:
        raise ValueError(f"--limit must be at least 1, got {limit}")
    out = list(jobs)
    if seed is not None:
        rng = random.Random(seed)
        decorated = sorted((j.submit, rng.random(), i) for i, j in enumerate(out))
        out = [out[i] for _, _, i in decorated]
    out = out[:limit] if limit is not None else out
    if out and load_scale != 1.0:
        t0 = out[0].submit
        out = [replace(j, submit=t0 + (j.submit - t0) / load_scale) for j in out]
    return out
