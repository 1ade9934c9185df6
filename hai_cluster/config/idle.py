"""Idle reclamation settings of controller.toml: when a running job whose GPUs sit idle is warned,
and what happens to it after a grace period (controller/reclaim.py; the clock: scheduling/idle.py).

    [idle]                      the defaults (batch jobs: off)
    reclaim = false             reclaim idle batch jobs at all
    threshold = 5               percent GPU utilization: a job is idle while every GPU stays under it
    window = "30:00"            idle this long (sbatch -t forms, or seconds): warned
    grace = "10:00"             idle this much longer after the warning: the action
    action = "cancel"           cancel | requeue (requeue: batch jobs that may be requeued; others are cancelled)

    [interactive]  idle_reclaim = true (the default), idle_threshold, idle_window, idle_grace, idle_action
    [[partitions]] idle_reclaim, idle_threshold, ...  (the same five keys)
    [[qos]]        idle_reclaim, idle_threshold, ...

A job's settings: [idle], then [interactive] for salloc's and srun's jobs, then its partition's,
then its QOS's: each key given later overrides the one before (a key not given is inherited).
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from .common import ConfigError, Section

ACTIONS = ("cancel", "requeue")
KEYS = ("reclaim", "threshold", "window", "grace", "action")


@dataclass(frozen=True)
class IdleRule:
    """One table's idle settings; None: not given there (inherited)."""
    reclaim: bool | None = None
    threshold: float | None = None  # percent
    window: float | None = None  # seconds
    grace: float | None = None  # seconds
    action: str | None = None

    def over(self, base: "IdleRule") -> "IdleRule":
        """This rule's keys where given, `base`'s elsewhere."""
        return IdleRule(**{f.name: getattr(base, f.name) if getattr(self, f.name) is None else getattr(self, f.name)
                           for f in fields(self)})


# [idle] when not given: off for batch jobs; [interactive] turns it on for its jobs
DEFAULTS = IdleRule(reclaim=False, threshold=5.0, window=1800.0, grace=600.0, action="cancel")
INTERACTIVE_DEFAULT = IdleRule(reclaim=True)
NONE = IdleRule()


def _seconds(sec: Section, key: str) -> float | None:
    """A duration: seconds (a number) or sbatch's -t forms ("30:00" is 30 minutes, "1-00:00:00")."""
    if key not in sec.data:
        return None
    value = sec.data[key]
    if isinstance(value, str):
        text = sec.time_limit(key)
        if text is None:
            raise ConfigError(f"{sec.path}: {sec.where}.{key} must be a duration, not UNLIMITED "
                              f"(turn reclamation off with reclaim = false)")
        return float(text)
    return sec.get(key, float, None)


def parse_rule(sec: Section, prefix: str = "") -> IdleRule:
    """The idle keys of a table (`prefix` + KEYS), popped from `sec`; the values checked."""
    where = f"{sec.path}: {sec.where}."
    rule = IdleRule(reclaim=sec.get(prefix + "reclaim", bool, None),
                    threshold=sec.get(prefix + "threshold", float, None),
                    window=_seconds(sec, prefix + "window"), grace=_seconds(sec, prefix + "grace"),
                    action=sec.get(prefix + "action", str, None))
    if rule.threshold is not None and not 0 < rule.threshold <= 100:
        raise ConfigError(f"{where}{prefix}threshold must be a percentage of GPU utilization (above 0, "
                          f"at most 100), got {rule.threshold:g}")
    if rule.window is not None and rule.window <= 0:
        raise ConfigError(f"{where}{prefix}window must be positive, got {rule.window:g} s")
    if rule.grace is not None and rule.grace < 0:
        raise ConfigError(f"{where}{prefix}grace must be 0 or more, got {rule.grace:g} s")
    if rule.action is not None and rule.action not in ACTIONS:
        raise ConfigError(f"{where}{prefix}action must be one of {', '.join(ACTIONS)}, got {rule.action!r}")
    return rule


def parse_idle(path: str, raw: dict) -> IdleRule:
    """The [idle] table: every key has a value (DEFAULTS where not given)."""
    sec = Section(path, "idle", raw)
    rule = parse_rule(sec)
    sec.done()
    return rule.over(DEFAULTS)


@dataclass(frozen=True)
class IdleSettings:
    """The resolved settings of one job (reclaim is on)."""
    threshold: float
    window: float
    grace: float
    action: str


def resolve(defaults: IdleRule, interactive: IdleRule | None, partition: IdleRule, qos: IdleRule) -> IdleSettings | None:
    """A job's settings, QOS over partition over [interactive] (for its jobs only) over [idle];
    None where reclamation is off for it."""
    rule = defaults
    for layer in (interactive, partition, qos):
        if layer is not None:
            rule = layer.over(rule)
    if not rule.reclaim:
        return None
    return IdleSettings(threshold=float(rule.threshold), window=float(rule.window), grace=float(rule.grace),
                        action=str(rule.action))
