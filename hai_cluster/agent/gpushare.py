"""Fractional GPUs on the node: the environment a sharing run gets, and the MPS daemons behind it.

The scheduler gave the run one card (spec.gpus) and a share of it (spec.gpu_share). The card's
isolation, as the inventory found it, decides the enforcement:
- mps: the card's MPS control daemon for the job's user is started (agent.mps), and the job gets
  CUDA_MPS_PIPE_DIRECTORY, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT (its memory share) and, for
  guaranteed jobs, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE (its compute share). Burstable jobs get no
  compute cap (their share is a floor the scheduler keeps free); best-effort jobs run at MPS's
  lower client priority.
- none: time-slicing only; the card is offered for sharing only when [sharing] allow_unisolated.
- mig: the scheduler gave the run one instance of the card's MIG layout (spec.gpu_share["mig"]);
  the job sees that instance alone (CUDA_VISIBLE_DEVICES=MIG-...), isolated in hardware, no MPS.
Every other sharing run sees its card by UUID in CUDA_VISIBLE_DEVICES, and HAI_GPU_SHARE_MB /
HAI_GPU_SHARE_COMPUTE / HAI_GPU_ISOLATION say what it was given.
"""
from __future__ import annotations

import logging
import os
from dataclasses import replace
from typing import Iterable

from ..config import AgentConfig
from ..core.model import GpuInfo
from ..core.sharing import GpuShare
from .mps import MpsControl, MpsError
from ..protocol.runspec import RunSpec

log = logging.getLogger(__name__)

# Every variable prepare() sets: an ssh session adopted into the job gets them too (adopt.ENV_KEYS),
# or its CUDA would reach the card outside the job's MPS daemon and limits.
SHARE_ENV = ("CUDA_VISIBLE_DEVICES", "HAI_GPU_SHARE_MB", "HAI_GPU_SHARE_COMPUTE", "HAI_GPU_ISOLATION", "HAI_GPU_QOS",
             "HAI_GPU_MIG_PROFILE", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY",
             "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "CUDA_MPS_CLIENT_PRIORITY")


class ShareError(Exception):
    pass


class Shares:
    def __init__(self, cfg: AgentConfig, gpus: Iterable[GpuInfo]) -> None:
        self.cards = {g.index: g for g in gpus}
        run_dir = cfg.sharing.run_dir or os.path.join(cfg.spool, "mps")
        self.mps = MpsControl(cfg.sharing.mps_control, run_dir)

    def prepare(self, spec: RunSpec) -> RunSpec:
        """The spec with the share's environment added (unchanged for whole-GPU runs)."""
        if spec.gpu_share is None:
            return spec
        instance = spec.gpu_share.get("mig") or ""
        share = GpuShare(**{k: v for k, v in spec.gpu_share.items() if k != "mig"})
        if len(spec.gpus) != 1 or spec.gpus[0] not in self.cards:
            raise ShareError(f"a GPU share needs one GPU of this node, got {list(spec.gpus)}")
        card = self.cards[spec.gpus[0]]
        if not card.shareable:
            raise ShareError(f"GPU {card.index} is not offered for sharing on this node")
        env = dict(spec.environment)
        if card.isolation == "mig" or instance:
            return replace(spec, environment={**env, **self._mig_env(card, instance, share)})
        mem = share.mem_on(card)
        env.update(CUDA_VISIBLE_DEVICES=card.uuid, HAI_GPU_SHARE_MB=str(mem),
                   HAI_GPU_SHARE_COMPUTE=str(share.compute_percent), HAI_GPU_ISOLATION=card.isolation,
                   HAI_GPU_QOS=share.qos)
        if card.isolation == "mps":
            try:
                pipe = self.mps.ensure(card.index, card.uuid, spec.uid, spec.gid)
            except (MpsError, OSError) as exc:
                raise ShareError(str(exc)) from None
            env["CUDA_MPS_PIPE_DIRECTORY"] = str(pipe)
            env["CUDA_MPS_LOG_DIRECTORY"] = str(self.mps.dirs(card.index, spec.uid)[1])
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={mem}M"  # the job sees one device: ordinal 0
            if share.qos == "guaranteed" and share.compute_percent:
                env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(share.compute_percent)
            if share.qos == "best-effort":
                env["CUDA_MPS_CLIENT_PRIORITY"] = "1"  # below normal
        return replace(spec, environment=env)

    @staticmethod
    def _mig_env(card: GpuInfo, instance: str, share: GpuShare) -> dict[str, str]:
        """A MIG instance of the card's layout, as the job sees it."""
        layout = {m[0]: m for m in card.mig}
        if card.isolation != "mig" or instance not in layout:
            raise ShareError(f"GPU {card.index} has no MIG instance {instance or '(none given)'}")
        _uuid, profile, mem, compute = layout[instance]
        return {"CUDA_VISIBLE_DEVICES": instance, "HAI_GPU_SHARE_MB": str(mem), "HAI_GPU_SHARE_COMPUTE": str(compute),
                "HAI_GPU_ISOLATION": "mig", "HAI_GPU_MIG_PROFILE": profile, "HAI_GPU_QOS": share.qos}

    def any_daemon(self) -> bool:
        """Whether an MPS daemon may be left to stop: without one, release_idle has nothing to do
        (the agent skips its hop to a thread, once per burst of ends)."""
        try:
            with os.scandir(self.mps.run_dir) as entries:
                return any(True for _ in entries)
        except OSError:
            return False

    @property
    def prepared(self) -> int:
        """How many sharing runs got their MPS daemon so far (what release_idle is given)."""
        return self.mps.ensured

    def release_idle(self, live: Iterable[RunSpec], prepared_before: int) -> None:
        """Stop the MPS daemons that no live sharing run uses any more. `live` are the specs of
        the agent's unended runs, taken when `prepared` read `prepared_before`; a run registers
        before it is prepared, so a newer prepare means `live` may miss a user: then nothing is
        stopped (MpsControl checks that under the lock of its starts; the next run's end tries
        again)."""
        wanted = {(s.gpus[0], s.uid) for s in live if s.gpu_share is not None and s.gpus}
        if not self.mps.run_dir.is_dir():
            return
        for entry in self.mps.run_dir.iterdir():
            name, _, uid = entry.name.partition("-")
            if not (name.startswith("gpu") and name[3:].isdigit() and uid.isdigit()):
                continue
            card, uid_n = int(name[3:]), int(uid)
            if (card, uid_n) in wanted or card not in self.cards or not self.mps.running(card, uid_n):
                continue
            try:
                gid = self.mps.owner_gid(card, uid_n)
                if gid is not None:
                    self.mps.quit(card, self.cards[card].uuid, uid_n, gid, unless_ensured_since=prepared_before)
            except (OSError, MpsError) as exc:
                log.warning("MPS daemon on GPU %d for uid %d: %s", card, uid_n, exc)
