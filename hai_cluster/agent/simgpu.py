"""The simulated GPUs' live readings: the NVML calls the telemetry sampler makes, on the fake NVML.

A subclass of gpus.SimulatedNvml (inventory stays there), so the sampler runs the same code on
real and simulated GPUs. Readings follow what the node really does: a GPU that a live run holds
reports that run's main process, `busy_util` percent and `process_memory_mb` in use; a free GPU
idles. Power, temperature and clocks follow utilization; ECC counts stay at zero. Event sets are
not supported (like NVML on many consumer GPUs) unless `gpus.simulated_xid_file` names a file: then
each "GPU XID" line appended to it after the set was created is an XID event of that GPU, which
the sampler's event thread receives exactly as it receives NVML's.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from .gpus import MIB, SimulatedNvml

IDLE_W, MAX_W = 70.0, 700.0  # an H100 SXM's idle and board power
IDLE_C, HOT_C = 32, 75
BASE_MHZ, BOOST_MHZ = 345, 1980


@dataclass
class _Utilization:
    gpu: int
    memory: int


@dataclass
class _Memory:
    total: int
    used: int
    free: int


@dataclass
class _Process:
    pid: int
    usedGpuMemory: int | None


@dataclass
class _EventData:
    device: int
    eventType: int
    eventData: int
    gpuInstanceId: int = 0xFFFFFFFF
    computeInstanceId: int = 0xFFFFFFFF


EVENT_XID = 0x8  # nvmlEventTypeXidCriticalError
SUPPORTED_EVENTS = 0x1 | 0x2 | EVENT_XID  # single- and double-bit ECC, XID
POLL = 0.05  # seconds between looks at the XID file while waiting


class _EventSet:
    """Reads the XID file from where it ended when the set was created: like NVML, a set sees only
    events that happen after it exists."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.registered: dict[int, int] = {}  # GPU -> event mask
        self.pending: list[_EventData] = []
        self.partial = b""
        try:
            self.offset = os.path.getsize(path)
        except OSError:
            self.offset = 0

    def read(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return
        self.offset += len(data)
        *lines, self.partial = (self.partial + data).split(b"\n")
        for line in lines:
            parts = line.split()
            if len(parts) == 2 and all(p.isdigit() for p in parts):
                gpu, xid = int(parts[0]), int(parts[1])
                if self.registered.get(gpu, 0) & EVENT_XID:
                    self.pending.append(_EventData(device=gpu, eventType=EVENT_XID, eventData=xid))


# GPU index -> pids of the processes using it (what the agent's run table says is running there)
Occupancy = Callable[[], Mapping[int, Sequence[int]]]


class NotSupported(SimulatedNvml.NVMLError):
    pass


class Timeout(SimulatedNvml.NVMLError):
    pass


class SimulatedTelemetryNvml(SimulatedNvml):
    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    NVMLError_NotSupported = NotSupported
    NVMLError_Timeout = Timeout

    def __init__(self, node: str, count: int, model: str, memory_mb: int, *, occupancy: Occupancy,
                 busy_util: int = 90, process_memory_mb: int = 4096, xid_file: str = "") -> None:
        super().__init__(node, count, model, memory_mb)
        self._xid_file = xid_file
        self._occupancy = occupancy
        self._busy = busy_util
        self._process_bytes = min(process_memory_mb, memory_mb) * MIB

    def _pids(self, handle: int) -> Sequence[int]:
        self._check()
        return tuple(self._occupancy().get(handle, ()))

    def _load(self, handle: int) -> float:
        """0..1: how hard the GPU works now."""
        return self._busy / 100 if self._pids(handle) else 0.0

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[_Process]:
        pids = self._pids(handle)
        return [_Process(pid, self._process_bytes // max(1, len(pids))) for pid in pids]

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> _Utilization:
        util = round(self._load(handle) * 100)
        return _Utilization(gpu=util, memory=util // 2)

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> _Memory:
        total = self._memory_mb * MIB
        used = self._process_bytes if self._pids(handle) else 0
        return _Memory(total=total, used=used, free=total - used)

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        return round((IDLE_W + (MAX_W - IDLE_W) * self._load(handle)) * 1000)  # milliwatts, as NVML

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:
        self._check()
        return round(IDLE_C + (HOT_C - IDLE_C) * self._load(handle))

    def nvmlDeviceGetClockInfo(self, handle: int, clock: int) -> int:
        return BOOST_MHZ if self._load(handle) > 0 else BASE_MHZ

    def nvmlDeviceGetTotalEccErrors(self, handle: int, error_type: int, counter_type: int) -> int:
        self._check()
        return 0

    def nvmlEventSetCreate(self) -> _EventSet:
        self._check()
        if not self._xid_file:
            raise NotSupported("event sets are not supported by the simulated GPUs")
        return _EventSet(self._xid_file)

    def nvmlDeviceGetSupportedEventTypes(self, handle: int) -> int:
        self._check()
        return SUPPORTED_EVENTS if self._xid_file else 0

    def nvmlDeviceRegisterEvents(self, handle: int, mask: int, event_set: _EventSet) -> None:
        self._check()
        if mask & ~SUPPORTED_EVENTS:
            raise NotSupported(f"event types {mask:#x} not supported")
        event_set.registered[handle] = event_set.registered.get(handle, 0) | mask

    def nvmlEventSetWait_v2(self, event_set: _EventSet, timeout_ms: int) -> _EventData:
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            event_set.read()
            if event_set.pending:
                return event_set.pending.pop(0)
            if time.monotonic() >= deadline:
                raise Timeout("Timeout")
            time.sleep(POLL)

    def nvmlEventSetFree(self, event_set: _EventSet) -> None:
        event_set.pending.clear()

    def nvmlDeviceGetIndex(self, handle: int) -> int:
        self._check()
        return handle
