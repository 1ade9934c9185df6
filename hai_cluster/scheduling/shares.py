"""Policy for card shares (fractional GPUs): which card and which nodes a sharing job gets, and
which best-effort runs to preempt for a guaranteed one. The accounting they read is core/sharing.py."""
from __future__ import annotations

from typing import Iterable

from ..core.model import GpuInfo, JobView, NodeView, Placement
from ..core.resources import fits
from ..core.sharing import CardUse, GpuShare, card_misfit, card_of, card_use, mig_instance


def card_score(share: GpuShare, card: GpuInfo, use: CardUse | None) -> float:
    """HAMi's score: (requested + used) / total, summed over memory and compute."""
    u = use or CardUse()
    return (share.mem_on(card) + u.mem_mb) / card.memory_mb + (share.reserved_compute + u.compute) / 100


def node_score(share: GpuShare, node: NodeView) -> float:
    """The same over the whole node (cards held whole count as full), with the request added once."""
    use = card_use(node)
    total_mem = sum(g.memory_mb for g in node.gpus) or 1
    mem = comp = 0
    for g in node.gpus:
        if g.index in use:
            mem, comp = mem + use[g.index].mem_mb, comp + use[g.index].compute
        elif g.index in node.used_gpus:
            mem, comp = mem + g.memory_mb, comp + 100
    shareable = [g for g in node.gpus if g.shareable]
    need = share.mem_on(shareable[0]) if shareable else 0
    return (mem + need) / total_mem + (comp + share.reserved_compute) / (100 * max(1, len(node.gpus)))


def choose_card(share: GpuShare, node: NodeView, pack: str) -> int | None:
    """The card of `node` that takes `share` under `pack` (ties: lowest index); None: none fits."""
    use = card_use(node)
    fitting = [g for g in node.gpus if g.shareable and card_misfit(share, g, node, use) is None]
    if not fitting:
        return None
    sign = -1 if pack == "binpack" else 1
    return min(fitting, key=lambda g: (sign * card_score(share, g, use.get(g.index)), g.index)).index


def place_shared(job: JobView, pool: Iterable[NodeView], pack: str) -> Placement | None:
    """One card share per rank, on job.nodes distinct nodes ordered by the node score."""
    share = job.gpu_share
    options = []
    for n in pool:
        if not fits(job, n):
            continue
        card = choose_card(share, n, pack)
        if card is not None:
            options.append((n, card))
    if len(options) < job.nodes:
        return None
    sign = -1 if pack == "binpack" else 1
    options.sort(key=lambda o: (sign * node_score(share, o[0]), o[0].name))
    chosen = sorted(options[:job.nodes], key=lambda o: o[0].name)
    amounts, instances = [], []
    for n, c in chosen:
        card = card_of(n, c)
        inst = mig_instance(share, card, n.mig_used) if card.isolation == "mig" else None
        amounts.append((inst[2], inst[3]) if inst else (share.mem_on(card), share.reserved_compute))
        instances.append(inst[0] if inst else "")
    return Placement(
        nodes=tuple(n.name for n, _ in chosen),
        gpus=tuple((c,) for _, c in chosen),
        shares=tuple(amounts),
        mig=tuple(instances) if any(instances) else (),
    )


def best_effort_room(job: JobView, node: NodeView, running: Iterable[JobView],
                     taken: set[int]) -> tuple[int, list[JobView]] | None:
    """For a guaranteed sharing job that does not fit on `node`: the card where preempting the
    fewest best-effort sharing runs (largest shares first) makes room, and those runs."""
    share = job.gpu_share
    if share is None or share.qos != "guaranteed":
        return None
    use = card_use(node)
    best: tuple[int, list[JobView]] | None = None
    for card in node.gpus:
        if card.mig:  # MIG instances isolate in hardware: no co-location to resolve
            continue
        if card.index not in use or card_misfit(share, card, node, use, ignore_usage=True):
            continue
        here = [v for v in running if v.id not in taken and v.preemptible and v.gpu_share is not None
                and v.gpu_share.qos == "best-effort" and (node.name, (card.index,)) in v.allocation]
        here.sort(key=lambda v: (-v.gpu_share.mem_on(card), v.id))
        u, chosen = use[card.index], []
        for v in here:
            if u.mem_mb + share.mem_on(card) <= card.memory_mb and u.compute + share.reserved_compute <= 100:
                break
            chosen.append(v)
            u = CardUse(u.mem_mb - v.gpu_share.mem_on(card), u.compute - v.gpu_share.reserved_compute, u.jobs - 1)
        fits_now = u.mem_mb + share.mem_on(card) <= card.memory_mb and u.compute + share.reserved_compute <= 100
        if chosen and fits_now and (best is None or len(chosen) < len(best[1])):
            best = (card.index, chosen)
    return best
