"""Which partitions take a submission: names, allowed users and groups, and the time limit.

`-p a,b` names candidates: those the user may not use, or whose max_time the job's limit
exceeds, are dropped; the job is refused only when none is left (unknown names always are).
A job without -t gets the smallest max_time among its partitions, as Slurm gives it MaxTime.
"""
from __future__ import annotations

from dataclasses import replace

from ..config import ControllerConfig
from ..core.model import JobSpec
from ..core.timefmt import format_limit
from .access import group_names


class PartitionRefused(ValueError):
    """The text says which partition refused the job and why (sbatch-like)."""


def groups_of(user: str, gid: int) -> set[str]:
    """The user's groups as partitions' allowed_groups name them (by name, or by number when unnamed)."""
    return group_names(user, gid, unnamed_as_ids=True)


def admit(spec: JobSpec, cfg: ControllerConfig, *, user: str, groups: set[str], admin: bool) -> tuple[str, JobSpec]:
    """(the partitions column: 'a' or 'a,b', the spec as it will run), or PartitionRefused."""
    names = spec.partition.split(",") if spec.partition else [cfg.default_partition]
    if len(set(names)) != len(names):
        raise PartitionRefused(f"a partition is given twice in {spec.partition}")
    unknown = [n for n in names if n not in cfg.partitions]
    if unknown:
        raise PartitionRefused(f"invalid partition specified: {unknown[0]}")
    accepted, refusals = [], []
    for name in names:
        p = cfg.partition(name)
        if not admin and not p.allows(user, groups):
            refusals.append(f"Access/permission denied: user {user} may not use partition {name}")
        elif p.max_time is not None and spec.time_limit is not None and spec.time_limit > p.max_time:
            refusals.append(f"Requested time limit is invalid (missing or exceeds some limit): "
                            f"{format_limit(spec.time_limit)} is more than MaxTime={format_limit(p.max_time)} "
                            f"of partition {name}")
        else:
            accepted.append(p)
    if not accepted:
        raise PartitionRefused("; ".join(refusals))
    column = ",".join(p.name for p in accepted)
    limits = [p.max_time for p in accepted if p.max_time is not None]
    time_limit = spec.time_limit if spec.time_limit is not None or not limits else min(limits)
    return column, replace(spec, partition=column if spec.partition else None, time_limit=time_limit)


def admit_qos(spec: JobSpec, cfg: ControllerConfig, *, user: str, account: str, groups: set[str],
              admin: bool) -> tuple[JobSpec, bool]:
    """The spec with its QOS (--qos, else the default) and its priority class when the user named
    the QOS (--priority then has no say; the default QOS leaves --priority be). The bool: the
    class came from a QOS the user named (max_user_priority does not apply to it). A job without
    -t gets the QOS's max_time after its partition's (qos_time_limit).
    PartitionRefused, in Slurm's words, for a QOS unknown, not open to the user, or too short."""
    name = spec.qos or cfg.default_qos
    qos = cfg.qos_named(name)
    if qos is None:
        raise PartitionRefused(f"Invalid qos specification: no QOS named {name} (hcontrol show qos lists them)")
    if not admin and not qos.allows(user, account, groups):
        raise PartitionRefused(f"Invalid qos specification: QOS {name} is not open to user {user} or account {account}")
    if qos.max_time is not None and spec.time_limit is not None and spec.time_limit > qos.max_time:
        raise PartitionRefused(f"Job violates accounting/QOS policy (job submit limit, user's size and/or time "
                               f"limits): {format_limit(spec.time_limit)} is more than MaxWall="
                               f"{format_limit(qos.max_time)} of QOS {name}")
    granted = spec.qos is not None
    priority = qos.priority if granted else spec.priority
    return replace(spec, qos=name, priority=priority), granted


def qos_time_limit(spec: JobSpec, cfg: ControllerConfig, given: int | None) -> JobSpec:
    """A job without -t (`given` None): the shorter of its partition's max_time (admit's) and its
    QOS's MaxWall, as Slurm applies both."""
    qos = cfg.qos_named(spec.qos or cfg.default_qos)
    if given is not None or qos is None or qos.max_time is None:
        return spec
    limits = [t for t in (spec.time_limit, qos.max_time) if t is not None]
    return replace(spec, time_limit=min(limits))
