"""GPU inventory: one discovery function over the NVML API, run on real NVML or on a fake NVML.

The simulated backend is not a separate code path: `SimulatedNvml` provides the NVML functions
that `discover` calls, so what runs in tests and demos is the same code that runs on GPU nodes.
"""
from __future__ import annotations

import logging
from typing import Any

from ..config import AgentConfig
from ..core.model import GpuInfo

log = logging.getLogger(__name__)

MIB = 1024 * 1024


class GpuError(Exception):
    pass


def _text(value: str | bytes) -> str:
    # nvidia-ml-py >= 11.515 decodes to str; older releases returned bytes
    return value.decode() if isinstance(value, bytes) else value


def discover(nvml: Any) -> list[GpuInfo]:
    """The GPUs that `nvml` (the pynvml module, or a SimulatedNvml) reports, in index order."""
    nvml.nvmlInit()
    try:
        gpus = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            gpus.append(GpuInfo(
                index=index,
                uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                name=_text(nvml.nvmlDeviceGetName(handle)),
                memory_mb=int(nvml.nvmlDeviceGetMemoryInfo(handle).total) // MIB,
            ))
        return gpus
    finally:
        nvml.nvmlShutdown()


class _Memory:
    def __init__(self, total: int) -> None:
        self.total, self.free, self.used = total, total, 0


class SimulatedNvml:
    """The subset of pynvml that `discover` uses, describing cfg.simulated's GPUs.

    Strings come back as str, like current nvidia-ml-py; UUIDs are deterministic per node.
    """

    class NVMLError(Exception):
        pass

    def __init__(self, node: str, count: int, model: str, memory_mb: int) -> None:
        self._node, self._count, self._model, self._memory_mb = node, count, model, memory_mb
        self._initialized = 0

    def nvmlInit(self) -> None:
        self._initialized += 1

    def nvmlShutdown(self) -> None:
        if self._initialized == 0:
            raise self.NVMLError("NVML not initialized")
        self._initialized -= 1

    def _check(self) -> None:
        if self._initialized == 0:
            raise self.NVMLError("NVML not initialized")

    def nvmlDeviceGetCount(self) -> int:
        self._check()
        return self._count

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        self._check()
        if not 0 <= index < self._count:
            raise self.NVMLError(f"invalid GPU index {index}")
        return index  # the handle is opaque to callers; ours is the index

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        self._check()
        return f"GPU-sim-{self._node}-{handle}"

    def nvmlDeviceGetName(self, handle: int) -> str:
        self._check()
        return self._model

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> _Memory:
        self._check()
        return _Memory(self._memory_mb * MIB)


def simulated_nvml(cfg: AgentConfig) -> SimulatedNvml:
    s = cfg.simulated
    return SimulatedNvml(cfg.name, s.count, s.model, s.memory_mb)


def _real_nvml() -> Any:
    try:
        import pynvml
    except ImportError as exc:
        raise GpuError(f"the NVML bindings (nvidia-ml-py) are not installed: {exc}") from None
    return pynvml


def inventory(cfg: AgentConfig) -> tuple[str, list[GpuInfo]]:
    """(backend name, GPUs) for this node, per cfg.gpu_backend. Raises GpuError if NVML was
    required and does not work. "auto" falls back to simulated only when nvmlInit itself fails:
    a real GPU failing during discovery must not turn into fake GPUs."""
    if cfg.gpu_backend == "simulated":
        return "simulated", discover(simulated_nvml(cfg))
    try:
        nvml = _real_nvml()
        nvml.nvmlInit()
    except Exception as exc:  # GpuError, pynvml.NVMLError_LibraryNotFound, driver errors
        if cfg.gpu_backend == "nvml":
            raise GpuError(f"NVML is not usable on this node: {exc}") from None
        log.info("NVML not usable (%s); using %d simulated GPU(s)", exc, cfg.simulated.count)
        return "simulated", discover(simulated_nvml(cfg))
    try:
        return "nvml", discover(nvml)
    except Exception as exc:
        raise GpuError(f"NVML GPU discovery failed: {exc}") from None
    finally:
        nvml.nvmlShutdown()  # balances the probe's nvmlInit (NVML counts them)
