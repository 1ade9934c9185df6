"""hai-sim on the real traces in ../shared/traces: the policy comparison tables.

Each case runs the `hai-sim run ... --json` command a user would, and the table is made from its
JSON output, so the command printed with the table reproduces it exactly."""
from __future__ import annotations

import json
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TRACES = REPO.parent / "shared" / "traces"
POLICIES = ("fifo", "sjf", "tiresias", "backfill", "mlfq")

CASES = [  # (title, trace file, hai-sim options)
    ("ElasticFlow cluster02 (5,778 jobs), 16x8 GPUs", "elasticflow_cluster02.csv", ["--cluster", "16x8"]),
    ("ElasticFlow cluster02, 16x8 GPUs, twice the load", "elasticflow_cluster02.csv",
     ["--cluster", "16x8", "--load-scale", "2"]),
    ("ElasticFlow cluster02, 16x8 GPUs, restart cost 0 / 30 / 60 s", "elasticflow_cluster02.csv",
     ["--cluster", "16x8", "--sweep", "restart-cost=0,30,60", "-p", "mlfq", "-p", "tiresias", "-p", "sjf"]),
    ("Tiresias 60-job sample, 16x8 GPUs", "tiresias_60_job.csv", ["--cluster", "16x8"]),
    ("Tiresias 60-job sample, 1x8 GPUs", "tiresias_60_job.csv", ["--cluster", "1x8"]),
    ("ElasticFlow cluster10, 2x8 GPUs", "elasticflow_cluster10.csv", ["--cluster", "2x8"]),
]


def _h(seconds: float) -> str:
    return f"{seconds / 3600:.2f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min"


def run_case(trace: Path, options: list[str]) -> tuple[str, dict]:
    explicit = "-p" in options
    policies = [] if explicit else [a for p in POLICIES for a in ("-p", p)]
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        argv = ["hai-sim", "run", str(trace), *options, *policies, "--json", out.name]
        subprocess.run([str(Path(sys.executable).parent / "hai-sim"), *argv[1:]], check=True,
                       capture_output=True, text=True)
        doc = json.loads(Path(out.name).read_text())
    shown = " ".join(shlex.quote(a) for a in argv[:-2]).replace(str(TRACES), "../shared/traces")
    return shown, doc


def table(doc: dict) -> str:
    runs = doc["runs"]
    base = {(r["restart_cost"], r["load_scale"]): r["summary"] for r in runs if r["policy"] == "fifo"}
    lines = ["| policy | mean JCT | median | p95 | p99 | mean queueing | utilization | preemptions | GPU-h lost "
             "| mean JCT / FIFO | p99 / FIFO | sim time | events/s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        s = r["summary"]
        b = base.get((r["restart_cost"], r["load_scale"]))
        rel = (f"{s['mean_jct'] / b['mean_jct']:.2f} | {s['p99_jct'] / b['p99_jct']:.2f}" if b else "– | –")
        lines.append(f"| {r['label']} | {_h(s['mean_jct'])} | {_h(s['median_jct'])} | {_h(s['p95_jct'])} | "
                     f"{_h(s['p99_jct'])} | {_h(s['mean_queue_delay'])} | {100 * s['utilization']:.1f} % | "
                     f"{s['preemptions']} | {s['lost_gpu_s'] / 3600:.1f} | {rel} | {r['perf']['wall_s']:.1f} s | "
                     f"{r['perf']['events_per_s']:,.0f} |")
    return "\n".join(lines)


def section() -> str:
    if not TRACES.is_dir():
        return f"(skipped: no traces at {TRACES})"
    parts = []
    for title, name, options in CASES:
        command, doc = run_case(TRACES / name, options)
        skipped = doc.get("skipped") or []
        note = f" {len(skipped)} job(s) larger than the cluster skipped." if skipped else ""
        parts.append(f"#### {title}\n\n`{command}`{note}\n\n{table(doc)}")
    return "### hai-sim: the policies on real traces (restart cost 30 s unless swept)\n\n" + "\n\n".join(parts)
