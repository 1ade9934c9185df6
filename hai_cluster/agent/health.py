"""Node health: the site's health-check program (like Slurm's HealthCheckProgram) and built-in checks.

A critical XID (`critical_xids`, NVIDIA's "reset the GPU" ones) that the telemetry sampler's NVML
event thread sees is reported at once, ahead of everything else, as a sticky problem: the
controller drains the node until an admin resumes it (passing checks do not bring it back, since
only a GPU reset clears such a fault). The agent reports each XID until a controller got it.

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
import threading
from dataclasses import dataclass
from typing import Awaitable, Callable

from .. import timeouts
from ..config import AgentConfig
from .gpus import inventory

log = logging.getLogger(__name__)

OUTPUT_LIMIT = 64 * 1024


@dataclass(frozen=True)
class Health:
    ok: bool
    reason: str = ""
    sticky: bool = False  # only an admin's resume returns the node to service

    def to_wire(self) -> dict:
        wire = {"ok": self.ok, "reason": self.reason}
        if self.sticky:
            wire["sticky"] = True
        return wire


# What NVIDIA's XID catalog says the critical ones mean (short)
XID_MEANINGS = {
    48: "double-bit ECC error", 63: "ECC page retirement or row remapping recorded",
    64: "ECC page retirement or row remapping failed", 74: "NVLink error",
    79: "GPU has fallen off the bus", 92: "high single-bit ECC error rate",
    94: "contained ECC error", 95: "uncontained ECC error", 119: "GSP RPC timeout", 120: "GSP error",
}


def xid_problem(gpu: int | None, xid: int, critical: tuple[int, ...]) -> str | None:
    if xid not in critical:
        return None
    meaning = XID_MEANINGS.get(xid, "critical error")
    return f"GPU {'?' if gpu is None else gpu} XID {xid} ({meaning}): needs a GPU reset"


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
        out, _ = await timeouts.wait_for(proc.communicate(), timeout)
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
        self._xids: list[str] = []  # critical XIDs not yet delivered to a controller, oldest first
        self._lock = threading.Lock()  # _xids is filled from the NVML event thread
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake = asyncio.Event()

    def note_event(self, gpu: int | None, kind: str, value: int) -> None:
        """A GPU event from the telemetry sampler's thread; a critical XID triggers a check now."""
        problem = xid_problem(gpu, value, self.cfg.critical_xids) if kind == "xid" else None
        if problem is None:
            return
        with self._lock:
            self._xids.append(problem)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._wake.set)

    def _pending_xid(self) -> str | None:
        with self._lock:
            return self._xids[0] if self._xids else None

    def _delivered(self, reason: str) -> None:
        with self._lock:
            if self._xids and self._xids[0] == reason:
                self._xids.pop(0)
            if self._xids:
                self._wake.set()

    def _gpu_count(self) -> int:
        return len(inventory(self.cfg)[1])

    async def check(self) -> Health:
        cfg = self.cfg
        xid = self._pending_xid()
        if xid is not None:
            return Health(False, xid, sticky=True)
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

    async def run(self, push: Callable[[str, dict], Awaitable[bool]]) -> None:
        """`push` returns whether a controller got the report."""
        self._loop = asyncio.get_running_loop()
        while True:
            self._wake.clear()
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
                if await push("health", health.to_wire()) and health.sticky:
                    self._delivered(health.reason)  # the controller keeps the node drained from now on
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("health check failed to run")
            try:
                await timeouts.wait_for(self._wake.wait(), self.cfg.health_check_interval)
            except asyncio.TimeoutError:
                pass
