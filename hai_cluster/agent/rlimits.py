"""The resource limits a job starts with ([isolation.rlimits]), as slurmd's unit and Slurm's
PropagateResourceLimits give them: not whatever the agent inherited from systemd (1024 open files,
8 MiB of locked memory, which NCCL over InfiniBand cannot work with).

At agent start, `effective` raises the agent's own hard limits to the configured ones where it
may (CAP_SYS_RESOURCE; then its shepherds and jobs may too), and clamps a limit it may not raise
to the hard limit it has, with a warning that says what to change (LimitNOFILE= in the unit).
The job's process (jobproc.exec_job, hai-jobexec) then sets exactly these, as root, before it
becomes the user: a job may lower them, never raise them past the hard limit.
"""
from __future__ import annotations

import errno
import logging
import os
import resource
from typing import Iterable

log = logging.getLogger(__name__)

INFINITY = -1  # resource.RLIM_INFINITY on Linux; "unlimited" in the config
NAMES = {"as": resource.RLIMIT_AS, "core": resource.RLIMIT_CORE, "cpu": resource.RLIMIT_CPU,
         "data": resource.RLIMIT_DATA, "fsize": resource.RLIMIT_FSIZE, "memlock": resource.RLIMIT_MEMLOCK,
         "nofile": resource.RLIMIT_NOFILE, "nproc": resource.RLIMIT_NPROC, "stack": resource.RLIMIT_STACK}

Limit = tuple[str, int, int]  # (name, soft, hard), as config.IsolationConfig.rlimits has them


def _above(value: int, limit: int) -> bool:
    """value > limit, with INFINITY above everything."""
    if limit == INFINITY:
        return False
    return value == INFINITY or value > limit


def effective(configured: Iterable[Limit]) -> tuple[Limit, ...]:
    """The limits jobs will get: the configured ones, each within the hard limit this process has
    or could raise itself to (it raises it: the shepherds it starts inherit it)."""
    out = []
    for name, soft, hard in configured:
        res = NAMES[name]
        cur_soft, cur_hard = resource.getrlimit(res)
        if _above(hard, cur_hard):
            try:
                resource.setrlimit(res, (cur_soft, hard))
                cur_hard = hard
            except (OSError, ValueError) as exc:
                log.warning("isolation.rlimits %s: cannot raise this agent's hard limit from %s to %s (%s); "
                            "jobs get %s: raise it where the agent starts (hai-agent.service: Limit%s=)",
                            name, show(cur_hard), show(hard), exc, show(cur_hard), name.upper())
                hard = cur_hard
        if _above(soft, hard):
            soft = hard
        out.append((name, soft, hard))
    return tuple(out)


def apply(limits: Iterable[Limit]) -> None:
    """Set them on this process (the job's, as root, before it becomes the user). A refusal is
    an OSError with the C library's words, as hai-jobexec reports it (Python says ValueError)."""
    for name, soft, hard in limits:
        try:
            resource.setrlimit(NAMES[name], (soft, hard))
        except ValueError as exc:
            code = errno.EPERM if "not allowed" in str(exc) else errno.EINVAL
            raise OSError(code, os.strerror(code)) from None


def show(value: int) -> str:
    return "unlimited" if value == INFINITY else str(value)
