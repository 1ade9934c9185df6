"""Does a request fit on a node? `fits()` answers for the policy's placement; `placement_misfit()`
checks a whole placement with it, for the controller's applier and the simulator alike."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping, Sequence

from .model import JobView, NodeView, Placement
from .reservation import reservation_misfit
from .sharing import CardUse, add_share, card_misfit, card_use, share_misfit


@dataclass(frozen=True)
class Fit:
    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


_FITS = Fit(True)  # the common answer, built once (frozen, so it can be shared)


def fits(job: JobView, node: NodeView, *, ignore_usage: bool = False) -> Fit:
    """Whether one rank of `job` fits on `node` now (or on an empty node with ignore_usage)."""
    if job.partition and node.partitions and not any(p in node.partitions for p in job.partitions):
        return Fit(False, f"{node.name} is not in partition {job.partition}")
    if job.constrained and (why := _node_choice_misfit(job, node)):
        return Fit(False, why)
    if len(node.gpus) < job.gpus_per_node:
        return Fit(False, f"{node.name} has {len(node.gpus)} GPUs, job needs {job.gpus_per_node}")
    if node.cpus < job.cpus_per_node:
        return Fit(False, f"{node.name} has {node.cpus} CPUs, job needs {job.cpus_per_node}")
    if job.mem_mb and node.mem_mb < job.mem_mb:
        return Fit(False, f"{node.name} has {node.mem_mb} MiB memory, job needs {job.mem_mb}")
    if job.runtime == "container":
        if node.container_runtime not in node.runtimes:
            return Fit(False, f"{node.name} has no container runtime")
    elif job.runtime and job.runtime not in node.runtimes:
        return Fit(False, f"{node.name} has no {job.runtime} runtime")
    if job.gpu_share is not None and (why := share_misfit(job.gpu_share, node, ignore_usage=True)):
        return Fit(False, why)
    if (node.reservation is not None or node.free_for is not None or job.reservation is not None) \
            and (why := reservation_misfit(job, node)):  # not usage: it holds for an empty node too
        return Fit(False, why)
    if ignore_usage:
        return _FITS
    if not node.schedulable:
        why = "not responding" if not node.responding else node.state
        return Fit(False, f"{node.name} is {why}")
    if len(node.free_gpus) < job.gpus_per_node:
        return Fit(False, f"{node.name} has {len(node.free_gpus)} of {len(node.gpus)} GPUs free")
    if node.cpus - node.used_cpus < job.cpus_per_node:
        return Fit(False, f"{node.name} has {node.cpus - node.used_cpus} free CPUs")
    if job.mem_mb and node.mem_mb - node.used_mem_mb < job.mem_mb:
        return Fit(False, f"{node.name} has {node.mem_mb - node.used_mem_mb} MiB free memory")
    if job.gpu_share is not None and (why := share_misfit(job.gpu_share, node)):
        return Fit(False, why)
    if job.exclusive and (node.used_gpus or node.used_cpus or node.used_mem_mb or node.shared):
        return Fit(False, f"{node.name} is in use (--exclusive takes only idle nodes)")
    return _FITS


def _node_choice_misfit(job: JobView, node: NodeView) -> str | None:
    """-x names the node, -w names all the job's nodes and not this one, or -C asks features it lacks."""
    if node.name in job.excluded_nodes:
        return f"{node.name} is excluded (-x)"
    if job.required_nodes and len(job.required_nodes) >= job.nodes and node.name not in job.required_nodes:
        return f"{node.name} is not in the job's -w list"
    if job.constraint is not None and not job.constraint.node_ok(node.features):
        return f"{node.name} does not have the features {job.constraint.text}"
    return None


def unknown_features(job: JobView, nodes: Sequence[NodeView]) -> list[str]:
    """The features -C names that no node declares (Slurm: "Invalid feature specification")."""
    if job.constraint is None:
        return []
    have = frozenset().union(*(n.features for n in nodes))
    return sorted(job.constraint.names - have)


def node_set_ok(job: JobView, nodes: Sequence[NodeView]) -> bool:
    """Whether these nodes, each fitting one rank, meet -C's set-wide parts ([a|b], counts)."""
    c = job.constraint
    return c is None or not c.set_wide or c.choose(nodes, len(nodes), _features) is not None


def choose_nodes(job: JobView, ordered: Sequence[NodeView]) -> list[NodeView] | None:
    """The first job.nodes of `ordered` (each fitting one rank) that meet -C's set-wide parts."""
    c = job.constraint
    if c is None or not c.set_wide:
        return list(ordered[:job.nodes]) if len(ordered) >= job.nodes else None
    return c.choose(ordered, job.nodes, _features)


def _features(node: NodeView) -> frozenset[str]:
    return node.features


def could_ever_fit(job: JobView, nodes: tuple[NodeView, ...]) -> Fit:
    """Whether the cluster, empty, could run the job at all (else the submission is refused). A
    reservation is checked apart (the submission's): its window is not part of the answer."""
    if job.reservation is not None:
        job = replace(job, reservation=None)
    missing = sorted(set(job.required_nodes) - {n.name for n in nodes})
    if missing and nodes:
        return Fit(False, f"Invalid node name specified: -w names {', '.join(missing[:8])}, which this cluster "
                          f"does not have")
    candidates = [n for n in nodes if fits(job, n, ignore_usage=True)]
    if len(candidates) >= job.nodes and choose_nodes(job, candidates) is not None:
        return Fit(True)
    if job.constraint is not None and len(candidates) >= job.nodes:
        return Fit(False, f"no {job.nodes} node(s) meet --constraint={job.constraint.text} together")
    if not nodes:
        return Fit(False, "the cluster has no nodes")
    best = max(len(n.gpus) for n in nodes)
    short = _short_resources(job, nodes)
    if short and job.gpu_share is None:
        return Fit(False, f"{'; '.join(short)}: {job.nodes} node(s) with {job.gpus_per_node} GPUs, "
                          f"{job.cpus_per_node} CPUs{f', {job.mem_mb} MiB' if job.mem_mb else ''} each are needed")
    if job.gpu_share is not None:
        return Fit(False, f"{job.nodes} node(s) with a shared GPU that can take {job.gpu_share.label()} are "
                          f"needed; {len(candidates)} node(s) qualify")
    return Fit(False, f"{job.nodes} node(s) with {job.gpus_per_node} GPUs, {job.cpus_per_node} CPUs"
                      f"{f', {job.mem_mb} MiB' if job.mem_mb else ''}"
                      f"{f', the {job.runtime} runtime' if job.runtime else ''}"
                      f"{f', the features {job.constraint.text}' if job.constraint else ''} each are needed; "
                      f"{len(candidates)} node(s) qualify (largest node has {best} GPUs)")


def _short_resources(job: JobView, nodes: tuple[NodeView, ...]) -> list[str]:
    """What no node of the job's partitions has enough of, named ("no node has 64 CPUs (the
    largest has 48)"): an impossible request says which resource is short."""
    pool = [n for n in nodes if not (job.partitions and n.partitions and not set(job.partitions) & set(n.partitions))]
    if not pool:
        return [f"no node is in partition {job.partition}"]
    short = []
    for what, need, have in (("GPUs", job.gpus_per_node, max(len(n.gpus) for n in pool)),
                             ("CPUs", job.cpus_per_node, max(n.cpus for n in pool)),
                             ("MiB of memory", job.mem_mb or 0, max(n.mem_mb for n in pool))):
        if need > have:
            short.append(f"no node has {need} {what} (the largest has {have})")
    return short


def why_waiting(job: JobView, nodes: Sequence[NodeView], shown: int = 8) -> str:
    """What keeps `job` from starting on the nodes as they are now, node by node, with fits()'s
    reasons (hcontrol show job: "node3 has 2 of 4 GPUs free; node4 is drain"). Nodes outside the
    job's partitions are counted, not listed."""
    outside = [n for n in nodes if job.partitions and n.partitions and not set(job.partitions) & set(n.partitions)]
    refused, free = [], []
    for n in sorted((n for n in nodes if n not in outside), key=lambda n: n.name):
        fit = fits(job, n)
        (free if fit else refused).append(n.name if fit else fit.reason)
    parts = refused[:shown] + ([f"{len(refused) - shown} more node(s) refuse it"] if len(refused) > shown else [])
    if free:
        parts.append(f"{len(free)} node(s) can take a rank now ({', '.join(free[:shown])}"
                     f"{', ...' if len(free) > shown else ''}); it needs {job.nodes}")
    if outside:
        parts.append(f"{len(outside)} node(s) outside partition {job.partition}")
    return "; ".join(parts) or "the cluster has no nodes"


def placement_misfit(job: JobView, placement: Placement, nodes: Mapping[str, NodeView]) -> str | None:
    """Why `placement` cannot start `job` on `nodes` as they are now (None: it can).

    Each rank is checked with fits() and then for the very GPUs (or card share, or MIG instance)
    it was given. Ranks go on distinct nodes (-N counts nodes)."""
    if len(placement.nodes) != job.nodes or len(placement.gpus) != job.nodes:
        return f"the placement has {len(placement.nodes)} rank(s), job {job.id} has {job.nodes}"
    if len(set(placement.nodes)) != len(placement.nodes):
        return f"the placement puts two ranks of job {job.id} on one node"
    if placement.shares and len(placement.shares) != job.nodes:
        return f"the placement gives {len(placement.shares)} card share(s) to {job.nodes} rank(s)"
    views = dict(nodes)
    for rank, (name, gpu_ids) in enumerate(zip(placement.nodes, placement.gpus)):
        node = views.get(name)
        if node is None:
            return f"{name} is not a node"
        fit = fits(job, node)
        if not fit:
            return fit.reason
        mig = placement.mig[rank] if placement.mig else ""
        why = (_share_misfit(job, node, gpu_ids, placement.shares[rank], mig) if placement.shares
               else _gpus_misfit(job, node, gpu_ids))
        if why:
            return why
        views[name] = _with_rank(job, node, gpu_ids, placement.shares[rank] if placement.shares else None, mig)
    if job.constraint is not None and not node_set_ok(job, [nodes[n] for n in placement.nodes]):
        return f"the nodes {','.join(placement.nodes)} do not meet --constraint={job.constraint.text} together"
    return None


def take(job: JobView, placement: Placement, nodes: dict[str, NodeView]) -> None:
    """Count `placement` of `job` as held in `nodes` (the applier's views, start after start)."""
    for rank, (name, gpu_ids) in enumerate(zip(placement.nodes, placement.gpus)):
        nodes[name] = _with_rank(job, nodes[name], gpu_ids, placement.shares[rank] if placement.shares else None,
                                 placement.mig[rank] if placement.mig else "")


def _gpus_misfit(job: JobView, node: NodeView, gpu_ids) -> str | None:
    if job.gpu_share is not None:
        return f"job {job.id} shares a GPU; the placement gives it whole GPUs"
    want = len(node.gpus) if job.exclusive else job.gpus_per_node  # --exclusive: every GPU of the node
    if len(gpu_ids) != want or len(set(gpu_ids)) != len(gpu_ids):
        return f"{node.name}: GPUs {list(gpu_ids)} given, job {job.id} needs {want} distinct ones"
    known = {g.index for g in node.gpus}
    if not known.issuperset(gpu_ids):
        return f"{node.name} has no GPU {sorted(set(gpu_ids) - known)[0]}"
    if taken := sorted(node.used_gpus.intersection(gpu_ids)):
        return f"{node.name}: GPU {taken[0]} is in use"
    return None


def _share_misfit(job: JobView, node: NodeView, gpu_ids, share: tuple[int, int], mig: str) -> str | None:
    """One rank's card share: the card takes shares, and the share (the amounts the placement
    gives, a MIG instance's own for MIG) stays within it with what it holds already."""
    if job.gpu_share is None or len(gpu_ids) != 1:
        return f"{node.name}: a card share needs one GPU, got {list(gpu_ids)}"
    card = next((g for g in node.gpus if g.index == gpu_ids[0]), None)
    if card is None:
        return f"{node.name} has no GPU {gpu_ids[0]}"
    if why := card_misfit(job.gpu_share, card, node):
        return f"{node.name}: {why}"
    if card.isolation == "mig" or mig:
        layout = {m[0]: m for m in card.mig}
        if mig not in layout or (layout[mig][2], layout[mig][3]) != tuple(share):
            return f"{node.name}: GPU {card.index} has no MIG instance {mig!r} of that size"
        if mig in node.mig_used:
            return f"{node.name}: MIG instance {mig} is in use"
        return None
    mem, compute = share
    used = card_use(node).get(card.index, CardUse())
    if used.mem_mb + mem > card.memory_mb or used.compute + compute > 100:
        return f"{node.name}: GPU {card.index} cannot take {mem} MiB and {compute}% more"
    return None


def _with_rank(job: JobView, node: NodeView, gpu_ids, share: tuple[int, int] | None, mig: str) -> NodeView:
    """`node` with one more rank of `job` on it."""
    node = replace(node, used_cpus=node.used_cpus + job.rank_cpus(node.cpus),
                   used_mem_mb=node.used_mem_mb + (job.mem_mb or 0))
    if share is None:
        return replace(node, used_gpus=node.used_gpus | frozenset(gpu_ids))
    node = add_share(node, gpu_ids[0], *share)
    return replace(node, mig_used=node.mig_used | {mig}) if mig else node
