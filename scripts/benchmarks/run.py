"""scripts/bench: run the benchmark suite and rewrite its sections of docs/BENCHMARKS.md.

Each section sits between `<!-- bench:NAME -->` and `<!-- /bench:NAME -->` markers and is replaced
whole, with the command that produced it, the date and the machine, so the file always says how
its numbers were made. Other text in the file is kept."""
from __future__ import annotations

import argparse
import compileall
import datetime
import os
import platform
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "BENCHMARKS.md"
sys.path.insert(0, str(REPO))

from scripts.benchmarks import decide_time, dependency_pass, interactive, preemption, shepherd_start, simulation, steps, telemetry, vs_slurm  # noqa: E402


def machine() -> str:
    return f"{platform.node() or 'host'}: {os.cpu_count()} CPUs, Python {platform.python_version()}, {platform.platform()}"


def section_decide(args) -> str:
    rows = decide_time.measure(reps=args.reps)
    lines = ["| policy | median | min–max | starts | preemptions | waits |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['policy']} | {r['median_s'] * 1000:.0f} ms | {r['min_s'] * 1000:.0f}–{r['max_s'] * 1000:.0f} ms"
                     f" | {r['starts']} | {r['preempts']} | {r['waits']} |")
    return ("### decide() on 10,000 pending and 2,000 running jobs, 1,000 nodes x 8 GPUs\n\n"
            "One scheduling pass of the pure policy on a seeded synthetic snapshot "
            "(`scripts/benchmarks/decide_time.py`), median of {reps}, the variants interleaved. The MLFQ "
            "pass also chooses the preemptions the snapshot calls for (attained service is spread over "
            "all levels, so many new jobs outrank runs past their minimum run: a worst case, not a "
            "typical tick): at most `max_preemptions` (256) runs per pass by default, every one of "
            "them with `max_preemptions=0`. `order=las` is the attained-service order before issue 24.\n\n"
            .format(reps=args.reps) + "\n".join(lines))


def section_preemption(args) -> str:
    r = preemption.measure(reps=args.reps)
    return ("### Preemption overhead added by the platform\n\n"
            "A dev cluster (one node, one simulated GPU, scheduler tick {tick} s) runs "
            "a checkpointing job past its quantum; a 1-GPU job arrives. overhead = (short job's first "
            "line − its submission) − (long job's exit − preempt notice), i.e. scheduler tick, store "
            "writes, agent RPCs and both launches, without the job's own checkpoint time "
            "(`scripts/benchmarks/preemption.py`).\n\n"
            "| runs | overhead median | overhead max | job's own checkpoint time (median) |\n|---|---|---|---|\n"
            "| {reps} | {om:.2f} s | {ox:.2f} s | {cm:.2f} s |").format(
        tick=r["tick_s"], reps=r["reps"], om=r["overhead_median_s"], ox=r["overhead_max_s"],
        cm=r["checkpoint_median_s"])


SECTIONS = {"decide": section_decide, "preemption": section_preemption,
            "simulation": lambda args: simulation.section(), "slurm": vs_slurm.section,
            "telemetry": telemetry.section, "shepherd": lambda args: shepherd_start.section(reps=3),
            "dependencies": dependency_pass.section, "steps": steps.section, "interactive": interactive.section,
            "listing": vs_slurm.listing_section}


def rewrite(name: str, body: str, command: str) -> None:
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    block = (f"<!-- bench:{name} -->\n{body}\n\nCommand: `{command}` — {stamp}, {machine()}\n"
             f"<!-- /bench:{name} -->")
    text = DOC.read_text() if DOC.exists() else "# Benchmarks\n"
    pattern = re.compile(rf"<!-- bench:{name} -->.*?<!-- /bench:{name} -->", re.S)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"
    DOC.parent.mkdir(exist_ok=True)
    DOC.write_text(text)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default=",".join(SECTIONS), help=f"comma list of {', '.join(SECTIONS)}")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--no-write", action="store_true", help="print, do not touch docs/BENCHMARKS.md")
    g = p.add_argument_group("slurm: hai-cluster and Slurm side by side (sizes for both)")
    g.add_argument("--jobs", type=int, default=500, help="jobs submitted for a/b (submit and drain throughput)")
    g.add_argument("--submitters", type=int, default=4, help="parallel submitters for a/b")
    g.add_argument("--throughput-reps", type=int, default=1, help="repetitions of a/b (median)")
    g.add_argument("--latency-jobs", type=int, default=20, help="back-to-back jobs for c (submit -> running)")
    g.add_argument("--latency-idle-jobs", type=int, default=10, help="jobs for c after --latency-gap s idle each")
    g.add_argument("--latency-gap", type=float, default=5.0)
    g.add_argument("--pending", type=int, default=1000, help="held jobs for d (hqueue, hcancel)")
    g.add_argument("--pending-large", type=int, default=10000, help="held jobs for the large hqueue table (0: skip)")
    g.add_argument("--listing-sizes", default="1000,10000", help="listing: jobs in the table, comma list")
    g.add_argument("--listing-reps", type=int, default=20, help="listing: calls of each command per size")
    g.add_argument("--slurm", choices=["live", "saved", "none"], default="live",
                   help="run the Slurm peer now (default), use its saved baseline, or measure only hai-cluster")
    g.add_argument("--slurm-results", metavar="JSON", help="a Slurm peer bench results file to compare with")
    args = p.parse_args()
    command = "scripts/bench " + " ".join(sys.argv[1:])
    # The CLI starts a process per command: compiled bytecode, as a package install leaves it
    # (a checkout run with PYTHONDONTWRITEBYTECODE, as scripts/test sets, would compile every time).
    compileall.compile_dir(str(Path(__file__).resolve().parents[2] / "hai_cluster"), quiet=1)
    for name in args.only.split(","):
        if name not in SECTIONS:
            p.error(f"unknown section {name!r}")
        body = SECTIONS[name](args)
        print(body + "\n")
        if not args.no_write:
            rewrite(name, body, command.strip())


if __name__ == "__main__":
    main()
