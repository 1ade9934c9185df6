"""GPU inventory for sharing and topology: links, MIG mode and isolation, over the NVML API."""
from __future__ import annotations

import os

import pytest

from hai_cluster.agent.gpus import SimulatedNvml, discover, inventory
from hai_cluster.config import AgentConfig, ConfigError, SharingConfig, SimulatedGpus, load_agent_config

pytestmark = pytest.mark.timeout(30)


def _fake_mps(tmp_path) -> str:
    path = tmp_path / "mps-control"
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return str(path)


def test_links_from_nvlinks_and_common_ancestors():
    # Two NVLink pairs (4 links each) on one PCIe switch each; the pairs meet at the CPU (level 50).
    nvml = SimulatedNvml("n", 4, "Sim", 1024, nvlinks=((0, 1, 4), (2, 3, 4)),
                         levels=((0, 1, 10), (2, 3, 10)), default_level=50)
    gpus = discover(nvml)
    assert gpus[0].links == ((1, 4, 10), (2, 0, 50), (3, 0, 50))
    assert gpus[3].links == ((0, 0, 50), (1, 0, 50), (2, 4, 10))
    assert nvml._initialized == 0


def test_no_topology_support_means_no_links():
    class Old(SimulatedNvml):  # a driver without the topology and NVLink calls
        def __getattribute__(self, name):
            if name.startswith("nvmlDeviceGetTopology") or name.startswith("nvmlDeviceGetNvLink") \
                    or name == "nvmlDeviceGetMigMode":
                raise AttributeError(name)
            return super().__getattribute__(name)

    gpus = discover(Old("n", 2, "Sim", 1024, nvlinks=((0, 1, 2),), levels=((0, 1, 0),)), SharingConfig(gpus=(0,)))
    assert [g.links for g in gpus] == [(), ()]
    assert [(g.isolation, g.shareable) for g in gpus] == [("none", False), ("none", False)]


def test_sharing_modes(tmp_path):
    nvml = SimulatedNvml("n", 3, "Sim", 1024, mig=(2,))
    no_mps = SharingConfig(gpus=(0, 2), mps_control=str(tmp_path / "absent"))
    assert [(g.isolation, g.shareable) for g in discover(nvml, no_mps)] == [
        ("none", False), ("none", False), ("mig", False)]
    allowed = SharingConfig(gpus=(0, 2), mps_control=str(tmp_path / "absent"), allow_unisolated=True)
    assert [g.shareable for g in discover(nvml, allowed)] == [True, False, False]
    mps = SharingConfig(gpus=(0, 1), mps_control=_fake_mps(tmp_path))
    assert [(g.isolation, g.shareable) for g in discover(nvml, mps)] == [
        ("mps", True), ("mps", True), ("mig", False)]


def test_agent_toml_topology_and_sharing(tmp_path):
    fake = _fake_mps(tmp_path)
    conf = tmp_path / "agent.toml"
    conf.write_text(f"""
[agent]
name = "n1"
[gpus]
backend = "simulated"
simulated_count = 2
simulated_nvlinks = [[0, 1, 18]]
simulated_levels = [[0, 1, 0]]
[sharing]
gpus = [1]
mps_control = "./{os.path.basename(fake)}"  # relative to the file
run_dir = "mps"
""")
    cfg = load_agent_config(conf)
    assert cfg.sharing == SharingConfig(gpus=(1,), mps_control=fake, run_dir=str(tmp_path / "mps"))
    backend, gpus = inventory(cfg)
    assert backend == "simulated"
    assert [(g.index, g.isolation, g.shareable, g.links) for g in gpus] == [
        (0, "mps", False, ((1, 18, 0),)), (1, "mps", True, ((0, 18, 0),))]
    for bad, msg in (("[sharing]\ngpus = [-1]", "sharing.gpus must be a list of GPU indices"),
                     ("[gpus]\nsimulated_nvlinks = [[0, 1]]", "simulated_nvlinks must be a list of"),
                     ("[sharing]\nmps = 1", "unknown key")):
        conf.write_text(f"[agent]\nname = \"n1\"\n{bad}\n")
        with pytest.raises(ConfigError, match=msg):
            load_agent_config(conf)


def test_simulated_defaults_unchanged():
    backend, gpus = inventory(AgentConfig(name="n", gpu_backend="simulated", simulated=SimulatedGpus(2)))
    assert [(g.links, g.isolation, g.shareable) for g in gpus] == [((), "none", False)] * 2


def test_mig_layout_from_agent_toml_is_in_the_inventory(tmp_path):
    conf = tmp_path / "agent.toml"
    conf.write_text("""
[agent]
name = "n1"
[gpus]
backend = "simulated"
simulated_count = 2
simulated_mig_layout = { 0 = ["3g.40gb", "2g.20gb", "2g.20gb"] }
[sharing]
gpus = [0, 1]
mps_control = "/nonexistent/mps"
""")
    cfg = load_agent_config(conf)
    assert cfg.simulated.mig_layout == ((0, ("3g.40gb", "2g.20gb", "2g.20gb")),)
    _backend, gpus = inventory(cfg)
    assert (gpus[0].isolation, gpus[0].shareable) == ("mig", True)
    assert gpus[0].mig == (("MIG-sim-n1-0-0", "3g.40gb", 40960, 42), ("MIG-sim-n1-0-1", "2g.20gb", 20480, 28),
                           ("MIG-sim-n1-0-2", "2g.20gb", 20480, 28))
    assert (gpus[1].isolation, gpus[1].shareable, gpus[1].mig) == ("none", False, ())
    for bad, msg in (('{ 0 = ["4g.40gb", "4g.40gb"] }', "more than the card's 7 compute slices"),
                     ('{ 0 = ["big"] }', "list of MIG profiles"), ('{ a = ["1g.10gb"] }', "GPU index")):
        conf.write_text(f"[agent]\nname = \"n1\"\n[gpus]\nsimulated_mig_layout = {bad}\n")
        with pytest.raises(ConfigError, match=msg):
            load_agent_config(conf)


def test_mig_enumeration_is_defensive():
    from hai_cluster.agent.gpus import mig_devices

    class Odd(SimulatedNvml):  # slot 1 is empty, slot 2's name carries no profile we know
        def nvmlDeviceGetMigDeviceHandleByIndex(self, handle, index):
            if index == 1:
                raise self.NVMLError("Not Found")
            return super().nvmlDeviceGetMigDeviceHandleByIndex(handle, index)

        def nvmlDeviceGetName(self, handle):
            name = super().nvmlDeviceGetName(handle)
            return "mystery" if getattr(handle, "slot", None) == 2 else name

    nvml = Odd("n", 1, "Sim", 81920, mig_layout=((0, ("1g.10gb", "1g.10gb", "1g.10gb", "4g.40gb")),))
    nvml.nvmlInit()
    assert mig_devices(nvml, 0) == (("MIG-sim-n-0-0", "1g.10gb", 10240, 14), ("MIG-sim-n-0-3", "4g.40gb", 40960, 57))
    assert mig_devices(SimulatedNvml("n", 1, "Sim", 1024), 0) == ()  # not in MIG mode: the call is refused
    # MIG mode but no instances created: reported, not offered for sharing.
    (card,) = discover(SimulatedNvml("n", 1, "Sim", 1024, mig=(0,)), SharingConfig(gpus=(0,)))
    assert (card.isolation, card.shareable, card.mig) == ("mig", False, ())
