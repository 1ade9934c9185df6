"""Job fields as the CLI shows them, shared by hqueue and hcontrol (squeue's % letters)."""
from __future__ import annotations

from typing import Callable

from ..core.hostlist import compress
from ..core.jobids import job_label
from ..core.timefmt import format_duration, format_limit
from .telemetry_fmt import pct, used_of_share


# Our states Slurm does not have, as Slurm would show that moment (squeue, sacct): a run being
# preempted still runs (its grace period), as a Slurm job does until its GraceTime ends
SLURM_STATE = {"PREEMPTING": "RUNNING"}


def elapsed(job: dict, now: float) -> int:
    start = job.get("start_time")
    if not start:
        return 0
    end = job.get("end_time") or now
    return max(0, int(end - start))


def tasks(job: dict) -> int:
    """The job's tasks in all: every node holds tasks_per_node of them."""
    return job.get("tasks_per_node", 1) * job["nodes"]


def cpus(job: dict) -> int:
    """CPUs the job holds (or asks for) over all its nodes (-O: one task's on each)."""
    return job["cpus_per_task"] * (job["nodes"] if job.get("overcommit") else tasks(job))


def nodelist(job: dict) -> str:
    names = [n for n in (job.get("nodelist") or "").split(",") if n]
    return compress(names) if names else ""


def nodelist_reason(job: dict) -> str:
    if job["state"] == "PENDING":
        return f"({job.get('reason') or 'None'})"
    return nodelist(job) or f"({job.get('reason') or 'None'})"


def gres(job: dict) -> str:
    from ..core.sharing import share_of  # here: it imports the model (~10 ms of every squeue's start)
    share = share_of(job.get("gpu_fraction"), job.get("gpu_mem_mb"), job.get("gpu_compute"), job.get("gpu_qos"))
    if share is not None:  # a card share: gpu:0.25, and gpu:0.25(20G) once a card gave 20 GiB
        return share.label(job.get("gpu_share_mb"))
    return f"gpu:{job['gpus_per_node']}" if job.get("gpus_per_node") else "(null)"


def preemption(job: dict) -> str:
    """Whether and how time-slicing may preempt the job: how it resumes (checkpoint, requeue,
    signal, announced), `no` (it did not say it can resume: only an urgent job or an admin may,
    and its work is lost) or `never` (--no-requeue)."""
    if not job.get("preemptible", True):
        return "never"
    return job.get("resumes") or "no"


def job_class(job: dict) -> str:
    """`interactive` for an allocation of salloc or srun (never preempted, ahead of batch jobs of
    its level, the [interactive] limits), else `batch`."""
    return "interactive" if job.get("interactive") else "batch"


def idle_clock(job: dict) -> str:
    """hqueue %W: how long the running job's GPUs have been idle, of its window ("12:30/30:00");
    "-" where idle reclamation is off for it (or it is not running)."""
    if job.get("idle_limit") is None:
        return "-"
    return f"{format_duration(job.get('idle_for') or 0)}/{format_duration(job['idle_limit'])}"


# letter -> (header, getter); the letters are squeue's where squeue has one.
FIELDS: dict[str, tuple[str, Callable[[dict, float], str]]] = {
    "i": ("JOBID", lambda j, now: j.get("label") or job_label(j)),
    "P": ("PARTITION", lambda j, now: j["partition"]),
    "j": ("NAME", lambda j, now: j["name"]),
    "u": ("USER", lambda j, now: j["user"]),
    "a": ("ACCOUNT", lambda j, now: j.get("account") or "default"),
    "t": ("ST", lambda j, now: j["code"]),
    "T": ("STATE", lambda j, now: j["state"]),
    "M": ("TIME", lambda j, now: format_duration(elapsed(j, now))),
    "l": ("TIME_LIMIT", lambda j, now: format_limit(j.get("time_limit"))),
    "D": ("NODES", lambda j, now: str(j["nodes"])),
    "R": ("NODELIST(REASON)", lambda j, now: nodelist_reason(j)),
    "N": ("NODELIST", lambda j, now: nodelist(j)),
    "r": ("REASON", lambda j, now: j.get("reason") or "None"),
    "b": ("TRES_PER_NODE", lambda j, now: gres(j)),
    "C": ("CPUS", lambda j, now: str(cpus(j))),
    "Q": ("PRIORITY", lambda j, now: j.get("priority", "normal")),
    "p": ("PRIORITY", lambda j, now: j.get("priority", "normal")),
    "q": ("RESTARTS", lambda j, now: str(j.get("restart_count", 0))),
    "L": ("LEVEL", lambda j, now: str(j.get("level", 0))),
    # ours (squeue's group letters; we have no groups): the run's latest GPU telemetry
    "g": ("GPU_UTIL", lambda j, now: pct(j.get("gpu_util"))),
    "G": ("GPU_MEM", lambda j, now: used_of_share(j.get("gpu_mem_used_mb"), j.get("gpu_share_mb"))),
    "I": ("IDLE", lambda j, now: "idle" if j.get("idle") else "-"),
    # ours (squeue's %W is licenses, which we have not): the idle clock against its window
    "W": ("IDLE_FOR", lambda j, now: idle_clock(j)),
    "Y": ("PREEMPT", lambda j, now: preemption(j)),  # ours (squeue's %Y is SCHEDNODES, which we have not)
    "k": ("CLASS", lambda j, now: job_class(j)),  # ours (squeue's %k is the comment)
}
RIGHT = {"i", "M", "l", "D", "C", "q", "L", "g", "G", "W"}
# letter -> the job keys its getter reads: hqueue asks the controller for only these (and ROW_KEYS).
NEEDS: dict[str, tuple[str, ...]] = {
    "i": ("id", "array_job_id", "array_task_id"), "P": ("partition",), "j": ("name",), "u": ("user",),
    "a": ("account",), "t": ("code",), "T": ("state",), "M": ("start_time", "end_time"), "l": ("time_limit",),
    "D": ("nodes",), "R": ("state", "nodelist", "reason"), "N": ("nodelist",), "r": ("reason",),
    "b": ("gpus_per_node", "gpu_fraction", "gpu_mem_mb", "gpu_compute", "gpu_qos", "gpu_share_mb"),
    "C": ("cpus_per_task", "tasks_per_node", "nodes", "overcommit"), "Q": ("priority",), "p": ("priority",), "q": ("restart_count",),
    "L": ("level",), "g": ("gpu_util",), "G": ("gpu_mem_used_mb", "gpu_share_mb"), "I": ("idle",), "W": ("idle_for", "idle_limit"),
    "Y": ("preemptible", "resumes"), "k": ("interactive",),
}
# What every listed row needs besides its columns: pending array tasks collapse to one row.
ROW_KEYS = ("id", "state", "reason", "array_job_id", "array_task_id")
# Slurm's columns plus LEVEL: the job's MLFQ level (0 = newest work, served first).
DEFAULT_FORMAT = "%i %P %j %u %t %M %D %L %R"
LONG_FORMAT = "%i %P %j %u %a %T %M %l %D %L %k %Y %q %R"
