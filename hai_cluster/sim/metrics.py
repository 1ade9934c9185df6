"""What a replay measured, per policy: JCT percentiles, queueing, makespan, utilization, restarts.

JCT = completion - submit. Queueing delay = first start - submit. Makespan = the span from the
first submit to the last completion; utilization = busy GPU-seconds (restart redo included) /
(cluster GPUs x makespan). Buckets split jobs by the GPUs they asked for and by their true
duration, because an MLFQ trades long-job latency for short-job latency.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Iterable, Sequence

from .engine import JobRecord, SimResult

INF = math.inf
SIZE_BUCKETS = (("<1 GPU", 0, 0.999999), ("1 GPU", 1, 1), ("2-4 GPUs", 2, 4), ("5-8 GPUs", 5, 8), (">8 GPUs", 9, INF))
# [low, high) seconds: interactive-ish, short runs, a working day, multi-day training.
DURATION_BUCKETS = (("<10 min", 0, 600), ("10 min-1 h", 600, 3600), ("1-10 h", 3600, 36000), (">10 h", 36000, INF))


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); nan for no values."""
    if not sorted_values:
        return math.nan
    k = (len(sorted_values) - 1) * p / 100.0
    lo = math.floor(k)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


@dataclass(frozen=True)
class Summary:
    jobs: int
    mean_jct: float
    median_jct: float
    p95_jct: float
    p99_jct: float
    mean_queue_delay: float
    makespan: float
    utilization: float  # 0..1
    preemptions: int
    lost_gpu_s: float

    def as_dict(self) -> dict:
        return asdict(self)


def summarize_records(records: Iterable[JobRecord], total_gpus: int) -> Summary:
    records = list(records)
    jcts = sorted(r.jct for r in records)
    span = (max(r.end for r in records) - min(r.submit for r in records)) if records else 0.0
    busy = sum(r.busy_gpu_s for r in records)
    return Summary(
        jobs=len(records), mean_jct=_mean(jcts), median_jct=percentile(jcts, 50), p95_jct=percentile(jcts, 95),
        p99_jct=percentile(jcts, 99), mean_queue_delay=_mean([r.queue_delay for r in records]), makespan=span,
        utilization=busy / (total_gpus * span) if span > 0 else 0.0,
        preemptions=sum(r.preemptions for r in records), lost_gpu_s=sum(r.lost_gpu_s for r in records))


def summarize(result: SimResult) -> Summary:
    return summarize_records(result.records, result.cluster.total_gpus)


def ratios(summary: Summary, base: Summary) -> dict[str, float]:
    """JCT statistics relative to the baseline run (below 1 is better)."""
    def r(a: float, b: float) -> float:
        return a / b if b and not math.isnan(b) else math.nan
    return {"mean_jct": r(summary.mean_jct, base.mean_jct), "median_jct": r(summary.median_jct, base.median_jct),
            "p99_jct": r(summary.p99_jct, base.p99_jct),
            "mean_queue_delay": r(summary.mean_queue_delay, base.mean_queue_delay)}


def size_bucket(gpus: int) -> str:
    return next(label for label, lo, hi in SIZE_BUCKETS if lo <= gpus <= hi)


def duration_bucket(seconds: float) -> str:
    return next(label for label, lo, hi in DURATION_BUCKETS if lo <= seconds < hi)


def by_bucket(result: SimResult, kind: str) -> dict[str, Summary]:
    """Per size ("size") or duration ("duration") bucket, in bucket order, empty buckets left out.

    Utilization and makespan in a bucket summary are over the bucket's own jobs (not meaningful
    alone); JCT, queueing and restarts are what to read."""
    key, labels = ((lambda r: size_bucket(r.gpus)), SIZE_BUCKETS) if kind == "size" else \
        ((lambda r: duration_bucket(r.duration)), DURATION_BUCKETS)
    groups: dict[str, list[JobRecord]] = {label: [] for label, _, _ in labels}
    for rec in result.records:
        groups[key(rec)].append(rec)
    return {label: summarize_records(recs, result.cluster.total_gpus) for label, recs in groups.items() if recs}


def utilization_series(result: SimResult, bins: int = 200) -> tuple[list[float], list[float]]:
    """(bin start times, mean busy fraction in each bin) from the busy-GPU step function."""
    tl = result.timeline
    if not tl or not result.records:
        return [], []
    start, end = min(r.submit for r in result.records), max(r.end for r in result.records)
    if end <= start:
        return [start], [0.0]
    width = (end - start) / bins
    area = [0.0] * bins
    points = tl + [(end, 0)]
    for (t0, busy), (t1, _) in zip(points, points[1:]):
        t0, t1 = max(t0, start), min(t1, end)
        if t1 <= t0 or not busy:
            continue
        first, last = (min(int((x - start) / width), bins - 1) for x in (t0, t1))
        for b in range(first, last + 1):
            lo = max(t0, start + b * width)
            hi = t1 if b == bins - 1 else min(t1, start + (b + 1) * width)
            if hi > lo:
                area[b] += busy * (hi - lo)
    total = result.cluster.total_gpus
    return [start + i * width for i in range(bins)], [a / (width * total) for a in area]
