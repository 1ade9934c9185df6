"""Topology-aware card choice for whole-GPU jobs (HAMi's idea, on NVML's view of the links).

Each card lists its peers as (peer index, NVLink count, common-ancestor level). Levels are NVML's
nvmlGpuTopologyLevel_t: 0 same board, 10 single PCIe switch, 20 multiple switches, 30 host bridge,
40 same NUMA node, 50 across sockets. A pair's link score rises with NVLinks first, then with a
closer common ancestor. A 1-GPU job takes the free card that is worst linked to the other free
cards, so well-linked groups stay whole; a job of 2 or more GPUs takes the free group with the
highest sum of pair scores. Ties go to the lowest indices, so a node without topology data (or with
uniform links) gets exactly the lowest free indices, as before.
"""
from __future__ import annotations

from itertools import combinations
from math import comb

from .model import NodeView

MAX_LEVEL = 50
MAX_GROUPS = 5000  # beyond this many candidate groups, fall back to the lowest free indices


def link_score(nvlinks: int, level: int) -> int:
    return nvlinks * 100 + max(0, MAX_LEVEL - level) // 10


def pair_scores(node: NodeView) -> dict[tuple[int, int], int]:
    scores: dict[tuple[int, int], int] = {}
    for g in node.gpus:
        for peer, nvlinks, level in g.links:
            a, b = min(g.index, peer), max(g.index, peer)
            scores[(a, b)] = max(scores.get((a, b), 0), link_score(nvlinks, level))
    return scores


def choose_cards(node: NodeView, count: int) -> tuple[int, ...]:
    """`count` of node's free cards (which must have that many), per the rules above."""
    free = node.free_gpus
    if count <= 0:
        return ()
    if count >= len(free) or not node.linked:
        return free[:count]
    scores = pair_scores(node)

    def score(a: int, b: int) -> int:
        return scores.get((min(a, b), max(a, b)), 0)

    if count == 1:
        return (min(free, key=lambda c: (sum(score(c, o) for o in free if o != c), c)),)
    if comb(len(free), count) > MAX_GROUPS:
        return free[:count]
    best, best_score = free[:count], None
    for group in combinations(free, count):  # lexicographic: the first best has the lowest indices
        s = sum(score(a, b) for a, b in combinations(group, 2))
        if best_score is None or s > best_score:
            best, best_score = group, s
    return tuple(best)
