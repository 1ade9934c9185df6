"""[interactive] of controller.toml: the limits of interactive jobs (salloc, srun outside a job).

Counted over a user's (an account's) interactive jobs not ended, pending and running alike, and
checked when one is submitted: a session beyond them is refused at once, with the limit's name,
never left waiting. max_time is the longest -t one may ask and the limit of one that asks none.
0 (and max_time = "UNLIMITED"): no limit. The defaults keep what jumps the batch queue and is never
time-sliced small: 4 sessions a user, a day each at most.
"""
from __future__ import annotations

from dataclasses import dataclass

from .common import ConfigError, Section
from .idle import INTERACTIVE_DEFAULT, IdleRule, parse_rule


@dataclass(frozen=True)
class InteractiveConfig:
    max_gpus_per_user: int = 0
    max_jobs_per_user: int = 4
    max_gpus_per_account: int = 0
    max_jobs_per_account: int = 0
    max_time: int | None = 86400  # seconds
    # An allocation no salloc or srun has held this long is ended (its client died while the
    # controller was down, or a lost reply left it without one); salloc --no-shell's stay.
    abandoned_after: float = 120.0
    # idle_reclaim, idle_threshold, ... (config/idle.py): on for interactive jobs unless turned off
    idle: IdleRule = INTERACTIVE_DEFAULT

    COUNTS = ("max_gpus_per_user", "max_jobs_per_user", "max_gpus_per_account", "max_jobs_per_account")


def parse_interactive(path: str, raw: dict) -> InteractiveConfig:
    sec = Section(path, "interactive", raw)
    d = InteractiveConfig()
    cfg = InteractiveConfig(**{k: sec.get(k, int, getattr(d, k)) for k in InteractiveConfig.COUNTS},
                            max_time=sec.time_limit("max_time") if "max_time" in raw else d.max_time,
                            abandoned_after=sec.get("abandoned_after", float, d.abandoned_after),
                            idle=parse_rule(sec, "idle_").over(INTERACTIVE_DEFAULT))
    sec.done()
    if cfg.idle.action == "requeue":
        raise ConfigError(f"{path}: interactive.idle_action cannot be requeue: an interactive session is never "
                          f"requeued (cancel)")
    if cfg.abandoned_after < 10:  # a client that lost its link reconnects and holds it again within seconds
        raise ConfigError(f"{path}: interactive.abandoned_after must be at least 10 seconds")
    for key in InteractiveConfig.COUNTS:
        if getattr(cfg, key) < 0:
            raise ConfigError(f"{path}: interactive.{key} must be >= 0 (0: no limit)")
    return cfg
