#!/usr/bin/env python3
"""Run the agent's telemetry sampler on this machine's real GPUs (NVML) and print what it reads.

  .venv/bin/python scripts/check_nvml_telemetry.py [--samples 5] [--interval 1]

For a node being brought up, and for recording the sampler's behaviour on real hardware: every
reading the GPUs support, which ones they do not (null), whether XID/ECC event sets work, and what
one sample costs. Exits 1 when NVML is not usable here."""
from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hai_cluster.agent.telemetry import Sampler  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", type=int, default=5)
    p.add_argument("--interval", type=float, default=1.0)
    args = p.parse_args()
    try:
        import pynvml
        sampler = Sampler(pynvml, socket.gethostname(), args.interval, args.samples)
        sampler.open()
    except Exception as exc:
        print(f"NVML is not usable here: {exc}", file=sys.stderr)
        return 1
    try:
        print(f"driver {pynvml.nvmlSystemGetDriverVersion()}, NVML {pynvml.nvmlSystemGetNVMLVersion()}, "
              f"{len(sampler.handles)} GPU(s), event thread: {'yes' if sampler._event_thread else 'no'}")
        costs = []
        for i in range(args.samples):
            s = sampler.sample([])
            costs.append(s["cost_ms"])
            if i == args.samples - 1:
                print(json.dumps(s, indent=1))
            time.sleep(args.interval)
        print(f"sample cost: median {statistics.median(costs):.2f} ms, max {max(costs):.2f} ms "
              f"over {len(costs)} samples")
    finally:
        sampler.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
