"""[[qos]] tables of controller.toml: named QOS (Slurm's sacctmgr QOS) that sbatch --qos picks.

A QOS gives its jobs a priority class and limits: MaxWall (max_time: longer -t is refused, a job
without -t gets it), MaxTRESPerUser=gres/gpu (max_gpus_per_user) and MaxJobsPerUser
(max_jobs_per_user) over the user's running jobs of that QOS (they wait with Slurm's reasons),
and who may use it (allowed_users / allowed_accounts / allowed_groups; none: everyone).
A QOS named "normal" of class normal exists unless the file defines its own.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..core.model import PRIORITY_CLASSES
from .common import ConfigError, Section
from .idle import NONE, IdleRule, parse_rule

QOS_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


@dataclass(frozen=True)
class QosConfig:
    name: str
    priority: str = "normal"  # the class its jobs get (PRIORITY_CLASSES)
    description: str = ""
    max_time: int | None = None  # seconds (MaxWall)
    max_gpus_per_user: int = 0  # running GPUs of one user's jobs in this QOS; 0: no limit
    max_jobs_per_user: int = 0  # running jobs of one user in this QOS; 0: no limit
    allowed_users: tuple[str, ...] | None = None
    allowed_accounts: tuple[str, ...] | None = None
    allowed_groups: tuple[str, ...] | None = None
    idle: IdleRule = NONE  # idle_reclaim, idle_threshold, ... (config/idle.py): over the partition's

    def allows(self, user: str, account: str, groups: set[str]) -> bool:
        lists = (self.allowed_users, self.allowed_accounts, self.allowed_groups)
        if all(x is None for x in lists):
            return True
        return (user in (self.allowed_users or ()) or account in (self.allowed_accounts or ())
                or bool(groups & set(self.allowed_groups or ())))


NORMAL = QosConfig("normal", description="the default")


def parse_qos_tables(path: str, raw: list) -> tuple[QosConfig, ...]:
    out: list[QosConfig] = []
    for i, item in enumerate(raw):
        sec = Section(path, f"qos[{i}]", item)
        name = sec.get("name", str, "")
        if not QOS_NAME.fullmatch(name):
            raise ConfigError(f"{path}: qos[{i}].name is required (letters, digits, _ . -; at most 64), got {name!r}")
        where = f"{path}: qos[{i}] ({name})"
        priority = sec.get("priority", str, "normal")
        if priority not in PRIORITY_CLASSES:
            raise ConfigError(f"{where}: priority must be one of {', '.join(PRIORITY_CLASSES)}, got {priority!r}")
        qos = QosConfig(name=name, priority=priority, description=sec.get("description", str, ""),
                        max_time=sec.time_limit("max_time"), max_gpus_per_user=sec.get("max_gpus_per_user", int, 0),
                        max_jobs_per_user=sec.get("max_jobs_per_user", int, 0),
                        allowed_users=sec.strings("allowed_users", None),
                        allowed_accounts=sec.strings("allowed_accounts", None),
                        allowed_groups=sec.strings("allowed_groups", None), idle=parse_rule(sec, "idle_"))
        sec.done()
        for key in ("max_gpus_per_user", "max_jobs_per_user"):
            if getattr(qos, key) < 0:
                raise ConfigError(f"{where}: {key} must be >= 0 (0: no limit)")
        if name in (q.name for q in out):
            raise ConfigError(f"{where}: the name is given twice")
        out.append(qos)
    if "normal" not in (q.name for q in out):
        out.insert(0, NORMAL)
    return tuple(out)
