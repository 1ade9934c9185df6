"""The simulated GPUs' live readings: the NVML calls the telemetry sampler makes, on the fake NVML.

A subclass of gpus.SimulatedNvml (inventory stays there), so the sampler runs the same code on
real and simulated GPUs. Readings follow what the node really does: a GPU that a live run holds
reports that run's main process, `busy_util` percent and `process_memory_mb` in use; a free GPU
idles. Power, temperature and clocks follow utilization; ECC counts stay at zero. Event sets are
not supported (like NVML on many consumer GPUs) unless `gpus.simulated_xid_file` names a file: then
each "GPU XID" line appended to it after the set was created is an XID event of that GPU, which
the sampler's event thread receives exactly as it receives NVML's.

`gpus.simulated_util_file` sets a job's utilization while it runs: each line "JOBID UTIL" (the
last one for a job wins) makes the GPUs its runs hold report UTIL percent instead of `busy_util`,
read at every sample, so a test drives idle reclamation through the very NVML calls the sampler
makes on real GPUs.
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
# GPU index -> ids of the jobs whose live runs hold it
GpuJobs = Callable[[], Mapping[int, Sequence[int]]]
UTIL_FILE_MAX = 64 * 1024  # bytes of the utilization file read


def read_util_file(path: str) -> dict[int, int]:
    """{job id: utilization %} from the lines "JOBID UTIL" of `path`; malformed lines are skipped,
    a missing file is no override. Opened O_NOFOLLOW|O_NONBLOCK (the agent is root), bounded."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return {}
    try:
        data = os.read(fd, UTIL_FILE_MAX)
    except OSError:
        return {}
    finally:
        os.close(fd)
    out: dict[int, int] = {}
    for line in data.split(b"\n"):
        parts = line.split()
        if len(parts) == 2 and all(p.isdigit() for p in parts) and int(parts[1]) <= 100:
            out[int(parts[0])] = int(parts[1])
    return out


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
                 busy_util: int = 90, process_memory_mb: int = 4096, xid_file: str = "",
                 util_file: str = "", gpu_jobs: GpuJobs | None = None) -> None:
        super().__init__(node, count, model, memory_mb)
        self._xid_file = xid_file
        self._util_file = util_file
        self._gpu_jobs = gpu_jobs
        self._occupancy = occupancy
        self._busy = busy_util
        self._process_bytes = min(process_memory_mb, memory_mb) * MIB

    def _pids(self, handle: int) -> Sequence[int]:
        self._check()
        return tuple(self._occupancy().get(handle, ()))

    def _load(self, handle: int) -> float:
        """0..1: how hard the GPU works now."""
        if not self._pids(handle):
            return 0.0
        if self._util_file and self._gpu_jobs is not None:
            wanted = read_util_file(self._util_file)
            set_here = [wanted[j] for j in self._gpu_jobs().get(handle, ()) if j in wanted]
            if set_here:
                return max(set_here) / 100
        return self._busy / 100

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
