"""A lab's Lightning use, unmodified (lightning_fabric from PyPI): each task of an srun step, run by
tests/e2e/test_lightning.py inside a 2-node job. Each mode prints one line, `MODE {json}`.

- ranks: what Lightning's SLURMEnvironment reads from the task's SLURM_* variables.
- fit: a tiny DDP training on CPU (gloo), the cluster environment chosen by Fabric itself; each
  rank trains on its own batches, so equal weights at the end mean the gradients were averaged.
- expect (no srun): the same training in one process, the two ranks' gradients averaged by hand.
"""
from __future__ import annotations

import json
import os
import sys

STEPS, FEATURES, BATCH, LR = 5, 4, 8, 0.1


def ranks() -> dict:
    from lightning_fabric.plugins.environments import SLURMEnvironment
    env = SLURMEnvironment()
    return {"detect": SLURMEnvironment.detect(), "global_rank": env.global_rank(), "local_rank": env.local_rank(),
            "world_size": env.world_size(), "node_rank": env.node_rank(), "main_address": env.main_address,
            "main_port": env.main_port, "job_id": SLURMEnvironment.job_id(), "node": os.environ["SLURMD_NODENAME"]}


def batch(rank: int, step: int):
    import torch
    g = torch.Generator().manual_seed(1000 * rank + step)
    x = torch.randn(BATCH, FEATURES, generator=g, dtype=torch.float64)
    return x, x.sum(dim=1, keepdim=True) * 0.5 + 1.0


def model():
    import torch
    torch.manual_seed(0)
    return torch.nn.Linear(FEATURES, 1, dtype=torch.float64)


def fit() -> dict:
    import torch
    from lightning_fabric import Fabric
    fabric = Fabric(accelerator="cpu", strategy="ddp", devices=1, num_nodes=2)
    fabric.launch()  # the processes are srun's: SLURMEnvironment creates none
    net = model()
    optimizer = torch.optim.SGD(net.parameters(), lr=LR)
    net, optimizer = fabric.setup(net, optimizer)
    for step in range(STEPS):
        x, y = batch(fabric.global_rank, step)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(net(x), y)
        fabric.backward(loss)
        optimizer.step()
    weights = [round(float(v), 9) for p in net.parameters() for v in p.detach().flatten()]
    return {"rank": fabric.global_rank, "world_size": fabric.world_size, "node_rank": fabric.node_rank,
            "environment": type(fabric.strategy.cluster_environment).__name__,
            "backend": torch.distributed.get_backend(), "weights": weights}


def expect() -> dict:
    import torch
    net = model()
    optimizer = torch.optim.SGD(net.parameters(), lr=LR)
    for step in range(STEPS):
        optimizer.zero_grad()
        for rank in (0, 1):  # DDP's average of the two ranks' gradients
            x, y = batch(rank, step)
            (torch.nn.functional.mse_loss(net(x), y) / 2).backward()
        optimizer.step()
    return {"weights": [round(float(v), 9) for p in net.parameters() for v in p.detach().flatten()]}


if __name__ == "__main__":
    mode = sys.argv[1]
    print(mode, json.dumps({"ranks": ranks, "fit": fit, "expect": expect}[mode]()), flush=True)
