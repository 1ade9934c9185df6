"""Which environment variables may cross from a submitter into the cluster, and into what.

A job gets its user's environment (per --export, as Slurm does), so LD_LIBRARY_PATH or PYTHONPATH
reach the job itself. They must never reach a process that runs as root on the job's behalf (a
runtime such as runc, the shepherd): there they would load the user's code as root. Variables the
daemons use to talk to systemd or to each other are never taken from a submitter, and the daemons'
own environment (database passwords, tokens) is never given to a job: a job's environment is built
only from what the submitter sent plus the job variables (core/jobenv.py).
"""
from __future__ import annotations

from typing import Mapping

# Make a dynamic loader, an interpreter or a shell run code of the caller's choosing.
LOADER_VARS = frozenset({
    "LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "LD_DEBUG", "LD_DEBUG_OUTPUT", "LD_PROFILE",
    "LD_ORIGIN_PATH", "LD_BIND_NOW", "GCONV_PATH", "LOCPATH", "NLSPATH", "GLIBC_TUNABLES", "HOSTALIASES",
    "RESOLV_HOST_CONF", "TMPDIR", "MALLOC_CHECK_", "MALLOC_TRACE",
    "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "PYTHONINSPECT", "PYTHONSAFEPATH",
    "PERL5LIB", "PERL5OPT", "PERLLIB", "RUBYLIB", "RUBYOPT", "NODE_OPTIONS", "NODE_PATH",
    "BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "PS4", "IFS", "CDPATH", "GIT_EXEC_PATH",
})
LOADER_PREFIXES = ("LD_", "BASH_FUNC_", "DYLD_")
# The daemons' own plumbing: a submitter's value would point a job at systemd or at the agent.
INTERNAL_VARS = frozenset({
    "NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES",
    "HAI_REPORT_FD", "HAI_CONTROL_DIR",
})


def is_loader_var(name: str) -> bool:
    return name in LOADER_VARS or name.startswith(LOADER_PREFIXES)


def submitted_env(env: Mapping[str, str]) -> dict[str, str]:
    """What the controller keeps of a submitter's environment (the job's base environment)."""
    return {k: v for k, v in env.items() if k not in INTERNAL_VARS}


def helper_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment for a process that runs as root for a job: no loader or interpreter hooks."""
    return {k: v for k, v in env.items() if not is_loader_var(k) and k not in INTERNAL_VARS}
