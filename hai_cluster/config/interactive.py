"""[interactive] of controller.toml: the limits of interactive jobs (salloc, srun outside a job).

Counted over a user's (an account's) interactive jobs not ended, pending and running alike, and
checked when one is submitted: a session beyond them is refused at once, with the limit's name,
never left waiting. max_time is the longest -t one may ask and the limit of one that asks none.
0 (and no max_time): no limit.
"""
from __future__ import annotations

from dataclasses import dataclass

from .common import ConfigError, Section


@dataclass(frozen=True)
class InteractiveConfig:
    max_gpus_per_user: int = 0
    max_jobs_per_user: int = 0
    max_gpus_per_account: int = 0
    max_jobs_per_account: int = 0
    max_time: int | None = None  # seconds

    COUNTS = ("max_gpus_per_user", "max_jobs_per_user", "max_gpus_per_account", "max_jobs_per_account")


def parse_interactive(path: str, raw: dict) -> InteractiveConfig:
    sec = Section(path, "interactive", raw)
    cfg = InteractiveConfig(**{k: sec.get(k, int, 0) for k in InteractiveConfig.COUNTS},
                            max_time=sec.time_limit("max_time"))
    sec.done()
    for key in InteractiveConfig.COUNTS:
        if getattr(cfg, key) < 0:
            raise ConfigError(f"{path}: interactive.{key} must be >= 0 (0: no limit)")
    return cfg
