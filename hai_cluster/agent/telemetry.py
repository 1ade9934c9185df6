"""The agent's sensor: every `interval` seconds, per GPU utilization, memory, power, temperature,
SM clock and ECC counts, and per run its GPU memory (NVML's per-process list mapped back to the
run by pid), CPU % and RSS; XID and ECC events from an NVML event set in a thread of their own.

The NVML calls go through the module the inventory uses (pynvml, or the fake of agent/simgpu.py),
always on one worker thread: NVML can block for long stretches on a sick GPU, and the RPC loop
must not. Samples go into a bounded ring; the ones not yet delivered are pushed to the controller
as one msgpack batch ("telemetry" event) after each sample. While no controller is connected they
wait in the ring; what falls off its end is a gap in the history, nothing more.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterable

import psutil

from . import spool
from .cgroups import RunCgroup

log = logging.getLogger(__name__)

MIB = 1024 * 1024
WIRE_VERSION = 1
MAX_BATCH = 120  # samples per pushed frame; a long backlog goes over several pushes
COST_LOG_EVERY = 720  # samples between log lines about the sampling cost
# NVML event types (nvml.h): single- and double-bit ECC errors, XID critical errors
EVENT_SBE, EVENT_DBE, EVENT_XID = 0x1, 0x2, 0x8
EVENT_KINDS = {EVENT_SBE: "ecc_corrected", EVENT_DBE: "ecc_uncorrected", EVENT_XID: "xid"}


@dataclass(frozen=True)
class RunRef:
    """What the sampler needs to know about a live run (read from the run table on the loop)."""
    job_id: int
    attempt: int
    gpus: tuple[int, ...]
    pid: int | None  # the job's main process, also its process group id
    dir: Path


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, process group) of a pid, from /proc/PID/stat."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2:].split()
    return fields[0].decode(), int(fields[2])


def process_groups() -> dict[int, list[int]]:
    """Live processes by process group, from one pass over /proc."""
    groups: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = _proc_stat(int(name))
            if st is not None and st[0] not in ("Z", "X"):
                groups.setdefault(st[1], []).append(int(name))
    return groups


def run_cgroup(run: RunRef) -> RunCgroup | None:
    """The run's cgroup, as its shepherd recorded it (None: none, or not yet)."""
    try:
        rec = spool.read_json(run.dir / "isolation.json")
        if isinstance(rec, dict) and rec.get("cgroup"):
            return RunCgroup.from_record(rec["cgroup"])
    except (ValueError, KeyError, TypeError):
        pass
    return None


def run_pids(run: RunRef, groups: dict[int, list[int]], cgroup: RunCgroup | None = None) -> set[int]:
    """A run's processes: its cgroup's members (which holds what left the process group too),
    and its process group."""
    pids: set[int] = set(cgroup.members()) if cgroup is not None else set()
    if run.pid is not None:
        pids.update(groups.get(run.pid, ()))
        pids.add(run.pid)
    return pids


def _nvml_value(nvml: Any, fn: Callable[[], Any]) -> Any:
    """One reading; None where this GPU does not support it (or it failed this time)."""
    try:
        return fn()
    except nvml.NVMLError:
        return None


class Sampler:
    def __init__(self, nvml: Any, node: str, interval: float, history: int,
                 on_event: Callable[[int | None, str, int], None] | None = None) -> None:
        self.nvml, self.node, self.interval = nvml, node, interval
        self.on_event = on_event  # called on the event thread with (gpu, kind, value): health checks
        self.ring: collections.deque[tuple[int, dict]] = collections.deque(maxlen=history)
        self.seq = 0
        self.sent = 0  # the last seq delivered to a controller
        self.handles: list[Any] = []
        self.events: collections.deque[dict] = collections.deque(maxlen=1000)
        self._cpu: dict[tuple[int, int], tuple[float, float]] = {}  # run -> (wall, cpu seconds) last time
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nvml")
        self._stop = threading.Event()
        self._event_thread: threading.Thread | None = None
        self.costs: list[float] = []

    # ---- NVML lifetime, on the worker thread ----------------------------------------------
    def open(self) -> None:
        self.nvml.nvmlInit()
        self.handles = [self.nvml.nvmlDeviceGetHandleByIndex(i) for i in range(self.nvml.nvmlDeviceGetCount())]
        self._start_events()

    def close(self) -> None:
        self._stop.set()
        if self._event_thread is not None:
            self._event_thread.join(timeout=5)
        try:
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError as exc:
            log.debug("nvmlShutdown: %s", exc)

    def _start_events(self) -> None:
        nvml = self.nvml
        try:
            event_set = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as exc:
            log.info("no GPU event set (%s): XID/ECC events are not watched; ECC counts still are", exc)
            return
        registered = 0
        for index, handle in enumerate(self.handles):
            # a GPU without ECC refuses the whole mask: ask only for what it supports
            supported = _nvml_value(nvml, lambda: nvml.nvmlDeviceGetSupportedEventTypes(handle))
            wanted = (EVENT_SBE | EVENT_DBE | EVENT_XID) & (supported if supported is not None else ~0)
            if not wanted:
                continue
            try:
                nvml.nvmlDeviceRegisterEvents(handle, wanted, event_set)
                registered += 1
            except nvml.NVMLError as exc:
                log.info("GPU %d: XID/ECC events not supported (%s)", index, exc)
        if not registered:
            nvml.nvmlEventSetFree(event_set)
            return
        self._event_thread = threading.Thread(target=self._watch_events, args=(event_set,),
                                              name="nvml-events", daemon=True)
        self._event_thread.start()

    def _watch_events(self, event_set: Any) -> None:
        nvml = self.nvml
        try:
            while not self._stop.is_set():
                try:
                    data = nvml.nvmlEventSetWait_v2(event_set, 1000)
                except nvml.NVMLError as exc:
                    if "Timeout" in type(exc).__name__ or "Timeout" in str(exc):
                        continue
                    log.warning("GPU event wait failed (%s); no more XID/ECC events", exc)
                    return
                kind = EVENT_KINDS.get(data.eventType, f"type_{data.eventType}")
                gpu = _nvml_value(nvml, lambda: nvml.nvmlDeviceGetIndex(data.device))
                log.warning("GPU %s: %s event, data %s", gpu, kind, data.eventData)
                self.events.append({"t": time.time(), "gpu": gpu, "kind": kind, "value": int(data.eventData)})
                if self.on_event is not None:
                    try:
                        self.on_event(gpu, kind, int(data.eventData))
                    except Exception:  # the watch must outlive a bad consumer
                        log.exception("GPU event consumer failed")
        finally:
            nvml.nvmlEventSetFree(event_set)

    # ---- one sample, on the worker thread --------------------------------------------------
    def gpu_reading(self, index: int, handle: Any) -> dict:
        nvml = self.nvml
        util = _nvml_value(nvml, lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
        mem = _nvml_value(nvml, lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
        power = _nvml_value(nvml, lambda: nvml.nvmlDeviceGetPowerUsage(handle))
        return {
            "index": index,
            "util": None if util is None else int(util.gpu),
            "mem_used_mb": None if mem is None else int(mem.used) // MIB,
            "mem_total_mb": None if mem is None else int(mem.total) // MIB,
            "power_w": None if power is None else round(power / 1000, 1),
            "temp_c": _nvml_value(nvml, lambda: int(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))),
            "sm_mhz": _nvml_value(nvml, lambda: int(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM))),
            "ecc_corrected": _nvml_value(nvml, lambda: int(nvml.nvmlDeviceGetTotalEccErrors(
                handle, nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, nvml.NVML_VOLATILE_ECC))),
            "ecc_uncorrected": _nvml_value(nvml, lambda: int(nvml.nvmlDeviceGetTotalEccErrors(
                handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC))),
        }

    def gpu_processes(self, handle: Any) -> list[tuple[int, int]]:
        """(pid, GPU memory in MiB) of the compute processes on one GPU."""
        procs = _nvml_value(self.nvml, lambda: self.nvml.nvmlDeviceGetComputeRunningProcesses(handle)) or []
        return [(int(p.pid), int(p.usedGpuMemory or 0) // MIB) for p in procs]

    def run_reading(self, run: RunRef, pids: set[int], gpu_mem: dict[int, int], now: float,
                    cgroup: RunCgroup | None = None) -> dict:
        # CPU time: the cgroup's (exited children included); a sum over live processes without one
        cg_cpu = cgroup.usage()[0] if cgroup is not None else None
        cpu_seconds, rss = cg_cpu or 0.0, 0
        for pid in pids:
            try:
                proc = psutil.Process(pid)
                with proc.oneshot():
                    if cg_cpu is None:
                        t = proc.cpu_times()
                        cpu_seconds += t.user + t.system
                    rss += proc.memory_info().rss
            except (psutil.Error, OSError):
                continue  # gone since the listing
        key = (run.job_id, run.attempt)
        before = self._cpu.get(key)
        self._cpu[key] = (now, cpu_seconds)
        cpu_pct = None
        if before is not None and now > before[0]:
            cpu_pct = round(max(0.0, cpu_seconds - before[1]) / (now - before[0]) * 100, 1)
        return {"job_id": run.job_id, "attempt": run.attempt, "gpus": list(run.gpus),
                "gpu_mem_mb": sum(mb for pid, mb in gpu_mem.items() if pid in pids),
                "cpu_pct": cpu_pct, "rss_mb": rss // MIB, "pids": len(pids)}

    def sample(self, runs: Iterable[RunRef]) -> dict:
        started = time.perf_counter()
        now = time.time()
        gpus = [self.gpu_reading(i, h) for i, h in enumerate(self.handles)]
        gpu_mem: dict[int, int] = {}  # pid -> MiB over all GPUs
        for h in self.handles:
            for pid, mb in self.gpu_processes(h):
                gpu_mem[pid] = gpu_mem.get(pid, 0) + mb
        runs = list(runs)
        groups = process_groups() if runs else {}
        readings = []
        for r in runs:
            cg = run_cgroup(r)
            readings.append(self.run_reading(r, run_pids(r, groups, cg), gpu_mem, now, cg))
        live = {(r.job_id, r.attempt) for r in runs}
        for key in [k for k in self._cpu if k not in live]:
            del self._cpu[key]
        events = []
        while self.events:
            events.append(self.events.popleft())
        cost = (time.perf_counter() - started) * 1000
        return {"t": now, "gpus": gpus, "runs": readings, "events": events, "cost_ms": round(cost, 3)}

    def _note_cost(self, cost_ms: float) -> None:
        self.costs.append(cost_ms)
        if len(self.costs) == 1:
            log.info("telemetry: first sample of %d GPU(s) took %.1f ms", len(self.handles), cost_ms)
        if len(self.costs) >= COST_LOG_EVERY:
            log.info("telemetry: sampling cost over the last %d samples: mean %.2f ms, max %.2f ms",
                     len(self.costs), sum(self.costs) / len(self.costs), max(self.costs))
            self.costs.clear()

    # ---- the loop ------------------------------------------------------------------------
    def record(self, sample: dict) -> None:
        self.seq += 1
        self.ring.append((self.seq, sample))
        self._note_cost(sample["cost_ms"])

    def unsent(self) -> list[tuple[int, dict]]:
        return [(seq, s) for seq, s in self.ring if seq > self.sent][:MAX_BATCH]

    def batch(self, samples: list[dict]) -> dict:
        return {"v": WIRE_VERSION, "node": self.node, "interval": self.interval, "samples": samples}

    async def call(self, fn: Callable, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def run(self, runs: Callable[[], list[RunRef]],
                  send: Callable[[dict], Awaitable[bool]]) -> None:
        """Sample, record, deliver, until cancelled. `send` returns whether a controller got it."""
        try:
            await self.call(self.open)
        except Exception as exc:  # the inventory worked a moment ago; a node still runs jobs without this
            log.error("telemetry is off: NVML could not be opened for sampling: %s", exc)
            return
        try:
            while True:
                t0 = time.monotonic()
                try:
                    self.record(await self.call(self.sample, runs()))
                    while pending := self.unsent():
                        if not await send(self.batch([s for _, s in pending])):
                            break  # nobody listening: the samples wait in the ring
                        self.sent = pending[-1][0]
                except asyncio.CancelledError:
                    raise
                except Exception:  # a sample that fails must not end the sampling
                    log.exception("telemetry sample failed")
                await asyncio.sleep(max(0.0, self.interval - (time.monotonic() - t0)))
        finally:
            await self.call(self.close)
            self._executor.shutdown(wait=False)
