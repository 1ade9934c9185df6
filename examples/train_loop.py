#!/usr/bin/env python3
"""A pure-Python stand-in for a training loop that survives preemption (no dependencies beyond
hai_cluster.job). Run it under hai-cluster with train_loop.sh, or by hand:

    python3 examples/train_loop.py 200 0.05 20      # 200 steps of 0.05 s, a checkpoint every 20

"Training" is a running value updated once per step. Every executed step appends
"run=<restart count> step=<n>" to steps.log in the checkpoint dir, so anyone can check afterwards
that a preempted and resumed job lost no step and repeated none beyond its last checkpoint. The
state (step counter and running value) is saved every K steps and when the job is told to stop,
after which it exits 0; the next run resumes from it. The last line printed is
"done: steps=<N> value=<V> runs=<restart count + 1>".

Launched as several tasks (srun, $SLURM_PROCID), every rank runs the steps and rank 0 alone
writes the checkpoint and steps.log, as data-parallel training saves from one rank: the ranks
share the checkpoint dir, and two writers of one file would race.

Outside hai-cluster the checkpoint dir is ./checkpoints (or $TRAIN_LOOP_CKPT), and
`kill -TERM <pid>` plays the preemption.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from hai_cluster import job

MODULUS = 1_000_000_007


def update(value: int, step: int) -> int:
    """One step of "training": any deterministic function of the state will do."""
    return (value * 31 + step * step + 7) % MODULUS


def expected_value(steps: int) -> int:
    value = 0
    for step in range(1, steps + 1):
        value = update(value, step)
    return value


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("steps", type=int, help="total number of steps")
    p.add_argument("step_seconds", type=float, help="seconds each step takes (sleeps)")
    p.add_argument("every", type=int, help="checkpoint every K steps")
    args = p.parse_args(argv)

    job.install()  # first thing: from now on the preempt signal only sets a flag
    run = job.restart_count()
    rank = int(os.environ.get("SLURM_PROCID") or 0)
    writer = rank == 0
    ckpt = job.checkpoint_dir(fallback=os.environ.get("TRAIN_LOOP_CKPT", "checkpoints"))
    state = job.load_checkpoint("state.json", default={"step": 0, "value": 0}, directory=ckpt)
    print(f"run={run} job={job.job_id()} resuming after step {state['step']} (checkpoint dir {ckpt}, rank {rank})",
          flush=True)

    def save(why: str) -> None:
        if writer:
            job.save_checkpoint(state, "state.json", directory=ckpt)
            print(f"run={run} checkpoint at step {state['step']} ({why})", flush=True)

    with open(ckpt / "steps.log" if writer else os.devnull, "a") as log:
        for step in range(state["step"] + 1, args.steps + 1):
            time.sleep(args.step_seconds)  # the "work"
            state["value"] = update(state["value"], step)
            log.write(f"run={run} step={step}\n")
            log.flush()
            state["step"] = step
            if job.should_checkpoint():
                # the notice was written before the signal was sent: it is here to read
                save(f"told to stop: reason={job.reason()} preempted={job.preempted()} "
                     f"cancelled={job.cancelled()} deadline={job.deadline()}")
                print(f"run={run} leaving at step {step}"
                      + (": will be resumed" if job.preempted() else ""), flush=True)
                return 0
            if step % args.every == 0:
                save("periodic")
    if state["step"] % args.every != 0:
        save("final")
    print(f"done: steps={state['step']} value={state['value']} runs={run + 1}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
