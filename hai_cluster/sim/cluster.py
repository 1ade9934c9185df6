"""The simulated cluster: N identical nodes of G GPUs, and how a trace job's GPU count maps to a gang.

A job asking for g <= G GPUs runs on one node. A bigger one spans ceil(g / G) whole nodes with the
GPUs split evenly; when g does not divide over those nodes each rank gets ceil(g / nodes), so the
job holds (and is charged for) slightly more than it asked (12 GPUs on 8-GPU nodes: 2 x 6 exactly;
9 GPUs: 2 x 5 = 10). Real traces ask for powers of two, where this never happens.

A job asking for a fraction of one card (0.25) gets a share of one card when the cluster shares
GPUs (`gpu_sharing`: every card takes shares, as with MPS), and a whole card otherwise.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ..core.model import GpuInfo, NodeView

_SPEC = re.compile(r"^\s*(\d+)\s*[xX]\s*(\d+)\s*$")
GPU_MEMORY_MB = 81920  # nominal; no policy here looks at it
NODE_CPUS = 4096  # CPUs and memory are never the bottleneck in a trace replay
NODE_MEM_MB = 1 << 24


@dataclass(frozen=True)
class Cluster:
    nodes: int
    gpus_per_node: int
    gpu_sharing: bool = False  # every card takes shares of fractional jobs

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def __str__(self) -> str:
        return f"{self.nodes}x{self.gpus_per_node}"

    def node_names(self) -> list[str]:
        width = max(2, len(str(self.nodes)))
        return [f"node{i + 1:0{width}d}" for i in range(self.nodes)]

    def node_views(self) -> list[NodeView]:
        return [NodeView(name=name, cpus=NODE_CPUS, mem_mb=NODE_MEM_MB,
                         gpus=tuple(GpuInfo(g, f"GPU-{name}-{g}", "sim", GPU_MEMORY_MB, shareable=self.gpu_sharing,
                                            isolation="mps" if self.gpu_sharing else "none")
                                    for g in range(self.gpus_per_node)))
                for name in self.node_names()]

    def shape(self, gpus: int | float) -> tuple[int, int]:
        """(nodes, GPUs per node) for a job asking for `gpus` GPUs (a share of a card: 0 whole GPUs)."""
        if gpus < 1:
            return 1, 0 if self.gpu_sharing else 1
        if gpus <= self.gpus_per_node:
            return 1, gpus
        n = math.ceil(gpus / self.gpus_per_node)
        return n, math.ceil(gpus / n)

    def can_run(self, gpus: int) -> bool:
        return self.shape(gpus)[0] <= self.nodes


def parse_cluster(text: str) -> Cluster:
    m = _SPEC.match(text or "")
    if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
        raise ValueError(f"bad cluster {text!r}: expected NODESxGPUS with both at least 1, e.g. 16x8")
    return Cluster(int(m.group(1)), int(m.group(2)))
