#!/usr/bin/env python3
"""A tiny PyTorch training job (CPU is enough) that checkpoints when preempted and resumes exactly:
an interrupted-and-resumed run ends with the same weights and the same loss, bit for bit, as one
that was never interrupted. Run it under hai-cluster with torch_train.sh, or by hand:

    python3 examples/torch_train.py 300 0.01 50     # 300 steps of >= 0.01 s, a checkpoint every 50

What makes the resume exact:
- everything that changes during training is in the checkpoint: model weights, optimizer state
  (Adam's moments and step counts) and the step counter;
- each step's minibatch comes from a generator seeded with (seed, step), not from a global RNG
  whose state would also have to be saved;
- one CPU thread and deterministic algorithms, so the arithmetic is the same in every run.

The checkpoint is written with torch.save through hai_cluster.job.atomic_write (a preemption or a
crash mid-save leaves the previous checkpoint intact). Every step appends "run=<restart count>
step=<n> loss=<loss>" to steps.log in the checkpoint dir. The last line printed is
"done: steps=<N> loss=<repr of the last loss> params=<sha256 of the weights> runs=<n>".
"""
from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time

from hai_cluster import job

job.install()  # before `import torch` (seconds): a preemption meanwhile is not lost

import torch  # noqa: E402

SEED = 1234
SAMPLES, FEATURES, HIDDEN, BATCH = 512, 16, 32, 32
CKPT = "model.pt"


def make_data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(SEED)
    x = torch.randn(SAMPLES, FEATURES, generator=g)
    w = torch.randn(FEATURES, 1, generator=g)
    y = torch.sin(x @ w) + 0.1 * torch.randn(SAMPLES, 1, generator=g)
    return x, y


def make_model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(SEED)
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.Tanh(),
                                torch.nn.Linear(HIDDEN, 1))
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def batch_indices(step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(SEED * 1_000_003 + step)
    return torch.randint(0, SAMPLES, (BATCH,), generator=g)


def params_digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        # the raw bytes through torch alone: numpy is not among the job's packages
        h.update(bytes(t.detach().cpu().contiguous().view(-1).view(torch.uint8).tolist()))
    return h.hexdigest()[:16]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("steps", type=int, help="total number of steps")
    p.add_argument("step_seconds", type=float, help="extra seconds each step takes (sleeps)")
    p.add_argument("every", type=int, help="checkpoint every K steps")
    args = p.parse_args(argv)

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    run = job.restart_count()
    ckpt_dir = job.checkpoint_dir(fallback=os.environ.get("TORCH_TRAIN_CKPT", "checkpoints"))
    path = ckpt_dir / CKPT
    x, y = make_data()
    model, opt = make_model()
    step = 0
    if path.exists():
        state = torch.load(path, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        step = state["step"]
    print(f"run={run} job={job.job_id()} resuming after step {step} (checkpoint {path})", flush=True)

    def save(why: str) -> None:
        state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}
        job.atomic_write(path, lambda f: torch.save(state, f))
        print(f"run={run} checkpoint at step {step} ({why})", flush=True)

    loss_value = float("nan")
    with open(ckpt_dir / "steps.log", "a") as log:
        while step < args.steps:
            idx = batch_indices(step + 1)
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            loss_value = loss.item()
            if args.step_seconds > 0:
                time.sleep(args.step_seconds)
            step += 1
            log.write(f"run={run} step={step} loss={loss_value!r}\n")
            log.flush()
            if job.should_checkpoint():
                save(f"told to stop: reason={job.reason()}")
                return 0
            if step % args.every == 0:
                save("periodic")
    if step % args.every != 0:
        save("final")
    with torch.no_grad():
        full = torch.nn.functional.mse_loss(model(x), y).item()
    print(f"done: steps={step} loss={full!r} params={params_digest(model)} runs={run + 1}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
