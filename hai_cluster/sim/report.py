"""Turn runs into what people read: a summary document (JSON), a rich table, per-job CSV, a plot."""
from __future__ import annotations

import csv
import json
import math
from typing import Any, Sequence

from .metrics import by_bucket, ratios, summarize, utilization_series
from .runner import Run


def fmt_duration(seconds: float) -> str:
    if seconds is None or math.isnan(seconds):
        return "-"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.2f} h"
    return f"{seconds / 86400:.2f} d"


def _ratio(x: float) -> str:
    return "-" if x is None or math.isnan(x) else f"{x:.2f}x"


def baseline_of(run: Run, runs: Sequence[Run], baseline: str) -> Run | None:
    return next((r for r in runs if r.policy == baseline and r.point == run.point), None)


def summary_doc(runs: Sequence[Run], *, baseline: str, trace: dict[str, Any], cluster: str,
                skipped: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Everything the table shows, as plain data (the --json output)."""
    out = []
    for run in runs:
        s = summarize(run.result)
        base = baseline_of(run, runs, baseline)
        bs = summarize(base.result) if base else None
        res = run.result
        entry = {
            "label": run.label, "policy": run.policy, "restart_cost": run.point.restart_cost,
            "restart_cost_per_gpu": run.point.restart_cost_per_gpu, "load_scale": run.point.load_scale,
            "summary": s.as_dict(), "vs_baseline": ratios(s, bs) if bs else None,
            "perf": {"events": res.events, "decisions": res.decisions, "wall_s": res.wall_s, "policy_s": res.policy_s,
                     "events_per_s": res.events / res.wall_s if res.wall_s > 0 else None, "reused": run.reused},
        }
        for kind in ("size", "duration"):
            buckets = by_bucket(res, kind)
            base_buckets = by_bucket(base.result, kind) if base else {}
            entry[f"by_{kind}"] = {
                label: {"jobs": b.jobs, "mean_jct": b.mean_jct, "p99_jct": b.p99_jct,
                        "mean_queue_delay": b.mean_queue_delay, "preemptions": b.preemptions,
                        "mean_jct_vs_baseline": ratios(b, base_buckets[label])["mean_jct"]
                        if label in base_buckets else None}
                for label, b in buckets.items()}
        out.append(entry)
    return {"trace": trace, "cluster": cluster, "baseline": baseline, "skipped": list(skipped), "runs": out}


_ROWS = [
    ("jobs", lambda e: str(e["summary"]["jobs"])),
    ("mean JCT", lambda e: fmt_duration(e["summary"]["mean_jct"])),
    ("median JCT", lambda e: fmt_duration(e["summary"]["median_jct"])),
    ("p95 JCT", lambda e: fmt_duration(e["summary"]["p95_jct"])),
    ("p99 JCT", lambda e: fmt_duration(e["summary"]["p99_jct"])),
    ("mean queueing delay", lambda e: fmt_duration(e["summary"]["mean_queue_delay"])),
    ("makespan", lambda e: fmt_duration(e["summary"]["makespan"])),
    ("GPU utilization", lambda e: f"{100 * e['summary']['utilization']:.1f}%"),
    ("preemptions", lambda e: str(e["summary"]["preemptions"])),
    ("GPU-hours lost to restarts", lambda e: f"{e['summary']['lost_gpu_s'] / 3600:.1f}"),
    ("mean JCT / baseline", lambda e: _ratio((e["vs_baseline"] or {}).get("mean_jct", math.nan))),
    ("median JCT / baseline", lambda e: _ratio((e["vs_baseline"] or {}).get("median_jct", math.nan))),
    ("p99 JCT / baseline", lambda e: _ratio((e["vs_baseline"] or {}).get("p99_jct", math.nan))),
    ("events/s (simulator)", lambda e: "reused" if e["perf"]["reused"] else f"{e['perf']['events_per_s'] or 0:,.0f}"),
    ("wall time", lambda e: "-" if e["perf"]["reused"] else f"{e['perf']['wall_s']:.1f} s"),
]


def render(doc: dict[str, Any], console) -> None:
    """The side-by-side summary and the per-bucket mean JCTs, as rich tables."""
    from rich.table import Table
    tr = doc["trace"]
    runs = doc["runs"]
    title = (f"{tr['path']} ({tr['format']}, {tr['jobs']} jobs) on {doc['cluster']}, "
             f"baseline {doc['baseline']}" + (", sizes known (a bound)" if tr.get("known_sizes") else ""))
    table = Table(title=title, title_justify="left", header_style="bold")
    table.add_column("")
    for e in runs:
        table.add_column(e["label"], justify="right")
    for name, cell in _ROWS:
        table.add_row(name, *(cell(e) for e in runs))
    console.print(table)
    for kind, what in (("size", "GPUs asked"), ("duration", "true duration")):
        t = Table(title=f"mean JCT by {what} (ratio to {doc['baseline']})", title_justify="left",
                  header_style="bold")
        t.add_column("bucket")
        for e in runs:
            t.add_column(e["label"], justify="right")
        labels = list(dict.fromkeys(label for e in runs for label in e[f"by_{kind}"]))
        for label in labels:
            n = next(e[f"by_{kind}"][label]["jobs"] for e in runs if label in e[f"by_{kind}"])
            cells = []
            for e in runs:
                b = e[f"by_{kind}"].get(label)
                cells.append("-" if b is None else
                             f"{fmt_duration(b['mean_jct'])} ({_ratio(b['mean_jct_vs_baseline'] or math.nan)})")
            t.add_row(f"{label} ({n})", *cells)
        console.print(t)
    if doc["skipped"]:
        reasons: dict[str, int] = {}
        for s in doc["skipped"]:
            reasons[s["reason"]] = reasons.get(s["reason"], 0) + 1
        console.print("skipped " + ", ".join(f"{n} job(s): {why}" for why, n in reasons.items()))


CSV_FIELDS = ("run", "policy", "restart_cost", "restart_cost_per_gpu", "load_scale", "job", "trace_id", "submit",
              "duration", "gpus", "gpus_alloc", "first_start", "end", "jct", "queue_delay", "preemptions",
              "busy_gpu_s", "lost_gpu_s")


def write_csv(path: str, runs: Sequence[Run]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_FIELDS)
        for run in runs:
            p = run.point
            for r in run.result.records:
                w.writerow((run.label, run.policy, p.restart_cost, p.restart_cost_per_gpu, p.load_scale, r.id,
                            r.trace_id, r.submit, r.duration, r.gpus, r.gpus_alloc, r.first_start, r.end,
                            r.jct, r.queue_delay, r.preemptions, r.busy_gpu_s, r.lost_gpu_s))


def write_json(path: str, doc: dict[str, Any]) -> None:
    def clean(x):  # JSON has no NaN
        if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
            return None
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, list):
            return [clean(v) for v in x]
        return x
    with open(path, "w") as f:
        json.dump(clean(doc), f, indent=2)
        f.write("\n")


def write_plot(path: str, runs: Sequence[Run], title: str) -> None:
    """JCT CDF per run (log time axis) above GPU utilization over time."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 8))
    span = max((summarize(r.result).makespan for r in runs), default=0.0)
    unit, per = ("days", 86400.0) if span > 3 * 86400 else ("hours", 3600.0)
    for run in runs:
        jcts = sorted(max(r.jct, 1.0) / 3600 for r in run.result.records)
        if jcts:
            ax1.step(jcts, [(i + 1) / len(jcts) for i in range(len(jcts))], where="post", label=run.label)
        t, u = utilization_series(run.result)
        if t:
            t0 = t[0]
            ax2.plot([(x - t0) / per for x in t], [100 * v for v in u], label=run.label, linewidth=1)
    ax1.set_xscale("log")
    ax1.set_xlabel("job completion time (hours, log scale)")
    ax1.set_ylabel("fraction of jobs")
    ax1.set_title(title)
    ax1.grid(True, which="both", alpha=0.3)
    ax1.legend(loc="lower right")
    ax2.set_xlabel(f"{unit} since the first submit")
    ax2.set_ylabel("GPU utilization (%)")
    ax2.set_ylim(0, 105)
    ax2.grid(True, alpha=0.3)
    ax2.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
