"""Fractional GPUs: a job's share of one card and per-card accounting (the packing policy that
uses them: scheduling/shares.py).

A sharing job asks for a fraction of one card (`--gpus-per-node=0.25`: a quarter of its memory and
compute) or for memory and compute directly (`--gpu-mem=8G --gpu-compute=30`). Each rank gets one
card, shared with other sharing jobs; a card holding a share is never given whole to another job,
and a card held whole is never shared. Memory is never overcommitted. Compute is reserved for
`guaranteed` and `burstable` jobs (the floor) and not for `best-effort` ones, which only use idle
compute and are the first preemption victims when a guaranteed job needs room on the card.

Packing (scheduling/shares.py) follows HAMi's score, (requested + used) / total per dimension (memory and compute):
binpack takes the highest score (fill cards, keep others empty for whole-GPU jobs), spread the
lowest. The same score, over all of a node's cards, orders nodes.

A card in MIG mode is shared by its instances (the admin's layout, part of the inventory): a
share goes whole onto the smallest free instance that holds its memory and reserved compute, one
job per instance, and is accounted on the card with the instance's memory and compute.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Iterable

from .model import GpuInfo, JobView, NodeView, Placement

QOS_CLASSES = ("guaranteed", "burstable", "best-effort")
PACK_MODES = ("binpack", "spread")


@dataclass(frozen=True)
class GpuShare:
    """What one rank of a sharing job asks of one card."""
    fraction: float | None = None  # of the card's memory and compute, 0 < fraction < 1
    mem_mb: int | None = None  # --gpu-mem; wins over the fraction's memory
    compute: int | None = None  # --gpu-compute, percent of the card's SMs; default: the fraction's
    qos: str = "guaranteed"

    def __post_init__(self) -> None:
        if self.fraction is None and self.mem_mb is None:
            raise ValueError("a GPU share needs a fraction or a memory size")
        if self.fraction is not None and not 0 < self.fraction < 1:
            raise ValueError(f"a GPU fraction must be above 0 and below 1, got {self.fraction}")
        if self.mem_mb is not None and self.mem_mb <= 0:
            raise ValueError("GPU memory of a share must be positive")
        if self.compute is not None and not 0 <= self.compute <= 100:
            raise ValueError(f"GPU compute must be a percentage (0-100), got {self.compute}")
        if self.qos not in QOS_CLASSES:
            raise ValueError(f"GPU QoS must be one of {', '.join(QOS_CLASSES)}, got {self.qos!r}")

    def mem_on(self, card: GpuInfo) -> int:
        """MiB of `card` this share holds."""
        if self.mem_mb is not None:
            return self.mem_mb
        return int(card.memory_mb * self.fraction)  # floor: never more than the fraction

    @property
    def compute_percent(self) -> int:
        """The compute the job may use (MPS thread percentage); 0: not limited."""
        if self.compute is not None:
            return self.compute
        return math.ceil(self.fraction * 100) if self.fraction is not None else 0

    @property
    def reserved_compute(self) -> int:
        """Compute counted against the card: none for best-effort jobs (idle compute only)."""
        return 0 if self.qos == "best-effort" else self.compute_percent

    def label(self, mem_mb: int | None = None) -> str:
        """gpu:0.25, gpu:0.25(20G) once a card is given, gpu:8G,30% for memory requests."""
        if self.fraction is not None and self.mem_mb is None:
            text = f"gpu:{self.fraction:g}"
            if mem_mb is not None:
                text += f"({_mem_text(mem_mb)})"
        else:
            text = f"gpu:{_mem_text(self.mem_mb)}"
            if self.compute is not None or self.fraction is not None:
                text += f",{self.compute_percent}%"
        return text if self.qos == "guaranteed" else f"{text}:{self.qos}"


def share_charge(share: GpuShare, card_memory_mb: int) -> float:
    """GPU-equivalents one rank of `share` is charged per second on a card of `card_memory_mb` MiB
    (attained service for the MLFQ, fair-share usage, hacct's GPU-hours): the larger of its memory
    fraction (the fraction asked, or its MiB over the card's) and its compute fraction."""
    mem = share.fraction if share.mem_mb is None else share.mem_mb / max(1, card_memory_mb)
    return min(1.0, max(mem, share.compute_percent / 100))


def _mem_text(mb: int) -> str:
    return f"{mb // 1024}G" if mb % 1024 == 0 else f"{mb}M"


def share_of(fraction: float | None, mem_mb: int | None, compute: int | None, qos: str | None) -> GpuShare | None:
    """The share a job's stored request fields describe (None: not a sharing job)."""
    if fraction is None and mem_mb is None:
        return None
    return GpuShare(fraction, mem_mb, compute, qos or "guaranteed")


def spec_share(spec) -> GpuShare | None:
    """The share a JobSpec asks for (None: whole GPUs)."""
    return share_of(spec.gpu_fraction, spec.gpu_mem_mb, spec.gpu_compute, spec.gpu_qos)


# ---- per-card accounting ----------------------------------------------------------------------

@dataclass(frozen=True)
class CardUse:
    mem_mb: int = 0
    compute: int = 0
    jobs: int = 0


def card_use(node: NodeView) -> dict[int, CardUse]:
    """Shares held on each card of `node` (cards without shares are absent)."""
    return {i: CardUse(m, c, n) for i, m, c, n in node.shared}


def _with_use(node: NodeView, use: dict[int, CardUse]) -> NodeView:
    live = {i: u for i, u in use.items() if u.jobs > 0}
    whole = node.used_gpus - {i for i, _m, _c, _n in node.shared}
    return replace(node, shared=tuple((i, u.mem_mb, u.compute, u.jobs) for i, u in sorted(live.items())),
                   used_gpus=whole | frozenset(live))


def add_share(node: NodeView, card: int, mem_mb: int, compute: int) -> NodeView:
    use = card_use(node)
    u = use.get(card, CardUse())
    use[card] = CardUse(u.mem_mb + mem_mb, u.compute + compute, u.jobs + 1)
    return _with_use(node, use)


def remove_share(node: NodeView, card: int, mem_mb: int, compute: int) -> NodeView:
    use = card_use(node)
    u = use.get(card)
    if u is None:
        return node
    use[card] = CardUse(max(0, u.mem_mb - mem_mb), max(0, u.compute - compute), u.jobs - 1)
    return _with_use(node, use)


MIG_SLICES = 7  # compute slices of a MIG-capable card (A100, H100, H200)
_MIG_PROFILE = re.compile(r"\b(\d)g\.(\d+)gb\b")


def mig_profile(text: str) -> tuple[int, int] | None:
    """(compute slices, GB) of a MIG profile, "3g.40gb" (also inside NVML's device name); None: none."""
    m = _MIG_PROFILE.search(text)
    return (int(m[1]), int(m[2])) if m and 0 < int(m[1]) <= MIG_SLICES else None


def mig_compute(slices: int) -> int:
    """Percent of the card's compute that `slices` of its MIG_SLICES are (rounded down)."""
    return slices * 100 // MIG_SLICES


def mig_instance(share: GpuShare, card: GpuInfo, taken: frozenset[str] | set[str] = frozenset()):
    """The smallest instance of `card`'s MIG layout, not in `taken`, that holds `share`: its
    memory and reserved compute (ties: the layout's order). None: none."""
    need = share.mem_on(card)
    free = [(m[2], m[3], k, m) for k, m in enumerate(card.mig)
            if m[0] not in taken and m[2] >= need and m[3] >= share.reserved_compute]
    return min(free)[3] if free else None


def _mig_misfit(share: GpuShare, card: GpuInfo, node: NodeView, use: dict[int, CardUse] | None,
                ignore_usage: bool) -> str | None:
    if mig_instance(share, card) is None:
        return f"GPU {card.index} has no MIG instance that holds {share.label()}"
    if ignore_usage:
        return None
    if card.index in node.used_gpus and card.index not in (use if use is not None else card_use(node)):
        return f"GPU {card.index} is in use"
    if mig_instance(share, card, node.mig_used) is None:
        return f"GPU {card.index} has no free MIG instance that holds {share.label()}"
    return None


def card_misfit(share: GpuShare, card: GpuInfo, node: NodeView, use: dict[int, CardUse] | None = None,
                *, ignore_usage: bool = False) -> str | None:
    """Why `share` cannot go on `card` (None: it can)."""
    if not card.shareable:
        return f"GPU {card.index} is not shared"
    if card.isolation == "mig":
        return _mig_misfit(share, card, node, use, ignore_usage)
    need = share.mem_on(card)
    if need > card.memory_mb:
        return f"GPU {card.index} has {card.memory_mb} MiB, the share needs {need}"
    if ignore_usage:
        return None
    u = (use if use is not None else card_use(node)).get(card.index)
    if u is None:
        return f"GPU {card.index} is in use" if card.index in node.used_gpus else None
    if u.mem_mb + need > card.memory_mb:
        return f"GPU {card.index} has {card.memory_mb - u.mem_mb} MiB unshared"
    if u.compute + share.reserved_compute > 100:
        return f"GPU {card.index} has {100 - u.compute}% compute unreserved"
    return None


def share_misfit(share: GpuShare, node: NodeView, *, ignore_usage: bool = False) -> str | None:
    """Why no card of `node` can take `share` (None: one can)."""
    shareable = [g for g in node.gpus if g.shareable]
    if not shareable:
        return f"{node.name} has no shared GPUs"
    use = card_use(node)
    reasons = [card_misfit(share, g, node, use, ignore_usage=ignore_usage) for g in shareable]
    if all(reasons):
        return f"{node.name}: " + "; ".join(r for r in reasons if r)
    return None


def card_of(node: NodeView, index: int) -> GpuInfo:
    return next(g for g in node.gpus if g.index == index)


def reserve_shares(placement: Placement, nodes: dict[str, NodeView]) -> None:
    for rank, (name, gpus, (mem, comp)) in enumerate(zip(placement.nodes, placement.gpus, placement.shares)):
        n = add_share(nodes[name], gpus[0], mem, comp)
        if placement.mig and placement.mig[rank]:
            n = replace(n, mig_used=n.mig_used | {placement.mig[rank]})
        nodes[name] = n


def release_share(job: JobView, node_name: str, gpus: Iterable[int], nodes: dict[str, NodeView]) -> None:
    n = nodes[node_name]
    gpus = tuple(gpus)
    ranks = [r for r, held in enumerate(job.allocation) if held == (node_name, gpus)]
    inst = job.mig[ranks[0]] if ranks and ranks[0] < len(job.mig) else ""
    for i in gpus:
        if not any(g.index == i for g in n.gpus):
            continue
        card = card_of(n, i)
        layout = {m[0]: m for m in card.mig}
        if inst in layout:  # a MIG instance: accounted with its own memory and compute
            n = replace(remove_share(n, i, layout[inst][2], layout[inst][3]), mig_used=n.mig_used - {inst})
        else:
            n = remove_share(n, i, job.gpu_share.mem_on(card), job.gpu_share.reserved_compute)
    nodes[node_name] = n
