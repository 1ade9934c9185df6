"""GPU inventory: the one NVML discovery function, over the simulated NVML and the real one."""
from __future__ import annotations

import dataclasses

import pytest

from hai_cluster.agent.gpus import GpuError, SimulatedNvml, discover, inventory
from hai_cluster.config import AgentConfig, SimulatedGpus
from hai_cluster.core.model import GpuInfo

pytestmark = pytest.mark.timeout(30)


def _nvml_works() -> bool:
    try:
        import pynvml
        pynvml.nvmlInit()
    except Exception:
        return False
    pynvml.nvmlShutdown()
    return True


def test_discover_over_simulated_nvml():
    nvml = SimulatedNvml("n7", 2, "Simulated A100", 40960)
    assert discover(nvml) == [GpuInfo(0, "GPU-sim-n7-0", "Simulated A100", 40960),
                              GpuInfo(1, "GPU-sim-n7-1", "Simulated A100", 40960)]
    assert discover(nvml) == discover(SimulatedNvml("n7", 2, "Simulated A100", 40960))  # deterministic
    assert nvml._initialized == 0  # every nvmlInit was shut down again
    with pytest.raises(SimulatedNvml.NVMLError):
        nvml.nvmlDeviceGetCount()  # like NVML: nothing works outside init/shutdown


def test_discover_accepts_bytes_from_old_bindings():
    class OldBindings(SimulatedNvml):  # nvidia-ml-py before 11.515 returned bytes
        def nvmlDeviceGetUUID(self, handle):
            return super().nvmlDeviceGetUUID(handle).encode()

        def nvmlDeviceGetName(self, handle):
            return super().nvmlDeviceGetName(handle).encode()

    assert discover(OldBindings("n", 1, "X", 1024)) == [GpuInfo(0, "GPU-sim-n-0", "X", 1024)]


def test_simulated_backend_from_config():
    cfg = AgentConfig(name="gpu01", gpu_backend="simulated", simulated=SimulatedGpus(3, "Sim H200", 143771))
    backend, gpus = inventory(cfg)
    assert backend == "simulated"
    assert [dataclasses.astuple(g)[:4] for g in gpus] == [(i, f"GPU-sim-gpu01-{i}", "Sim H200", 143771)
                                                          for i in range(3)]
    assert inventory(dataclasses.replace(cfg, simulated=SimulatedGpus(0)))[1] == []


@pytest.mark.skipif(_nvml_works(), reason="NVML works on this machine")
def test_without_nvml_auto_falls_back_and_nvml_is_an_error():
    cfg = AgentConfig(name="n", gpu_backend="auto", simulated=SimulatedGpus(2))
    backend, gpus = inventory(cfg)
    assert backend == "simulated" and len(gpus) == 2
    with pytest.raises(GpuError, match="NVML is not usable"):
        inventory(dataclasses.replace(cfg, gpu_backend="nvml"))


@pytest.mark.skipif(not _nvml_works(), reason="no NVML on this machine")
def test_real_nvml_inventory():
    backend, gpus = inventory(AgentConfig(name="n", gpu_backend="nvml"))
    assert backend == "nvml" and gpus
    assert [g.index for g in gpus] == list(range(len(gpus)))
    assert all(g.uuid.startswith("GPU-") and g.name and g.memory_mb > 0 for g in gpus)
