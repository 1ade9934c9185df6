"""hacct's and sacct's rows: one per run of each job, each followed by its steps, and their
fields (no click here: sacct's fast start, fastargs.py)."""
from __future__ import annotations

from ..core.hostlist import compress
from ..core.jobids import job_label
from ..core.timefmt import format_duration
from .common import iso_time
from .jobfields import cpus
from .telemetry_fmt import energy, mib

# The job keys that rows_for, step_rows and sacct's fields read: what sacct asks the controller for
# (a tenth of a job's columns; tests/unit/test_listing_fast.py checks that it is enough).
ACCT_JOB_KEYS = ("array_job_id", "array_task_id", "constraint", "cpus_per_task", "end_time", "exit_code",
                 "exit_signal", "id", "interactive", "mem_mb", "name", "nodes", "overcommit", "partition", "priority", "qos",
                 "reason", "restart_count", "start_time", "state", "submit_time", "tasks_per_node", "time_limit",
                 "uid", "user")

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable


def _state(row: dict) -> str:
    why = row.get("reason") or ""
    if row["state"] == "CANCELLED" and why.startswith("cancelled by "):
        return f"CANCELLED by {why.split()[-1]}"
    return row["state"]


def _opt(v, fmt: str) -> str:
    return "" if v is None else fmt.format(v)


def _elapsed(row: dict) -> int:
    if not row.get("start_time"):
        return 0
    return int((row.get("end_time") or row["now"]) - row["start_time"])


def _ranks(row: dict) -> int:
    return len([n for n in (row.get("nodelist") or "").split(",") if n]) or 1


def _avecpu(row: dict) -> float | None:
    """Percent of one CPU per rank: from the cgroups' CPU time once the run ended, else (running,
    or a node without cgroups) the telemetry samples' mean."""
    if row.get("cpu_seconds") is not None and _elapsed(row) > 0:
        return row["cpu_seconds"] / _elapsed(row) / _ranks(row) * 100
    return row.get("cpu_mean")


def _charged(row: dict) -> float:
    """GPUs the run is charged: whole GPUs, or a sharing run's share (0.25)."""
    return row.get("gpu_charge") or row["gpus"]


FIELDS: dict[str, Callable[[dict], object]] = {
    # 12_4 for a task of array 12; 12.batch and 12.0 for its steps
    "jobid": lambda r: job_label({**r, "id": r["job_id"]}) + ("" if r.get("step") is None else f".{r['step']}"),
    "jobname": lambda r: r["name"],
    "partition": lambda r: r["partition"],
    "account": lambda r: r.get("account") or "default",
    "user": lambda r: r["user"],
    "alloccpus": lambda r: r["cpus"],
    "allocgpus": lambda r: f"{_charged(r):g}",
    "state": _state,
    "exitcode": lambda r: f"{r['exit_code'] if r['exit_code'] is not None else 0}:{r['exit_signal'] or 0}",
    "elapsed": lambda r: format_duration(_elapsed(r)),
    "submit": lambda r: iso_time(r["submit_time"]),
    "start": lambda r: iso_time(r.get("start_time")),
    "end": lambda r: iso_time(r.get("end_time")),
    "restarts": lambda r: r["attempt"],
    "nodelist": lambda r: compress([n for n in (r.get("nodelist") or "").split(",") if n]) or "None assigned",
    "gpuhours": lambda r: f"{_charged(r) * _elapsed(r) / 3600:.2f}",
    "reason": lambda r: r.get("reason") or "",
    # GPU telemetry rollups of the run (empty when no sample came)
    "gpuutil": lambda r: _opt(r.get("gpu_util_mean"), "{:.1f}%"),
    "maxgpuutil": lambda r: _opt(r.get("gpu_util_max"), "{:.0f}%"),
    "maxgpumem": lambda r: mib(r["gpu_mem_max_mb"]) if r.get("gpu_mem_max_mb") is not None else "",
    "energy": lambda r: energy(r.get("energy_j")),
    "consumedenergy": lambda r: energy(r.get("energy_j")),
    "avecpu": lambda r: _opt(_avecpu(r), "{:.1f}%"),
    "totalcpu": lambda r: "" if r.get("cpu_seconds") is None else format_duration(int(r["cpu_seconds"])),
    "maxrss": lambda r: "" if r.get("max_rss_kb") is None else mib(-(-r["max_rss_kb"] // 1024)),
    "averss": lambda r: "" if r.get("ave_rss_kb") is None else mib(-(-r["ave_rss_kb"] // 1024)),
}
# A batch script ended by the time limit or preemption was signalled: sacct shows its step CANCELLED.
BATCH_STATE = {"TIMEOUT": "CANCELLED", "PREEMPTED": "CANCELLED", "DEADLINE": "CANCELLED"}


def step_rows(run: dict, steps: list[dict], job: dict) -> list[dict]:
    """A started run's steps as rows: its batch step, on the first node (an allocation of salloc or
    srun has none, as in Slurm), then each srun's."""
    first = (run.get("nodelist") or "").split(",")[0]
    common = {"job_id": run["job_id"], "array_job_id": run.get("array_job_id"),
              "array_task_id": run.get("array_task_id"), "partition": "", "account": run.get("account"),
              "user": run["user"], "submit_time": run["submit_time"], "now": run["now"], "attempt": run["attempt"],
              "gpus": 0, "reason": ""}
    state = run["state"] if run["end_time"] else "RUNNING"
    rows = [] if job.get("interactive") else [{**common, "step": "batch", "name": "batch", "state": BATCH_STATE.get(state, state),
             "exit_code": run["exit_code"], "exit_signal": run["exit_signal"], "start_time": run["start_time"],
             "end_time": run["end_time"], "nodelist": first, "cpus": cpus(job) // max(1, job["nodes"]), "ntasks": 1}]
    for s in steps:
        rows.append({**common, "step": s["step_id"], "name": s["name"], "state": s["state"],
                     "exit_code": s["exit_code"], "exit_signal": s["exit_signal"], "start_time": s["start_time"],
                     "end_time": s["end_time"], "nodelist": s["nodelist"], "cpus": s["cpus"], "ntasks": s.get("ntasks")})
    return rows


def derived_exit(steps) -> tuple[int, int]:
    """Slurm's DerivedExitCode of a run: its srun steps' highest end, compared as wait statuses
    (an exit code above any signal), (0, 0) with none; the batch script's own end is not one."""
    raw = max((((s["exit_code"] or 0) & 0xff) << 8 | (s["exit_signal"] or 0) & 0x7f for s in steps), default=0)
    return raw >> 8, raw & 0x7f


def rows_for(reply: dict, with_steps: bool = True) -> list[dict]:
    """Flat rows: one per run (and its steps), plus one for each job waiting for its (next) run or
    ended unrun."""
    now = reply["now"]
    jobs = {j["id"]: j for j in reply["jobs"]}
    steps_of: dict[int, list] = {}
    for s in reply.get("steps", ()):
        steps_of.setdefault(s["run_id"], []).append(s)
    by_job: dict[int, list] = {}
    for r in reply["runs"]:
        job = jobs.get(r["job_id"])
        if job is None:
            continue
        state = r["state"] if r["end_time"] else job["state"]  # a live run shows the job's state
        by_job.setdefault(r["job_id"], []).append({
            **r, "state": state, "now": now, "submit_time": job["submit_time"], "user": job["user"],
            "cpus": cpus(job), "derived_exit": derived_exit(steps_of.get(r["id"], ()))})
    rows = []
    for job in reply["jobs"]:
        runs = by_job.get(job["id"], [])
        for run in runs:
            rows.append(run)
            if with_steps:
                rows.extend(step_rows(run, steps_of.get(run["id"], []), job))
        if job["state"] == "PENDING" or (not runs and job["state"] not in ("RUNNING", "COMPLETING", "PREEMPTING")):
            rows.append({"job_id": job["id"], "array_job_id": job.get("array_job_id"),
                         "array_task_id": job.get("array_task_id"), "name": job["name"], "partition": job["partition"], "user": job["user"],
                         "state": job["state"], "exit_code": job["exit_code"], "exit_signal": job["exit_signal"],
                         "start_time": None, "end_time": job["end_time"], "submit_time": job["submit_time"],
                         "now": now, "attempt": job["restart_count"], "nodelist": "", "gpus": 0,
                         "cpus": cpus(job), "reason": job["reason"]})
    return rows


def in_window(row: dict, start: float | None, end: float | None) -> bool:
    """sacct -S/-E: the row's lifetime (submit to end, or now) overlaps the window."""
    first = row.get("start_time") or row["submit_time"]
    last = row.get("end_time") or row["now"]
    return (start is None or last >= start) and (end is None or first <= end)
