"""Job fields as the CLI shows them, shared by hqueue and hcontrol (squeue's % letters)."""
from __future__ import annotations

from typing import Callable

from ..core.hostlist import compress
from ..core.timefmt import format_duration, format_limit


def elapsed(job: dict, now: float) -> int:
    start = job.get("start_time")
    if not start:
        return 0
    end = job.get("end_time") or now
    return max(0, int(end - start))


def nodelist(job: dict) -> str:
    names = [n for n in (job.get("nodelist") or "").split(",") if n]
    return compress(names) if names else ""


def nodelist_reason(job: dict) -> str:
    if job["state"] == "PENDING":
        return f"({job.get('reason') or 'None'})"
    return nodelist(job) or f"({job.get('reason') or 'None'})"


def gres(job: dict) -> str:
    return f"gpu:{job['gpus_per_node']}" if job.get("gpus_per_node") else "(null)"


# letter -> (header, getter); the letters are squeue's where squeue has one.
FIELDS: dict[str, tuple[str, Callable[[dict, float], str]]] = {
    "i": ("JOBID", lambda j, now: str(j["id"])),
    "P": ("PARTITION", lambda j, now: j["partition"]),
    "j": ("NAME", lambda j, now: j["name"]),
    "u": ("USER", lambda j, now: j["user"]),
    "t": ("ST", lambda j, now: j["code"]),
    "T": ("STATE", lambda j, now: j["state"]),
    "M": ("TIME", lambda j, now: format_duration(elapsed(j, now))),
    "l": ("TIME_LIMIT", lambda j, now: format_limit(j.get("time_limit"))),
    "D": ("NODES", lambda j, now: str(j["nodes"])),
    "R": ("NODELIST(REASON)", lambda j, now: nodelist_reason(j)),
    "N": ("NODELIST", lambda j, now: nodelist(j)),
    "r": ("REASON", lambda j, now: j.get("reason") or "None"),
    "b": ("TRES_PER_NODE", lambda j, now: gres(j)),
    "C": ("CPUS", lambda j, now: str(j["cpus_per_task"] * j["nodes"])),
    "Q": ("PRIORITY", lambda j, now: j.get("priority", "normal")),
    "p": ("PRIORITY", lambda j, now: j.get("priority", "normal")),
    "q": ("RESTARTS", lambda j, now: str(j.get("restart_count", 0))),
    "L": ("LEVEL", lambda j, now: str(j.get("level", 0))),
}
RIGHT = {"i", "M", "l", "D", "C", "q", "L"}
# letter -> the job keys its getter reads: hqueue asks the controller for only these.
NEEDS: dict[str, tuple[str, ...]] = {
    "i": ("id",), "P": ("partition",), "j": ("name",), "u": ("user",), "t": ("code",), "T": ("state",),
    "M": ("start_time", "end_time"), "l": ("time_limit",), "D": ("nodes",), "R": ("state", "nodelist", "reason"),
    "N": ("nodelist",), "r": ("reason",), "b": ("gpus_per_node",), "C": ("cpus_per_task", "nodes"),
    "Q": ("priority",), "p": ("priority",), "q": ("restart_count",), "L": ("level",),
}
# Slurm's columns plus LEVEL: the job's MLFQ level (0 = newest work, served first).
DEFAULT_FORMAT = "%i %P %j %u %t %M %D %L %R"
LONG_FORMAT = "%i %P %j %u %T %M %l %D %L %q %R"
