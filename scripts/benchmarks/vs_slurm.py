"""hai-cluster and Slurm side by side on this machine: the same tests, the same sizes, one table.

Ours run first on a `hai-dev` cluster (cluster_ops.py), then Slurm's through its peer scripts
(slurm_peer.py), never both at once: on 2 cores each would slow the other. Raw values of both go
to a JSON file under /tmp (its path is printed)."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import cluster_ops, slurm_peer
from .cluster_ops import pct

GOALS = {  # the goals, checked in the table
    "submit": "≥ Slurm", "drain": "≥ Slurm", "latency": "< 0.5 s", "hqueue_large": "< 0.3 s",
}


def _med(v):
    return statistics.median(v) if v else None


def rows(ours: dict, slurm: dict | None, a) -> list[tuple]:
    """(label, unit, ours, slurm, higher_is_better, goal, goal_met) for every measurement."""
    s = (slurm or {}).get("results", {})
    out = []

    def add(label, unit, mine, theirs, higher, goal=None, met=None):
        out.append((label, unit, mine, theirs, higher, goal, met))

    t, st = ours.get("throughput", {}), s.get("throughput", {})
    nd = s.get("throughput_no_delay", {})  # Slurm doing the same work: its jobs start during the burst too
    for key, row, goal in (("submit_jobs_per_s", f"a. submit {a.jobs} × `--wrap=true`, {{mode}}", "submit"),
                           ("drain_jobs_per_s", f"b. drain {a.jobs} trivial jobs, {{mode}} submit "
                                                "(first submit → queue empty)", "drain")):
        for label, theirs_by_mode in (("", st), (f"; Slurm with `{slurm_peer.NO_DELAY}` (its jobs start during "
                                                 "the burst, as ours do)", nd)):
            if not theirs_by_mode and label:
                continue
            for mode in t:
                mine, theirs = _med(t[mode][key]), _med(theirs_by_mode.get(mode, {}).get(key, []))
                add(row.format(mode=mode) + label, "jobs/s", mine, theirs, True, GOALS[goal],
                    None if theirs is None else mine >= theirs)
    lat, sl = ours.get("latency"), s.get("latency", {})
    if lat:
        for key, what in (("latency_s", f"back to back ({len(lat['latency_s'])} jobs)"),
                          ("latency_idle_s", f"{lat['idle_gap_s']:g} s idle before each ({len(lat['latency_idle_s'])} jobs)")):
            for q in (50, 95):
                theirs = pct(sl[key], q) if sl.get(key) else None
                mine = pct(lat[key], q)
                add(f"c. submit → running, {what}, p{q}", "s", mine, theirs, False, GOALS["latency"], mine < 0.5)
        kind = lat.get("hsubmit", "Python")  # raw values from before the C client do not say
        add(f"c. the submit command itself (`hsubmit` ({kind}) / `sbatch --parsable`), p50", "ms",
            _med(lat["sbatch_call_s"]) * 1000,
            _med(sl["sbatch_call_s"]) * 1000 if sl.get("sbatch_call_s") else None, False)
        if lat.get("python_call_s"):
            add(f"c. `hsubmit --hold`: the Python one (where no C compiler is; the {kind} one: "
                f"{_med(lat['held_call_s']) * 1000:.0f} ms), p50", "ms", _med(lat["python_call_s"]) * 1000, None, False)
    p, sp = ours.get("pending"), s.get("pending", {})
    if p:
        add(f"d. submit {a.pending} held jobs (`--hold`), sequential", "jobs/s", p["held_submit_jobs_per_s"],
            sp.get("held_submit_jobs_per_s"), True)
        add(f"d. `hqueue` / `squeue` with {p['pending_seen']} pending jobs, median of 5", "s", _med(p["squeue_s"]),
            _med(sp.get("squeue_s", [])), False)
        if p.get("squeue_ours_s"):
            add(f"d. our `squeue` / `squeue` with {p['pending_seen']} pending jobs, median of 5", "s",
                _med(p["squeue_ours_s"]), _med(sp.get("squeue_s", [])), False)
        add(f"d. `hcancel` / `scancel` of {a.pending} pending jobs (ids as arguments)", "s", p["scancel_cmd_s"],
            sp.get("scancel_cmd_s"), False)
        add("d. … until the queue is empty", "s", p["scancel_until_empty_s"], sp.get("scancel_until_empty_s"), False)
    pl, spl = ours.get("pending_large"), s.get("pending_large", {})
    if pl:
        mine = _med(pl["squeue_s"])
        slurm_n = f" (Slurm: {spl['pending_seen']}, below its MaxJobCount)" \
            if spl.get("pending_seen") not in (None, pl["pending_seen"]) else ""
        add(f"d. `hqueue` / `squeue` with {pl['pending_seen']} pending jobs{slurm_n}, median of 5", "s", mine,
            _med(spl.get("squeue_s", [])), False, GOALS["hqueue_large"], mine < 0.3)
        if pl.get("squeue_ours_s"):
            add(f"d. our `squeue` / `squeue` with {pl['pending_seen']} pending jobs{slurm_n}, median of 5", "s",
                _med(pl["squeue_ours_s"]), _med(spl.get("squeue_s", [])), False)
    return out


def _fmt(x, unit):
    if x is None:
        return "—"
    if unit == "jobs/s":
        return f"{x:.1f}"
    if unit == "ms":
        return f"{x:.0f}"
    return f"{x:.3f}" if x < 1 else f"{x:.2f}"


def _compare(mine, theirs, higher):
    if mine is None or theirs is None or mine <= 0 or theirs <= 0:
        return "—"
    ratio = mine / theirs
    better = ratio > 1 if higher else ratio < 1
    factor = ratio if ratio >= 1 else 1 / ratio
    if 0.95 <= ratio <= 1.05:
        return f"{ratio:.2f}× (same)"
    return f"{ratio:.2f}× ({factor:.1f}× {'better' if better else 'worse'})"


def table(ours: dict, slurm: dict | None, a) -> str:
    lines = ["| measurement | unit | hai-cluster | Slurm | hai / Slurm | goal |", "|---|---|---|---|---|---|"]
    for label, unit, mine, theirs, higher, goal, met in rows(ours, slurm, a):
        g = "" if goal is None else f"{goal}: {'met' if met else '**missed**'}" if met is not None else goal
        lines.append(f"| {label} | {unit} | {_fmt(mine, unit)} | {_fmt(theirs, unit)} | {_compare(mine, theirs, higher)}"
                     f" | {g} |")
    return "\n".join(lines)


def section(a) -> str:
    ours = cluster_ops.measure(jobs=a.jobs, submitters=a.submitters, reps=a.throughput_reps,
                               latency_jobs=a.latency_jobs, latency_idle_jobs=a.latency_idle_jobs,
                               latency_gap=a.latency_gap, pending=a.pending, pending_large=a.pending_large)
    slurm, how = None, "not measured (`--slurm none`)"
    if a.slurm == "live":
        try:
            slurm = slurm_peer.run_live(a.jobs, a.submitters, a.throughput_reps, a.latency_jobs,
                                        a.latency_idle_jobs, a.latency_gap, a.pending, a.pending_large)
            how = "measured live, right after hai-cluster, on the same machine (`up`, `bench`, `down`)"
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            print(f"[vs_slurm] live Slurm run failed ({exc}); using the saved baseline", file=sys.stderr)
            a.slurm = "saved"
    if a.slurm == "saved" or a.slurm_results:
        slurm = slurm_peer.load_saved(Path(a.slurm_results) if a.slurm_results else slurm_peer.BASELINE)
        how = (f"from a saved run, `{slurm['source']}` ({slurm['date'][:10]}; sizes: its own, "
               f"{slurm['args'].get('jobs')} jobs for a/b, {slurm['args'].get('pending')} for d)")
    # a fresh file of our own (mkstemp: O_EXCL, 0600), not a fixed name in /tmp another user could plant
    fd, name = tempfile.mkstemp(prefix=f"hai-bench-vs-slurm-{time.strftime('%Y%m%d-%H%M%S')}-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump({"hai": ours, "slurm": slurm}, f, indent=1)
    raw = Path(name)
    print(f"[vs_slurm] raw values: {raw}", file=sys.stderr)
    version = (slurm or {}).get("version") or "Slurm"
    return (
        "### hai-cluster and Slurm on the same machine\n\n"
        f"hai-cluster: `hai-dev up --nodes 4 --gpus-per-node 8 --cpus-per-node 64` (controller on SQLite, MLFQ, "
        "tick 1 s; jobs run "
        f"as root), the CLI run as a process per call. Slurm: {version}, the peer in `../shared/peers/slurm` "
        f"(4 slurmd × 8 GPUs, Slurm's default settings; for the rows that say so, again with "
        f"`SchedulerParameters={slurm_peer.NO_DELAY}`), {how}. Both run the same tests "
        "(`scripts/benchmarks/cluster_ops.py` mirrors the peer's `bench` a–d). hai / Slurm: above 1 is "
        "more jobs/s or more seconds. Our 10,000 held jobs are written straight into the store (hqueue is "
        "what is timed); Slurm's 9,990 go through sbatch after a cold restart (its MaxJobCount is 10,000). "
        "Both advertise 64 CPUs per node, whatever the machine has (`agent.cpus`; Slurm's `CPUs=`).\n\n"
        + table(ours, slurm, a))


def listing_section(a) -> str:
    """squeue and sacct with 1,000 and 10,000 jobs, ours and the Slurm peer's, p50 and p95."""
    sizes = [int(x) for x in a.listing_sizes.split(",")]
    ours = cluster_ops.measure_listing(sizes, a.listing_reps)
    slurm, note = None, ""
    if a.slurm == "live":
        try:
            slurm = slurm_peer.run_listing(sizes, a.listing_reps)
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            note = f" The Slurm peer's run failed ({str(exc)[:200]})."
    fd, name = tempfile.mkstemp(prefix=f"hai-bench-listing-{time.strftime('%Y%m%d-%H%M%S')}-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump({"hai": ours, "slurm": slurm}, f, indent=1)
    print(f"[vs_slurm] raw values: {name}", file=sys.stderr)
    theirs = (slurm or {}).get("results", {})
    lines = ["| jobs | command | hai p50 | hai p95 | hai right after a write, p50 / p95 | Slurm p50 | Slurm p95 "
             "| hai / Slurm (p50) |", "|---|---|---|---|---|---|---|---|"]
    ms = lambda v: f"{v * 1000:.0f} ms"  # noqa: E731
    for size in sizes:
        mine, their = ours[str(size)], theirs.get(str(size), {})
        for cmd, times in mine["polled_s"].items():
            after = mine["after_write_s"][cmd]
            python = cmd.split(" ", 1)[0].endswith(cluster_ops.PYTHON)
            slurm_cmd = cmd.replace(cluster_ops.PYTHON, "", 1)
            t = their.get("polled_s", {}).get(slurm_cmd) or []
            p50 = statistics.median(times)
            s50 = statistics.median(t) if t else None
            jobs = f"{mine['pending_seen']}" + (f" (Slurm: {their['pending_seen']})"
                                                if their and their["pending_seen"] != mine["pending_seen"] else "")
            cell = slurm_cmd.replace("|", "\\|")  # a | in a table cell, even in code, ends the cell
            label = f"`{cell}`" + (" (Python)" if python else "")
            lines.append(f"| {jobs} | {label} | {ms(p50)} | {ms(pct(times, 95))} | {ms(statistics.median(after))} / "
                         f"{ms(pct(after, 95))} | {ms(s50) if t else '—'} | {ms(pct(t, 95)) if t else '—'} | "
                         f"{_compare(p50, s50, False)} |")
    version = (slurm or {}).get("version") or "Slurm"
    no_acct = any(not v.get("accounting", True) for v in theirs.values())
    return ("### squeue and sacct with 1,000 and 10,000 jobs, hai-cluster and Slurm\n\n"
            f"hai-cluster: `hai-dev up --nodes 4 --gpus-per-node 8` (SQLite), held jobs (all but one written "
            f"straight into the store, the last through `hsubmit`); each command a process, {a.listing_reps} "
            "calls each, the commands interleaved. `squeue` and `sacct` are the compiled front ends where "
            "they were built (`hai_cluster/native/squeue.c`, `sacct.c`: the controller renders the text), "
            "*(Python)* the Python squeue or sacct they fall back to, timed beside them. *Polled*: nothing changes between calls, as when a "
            "tool polls a quiet queue: the controller serves the listing it keeps until the store's next write. "
            "*Right after a write*: one job cancelled before each call (the store is read again). "
            f"Slurm: {version}, the peer in `../shared/peers/slurm` (cold start, jobs through `sbatch`, below "
            "its MaxJobCount), measured right after, on the same machine"
            + (": its sacct could not be given accounting (`scripts/benchmarks/slurm_accounting.py`), so its jobs "
               "are held and sacct has no Slurm column." if no_acct else
               ", with accounting for the run (`scripts/benchmarks/slurm_accounting.py`: a slurmdbd on a private "
               "MariaDB); its jobs pending behind one job that holds every node, not held: Slurm's sacct lists "
               "no held job (it has no eligible time), so its scheduler has them to consider, as a busy "
               "cluster's has.") + note + "\n\n" + "\n".join(lines))
