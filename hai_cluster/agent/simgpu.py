"""The simulated GPUs' live readings: the NVML calls the telemetry sampler makes, on the fake NVML.

A subclass of gpus.SimulatedNvml (inventory stays there), so the sampler runs the same code on
real and simulated GPUs. Readings follow what the node really does: a GPU that a live run holds
reports that run's main process, `busy_util` percent and `process_memory_mb` in use; a free GPU
idles. Power, temperature and clocks follow utilization; ECC counts stay at zero. Event sets are
not supported (like NVML on many consumer GPUs), so no XID thread runs here.
"""
from __future__ import annotations

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


# GPU index -> pids of the processes using it (what the agent's run table says is running there)
Occupancy = Callable[[], Mapping[int, Sequence[int]]]


class NotSupported(SimulatedNvml.NVMLError):
    pass


class SimulatedTelemetryNvml(SimulatedNvml):
    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    NVMLError_NotSupported = NotSupported

    def __init__(self, node: str, count: int, model: str, memory_mb: int, *, occupancy: Occupancy,
                 busy_util: int = 90, process_memory_mb: int = 4096) -> None:
        super().__init__(node, count, model, memory_mb)
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

    def nvmlEventSetCreate(self):
        raise NotSupported("event sets are not supported by the simulated GPUs")
