"""Node health: the site's health-check program (like Slurm's HealthCheckProgram) and built-in checks.

Every `health_check_interval` seconds the agent runs, in order, stopping at the first failure:
- the GPUs: their count must still be what it was when the agent started (a GPU that fell off the
  bus, an XID that took a card away, shows as fewer devices);
- the spool's filesystem: used space must stay below `spool_full_percent` (a full spool loses run
  ends and job output);
- `health_check_program`, as root, with `health_check_timeout`: a non-zero exit or a timeout is
  unhealthy, and the first line it printed is the reason.

Each result is pushed to the controller (`health` event) and is in `hello`; the controller drains
an unhealthy node with reason `health: ...` and returns it to service when the checks pass again.
"""
from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
from dataclasses import dataclass
from typing import Awaitable, Callable

from ..config import AgentConfig
from .gpus import inventory

log = logging.getLogger(__name__)

OUTPUT_LIMIT = 64 * 1024


@dataclass(frozen=True)
class Health:
    ok: bool
    reason: str = ""

    def to_wire(self) -> dict:
        return {"ok": self.ok, "reason": self.reason}


def gpu_count_problem(at_start: int, now: int) -> str | None:
    if now != at_start:
        return f"GPU count changed: {at_start} at agent start, {now} now"
    return None


def spool_problem(path: str, used: int, total: int, full_percent: float) -> str | None:
    if total <= 0:
        return None
    percent = 100.0 * used / total
    if percent >= full_percent:
        return (f"spool filesystem of {path} is {percent:.0f}% full (limit {full_percent:g}%, "
                f"{(total - used) // (1024 * 1024)} MiB free)")
    return None


async def run_program(program: str, timeout: float) -> str | None:
    """None when the program passes; otherwise why not."""
    try:
        proc = await asyncio.create_subprocess_exec(
            program, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, start_new_session=True, cwd="/")
    except OSError as exc:
        return f"cannot run health check program {program}: {exc.strerror or exc}"
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout)
    except asyncio.TimeoutError:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the program and whatever it started
        except ProcessLookupError:
            pass
        await proc.wait()
        return f"health check program {program} timed out after {timeout:g} s"
    if proc.returncode == 0:
        return None
    first = next((line.strip() for line in out[:OUTPUT_LIMIT].decode(errors="replace").splitlines()
                  if line.strip()), "")
    how = f"exit {proc.returncode}" if proc.returncode > 0 else f"signal {-proc.returncode}"
    return first or f"health check program {program} failed ({how})"


class HealthChecker:
    def __init__(self, cfg: AgentConfig, gpus_at_start: int) -> None:
        self.cfg = cfg
        self.gpus_at_start = gpus_at_start
        self.current: Health | None = None  # None until the first check ran

    def _gpu_count(self) -> int:
        return len(inventory(self.cfg)[1])

    async def check(self) -> Health:
        cfg = self.cfg
        try:
            now = await asyncio.get_running_loop().run_in_executor(None, self._gpu_count)
            problem = gpu_count_problem(self.gpus_at_start, now)
        except Exception as exc:  # NVML failing now is itself a GPU problem
            problem = f"GPU inventory failed: {exc}"
        if problem is None:
            try:
                usage = shutil.disk_usage(cfg.spool)
                problem = spool_problem(cfg.spool, usage.used, usage.total, cfg.spool_full_percent)
            except OSError as exc:
                problem = f"spool {cfg.spool} unusable: {exc.strerror or exc}"
        if problem is None and cfg.health_check_program:
            problem = await run_program(cfg.health_check_program, cfg.health_check_timeout)
        return Health(True) if problem is None else Health(False, problem)

    async def run(self, push: Callable[[str, dict], Awaitable[None]]) -> None:
        while True:
            try:
                health = await self.check()
                if health != self.current:
                    if health.ok:
                        log.info("node is healthy%s", " again" if self.current else "")
                    else:
                        log.warning("node is unhealthy: %s", health.reason)
                self.current = health
                # Every result, not only changes: a node an admin resumed while the check still
                # fails is drained again at the next check, as Slurm does.
                await push("health", health.to_wire())
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("health check failed to run")
            await asyncio.sleep(self.cfg.health_check_interval)
