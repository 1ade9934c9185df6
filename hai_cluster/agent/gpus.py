"""GPU inventory: one discovery function over the NVML API, run on real NVML or on a fake NVML.

The simulated backend is not a separate code path: `SimulatedNvml` provides the NVML functions
that `discover` calls, so what runs in tests and demos is the same code that runs on GPU nodes.
"""
from __future__ import annotations

import logging
import shutil
from dataclasses import replace
from typing import Any

from ..config import AgentConfig
from ..core.model import GpuInfo
from ..core.sharing import mig_compute, mig_profile

log = logging.getLogger(__name__)

MIB = 1024 * 1024


class GpuError(Exception):
    pass


def _text(value: str | bytes) -> str:
    # nvidia-ml-py >= 11.515 decodes to str; older releases returned bytes
    return value.decode() if isinstance(value, bytes) else value


def discover(nvml: Any, sharing: Any = None) -> list[GpuInfo]:
    """The GPUs that `nvml` (the pynvml module, or a SimulatedNvml) reports, in index order, with
    their links and, per `sharing` (a SharingConfig), whether they take shares and how."""
    nvml.nvmlInit()
    try:
        gpus, handles = [], []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            handles.append(handle)
            gpus.append(GpuInfo(
                index=index,
                uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                name=_text(nvml.nvmlDeviceGetName(handle)),
                memory_mb=int(nvml.nvmlDeviceGetMemoryInfo(handle).total) // MIB,
            ))
        links = topology(nvml, handles)
        gpus = [replace(g, links=links.get(g.index, ())) for g in gpus]
        if sharing is not None:
            gpus = [_sharing_mode(nvml, h, g, sharing) for g, h in zip(gpus, handles)]
        return gpus
    finally:
        nvml.nvmlShutdown()


def mig_devices(nvml: Any, handle: Any) -> tuple[tuple[str, str, int, int], ...]:
    """The MIG instances the admin created on a card in MIG mode: (UUID, profile, MiB, compute %).
    Defensive: an instance whose profile NVML does not name in a way we know is left out (we
    cannot tell its compute share), and a driver without the calls gives none."""
    try:
        count = int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))
    except Exception:
        return ()
    out = []
    for i in range(count):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
        except Exception:  # NVML_ERROR_NOT_FOUND: no instance in this slot
            continue
        try:
            uuid, name = _text(nvml.nvmlDeviceGetUUID(mig)), _text(nvml.nvmlDeviceGetName(mig))
            memory_mb = int(nvml.nvmlDeviceGetMemoryInfo(mig).total) // MIB
        except Exception as exc:
            log.warning("MIG device %d: %s; left out", i, exc)
            continue
        profile = mig_profile(name)
        if profile is None:
            log.warning("MIG device %s: profile not recognized in %r; left out", uuid, name)
            continue
        out.append((uuid, f"{profile[0]}g.{profile[1]}gb", memory_mb, mig_compute(profile[0])))
    return tuple(out)


NVLINK_MAX_LINKS = 18  # NVML_NVLINK_MAX_LINKS (H100/H200: 18)
NVLINK_REMOTE_SWITCH = 2  # NVML_NVLINK_DEVICE_TYPE_SWITCH


def topology(nvml: Any, handles: list) -> dict[int, tuple[tuple[int, int, int], ...]]:
    """Per card: (peer, NVLinks, common-ancestor level). Defensive: what the driver does not
    support is left out (no topology: every card looks alike, and choice falls back to indices)."""
    levels: dict[tuple[int, int], int] = {}
    for a in range(len(handles)):
        for b in range(a + 1, len(handles)):
            try:
                levels[(a, b)] = int(nvml.nvmlDeviceGetTopologyCommonAncestor(handles[a], handles[b]))
            except Exception:  # NVMLError_NotSupported on some platforms, old drivers
                pass
    nvlinks = _nvlinks(nvml, handles)
    out: dict[int, list] = {}
    for (a, b) in sorted(set(levels) | set(nvlinks)):
        level = levels.get((a, b), 50)
        out.setdefault(a, []).append((b, nvlinks.get((a, b), 0), level))
        out.setdefault(b, []).append((a, nvlinks.get((a, b), 0), level))
    return {i: tuple(v) for i, v in out.items()}


def _nvlinks(nvml: Any, handles: list) -> dict[tuple[int, int], int]:
    """Active NVLinks per pair of cards: direct links by the remote PCI bus id; links to an
    NVSwitch connect a card to every other switched card (counted as the smaller link count)."""
    try:
        bus = {_text(nvml.nvmlDeviceGetPciInfo(h).busId).lower(): i for i, h in enumerate(handles)}
    except Exception:
        return {}
    direct: dict[tuple[int, int], int] = {}
    switched: dict[int, int] = {}
    for i, h in enumerate(handles):
        for link in range(NVLINK_MAX_LINKS):
            try:
                if not nvml.nvmlDeviceGetNvLinkState(h, link):
                    continue
            except Exception:
                break  # no such link (or no NVLink at all)
            try:
                kind = nvml.nvmlDeviceGetNvLinkRemoteDeviceType(h, link)
            except Exception:
                kind = None  # older drivers: assume a GPU and look at the bus id
            if kind == NVLINK_REMOTE_SWITCH:
                switched[i] = switched.get(i, 0) + 1
                continue
            try:
                peer = bus.get(_text(nvml.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId).lower())
            except Exception:
                continue
            if peer is not None and peer > i:  # each link seen from both ends: count it once
                direct[(i, peer)] = direct.get((i, peer), 0) + 1
    for a in switched:
        for b in switched:
            if a < b:
                direct[(a, b)] = direct.get((a, b), 0) + min(switched[a], switched[b])
    return direct


def mps_available(sharing: Any) -> bool:
    return shutil.which(sharing.mps_control) is not None


def _sharing_mode(nvml: Any, handle: Any, gpu: GpuInfo, sharing: Any) -> GpuInfo:
    """isolation: mig when the card is in MIG mode, mps when the MPS control daemon can run,
    else none; shareable when the config offers the card and it is isolated (or that is allowed)."""
    isolation = "none"
    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(handle)
        if current == 1:
            isolation = "mig"
    except Exception:  # not a MIG-capable card
        pass
    if isolation == "none" and mps_available(sharing):
        isolation = "mps"
    layout = mig_devices(nvml, handle) if isolation == "mig" else ()
    # A MIG card takes shares on its instances (one job each), so only when it has some.
    offered = gpu.index in sharing.gpus and (isolation == "mps" or (isolation == "mig" and bool(layout))
                                             or (isolation == "none" and sharing.allow_unisolated))
    return replace(gpu, isolation=isolation, shareable=offered, mig=layout)


class _Memory:
    def __init__(self, total: int) -> None:
        self.total, self.free, self.used = total, total, 0


class _MigHandle:
    def __init__(self, card: int, slot: int, profile: str) -> None:
        self.card, self.slot, self.profile = card, slot, profile


class SimulatedNvml:
    """The subset of pynvml that `discover` uses, describing cfg.simulated's GPUs.

    Strings come back as str, like current nvidia-ml-py; UUIDs are deterministic per node.
    """

    class NVMLError(Exception):
        pass

    def __init__(self, node: str, count: int, model: str, memory_mb: int, nvlinks=(), levels=(),
                 default_level: int = 50, mig=(), mig_layout=()) -> None:
        self._node, self._count, self._model, self._memory_mb = node, count, model, memory_mb
        self._initialized = 0
        self._levels = {(min(a, b), max(a, b)): lvl for a, b, lvl in levels}
        self._default_level = default_level
        self._layout = {card: tuple(profiles) for card, profiles in mig_layout}
        self._mig = set(mig) | set(self._layout)
        # Links laid out as on a board: link slots numbered per card, each pointing at a peer.
        self._links: dict[int, list[int]] = {}
        for a, b, n in nvlinks:
            for _ in range(n):
                self._links.setdefault(a, []).append(b)
                self._links.setdefault(b, []).append(a)

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
        if isinstance(handle, _MigHandle):
            return f"MIG-sim-{self._node}-{handle.card}-{handle.slot}"
        return f"GPU-sim-{self._node}-{handle}"

    def nvmlDeviceGetName(self, handle: int) -> str:
        self._check()
        return f"{self._model} MIG {handle.profile}" if isinstance(handle, _MigHandle) else self._model

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> _Memory:
        self._check()
        if isinstance(handle, _MigHandle):
            return _Memory(mig_profile(handle.profile)[1] * 1024 * MIB)
        return _Memory(self._memory_mb * MIB)

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: int) -> int:
        self._check()
        if handle not in self._mig:
            raise self.NVMLError("Not Supported")
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: int, index: int) -> _MigHandle:
        self._check()
        layout = self._layout.get(handle, ())
        if index >= len(layout):
            raise self.NVMLError("Not Found")
        return _MigHandle(handle, index, layout[index])

    def nvmlDeviceGetTopologyCommonAncestor(self, a: int, b: int) -> int:
        self._check()
        if not self._levels:
            raise self.NVMLError("Not Supported")
        return self._levels.get((min(a, b), max(a, b)), self._default_level)

    def nvmlDeviceGetPciInfo(self, handle: int) -> "_Pci":
        self._check()
        return _Pci(handle)

    def nvmlDeviceGetNvLinkState(self, handle: int, link: int) -> int:
        self._check()
        if link >= len(self._links.get(handle, ())):
            raise self.NVMLError("Invalid Argument")
        return 1

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: int, link: int) -> int:
        self._check()
        return 0  # NVML_NVLINK_DEVICE_TYPE_GPU

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: int, link: int) -> "_Pci":
        self._check()
        return _Pci(self._links[handle][link])

    def nvmlDeviceGetMigMode(self, handle: int) -> tuple[int, int]:
        self._check()
        mode = 1 if handle in self._mig else 0
        return mode, mode


class _Pci:
    def __init__(self, index: int) -> None:
        self.busId = f"00000000:{0x18 + index:02X}:00.0"


def simulated_nvml(cfg: AgentConfig) -> SimulatedNvml:
    s = cfg.simulated
    return SimulatedNvml(cfg.name, s.count, s.model, s.memory_mb, s.nvlinks, s.levels, s.default_level, s.mig,
                         s.mig_layout)


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
        return "simulated", discover(simulated_nvml(cfg), cfg.sharing)
    try:
        nvml = _real_nvml()
        nvml.nvmlInit()
    except Exception as exc:  # GpuError, pynvml.NVMLError_LibraryNotFound, driver errors
        if cfg.gpu_backend == "nvml":
            raise GpuError(f"NVML is not usable on this node: {exc}") from None
        log.info("NVML not usable (%s); using %d simulated GPU(s)", exc, cfg.simulated.count)
        return "simulated", discover(simulated_nvml(cfg), cfg.sharing)
    try:
        return "nvml", discover(nvml, cfg.sharing)
    except Exception as exc:
        raise GpuError(f"NVML GPU discovery failed: {exc}") from None
    finally:
        nvml.nvmlShutdown()  # balances the probe's nvmlInit (NVML counts them)
