"""Run every (policy x sweep point) replay of one trace, reusing what cannot differ.

A run that preempted nothing never paid a restart, so its result is the same at any restart
cost: it is computed once per load scale and reused across a restart-cost sweep (not the MLFQ's,
which is told the restart cost and may decide otherwise at another).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

from ..core.reservation import Reservation
from ..scheduling.registry import make_policy
from .cluster import Cluster
from .engine import SimResult, simulate
from .traces import TraceJob, prepare

SWEEP_KEYS = {"restart-cost": "restart_cost", "restart-cost-per-gpu": "restart_cost_per_gpu",
              "load-scale": "load_scale"}


@dataclass(frozen=True)
class Point:
    """One setting of the knobs a run depends on besides the policy."""
    restart_cost: float = 30.0
    restart_cost_per_gpu: float = 0.0
    load_scale: float = 1.0

    def label(self, swept: Sequence[str]) -> str:
        short = {"restart_cost": "rc", "restart_cost_per_gpu": "rc/gpu", "load_scale": "load"}
        return " ".join(f"{short[k]}={getattr(self, k):g}" for k in swept)


@dataclass(frozen=True)
class Run:
    policy: str
    point: Point
    label: str  # the policy, plus the swept knobs when there is a sweep
    result: SimResult
    reused: bool = False  # copied from a run at another restart cost (it preempted nothing)


def parse_sweep(specs: Sequence[str]) -> dict[str, list[float]]:
    """["restart-cost=0,30,60"] -> {"restart_cost": [0.0, 30.0, 60.0]}."""
    out: dict[str, list[float]] = {}
    for spec in specs:
        key, sep, values = spec.partition("=")
        field = SWEEP_KEYS.get(key.strip())
        if not sep or field is None:
            raise ValueError(f"bad --sweep {spec!r}: expected KEY=V1,V2,... with KEY one of {', '.join(SWEEP_KEYS)}")
        try:
            out[field] = [float(v) for v in values.split(",") if v.strip()]
        except ValueError:
            raise ValueError(f"bad --sweep {spec!r}: values must be numbers") from None
        if not out[field]:
            raise ValueError(f"bad --sweep {spec!r}: no values")
    return out


def points(base: Point, sweep: dict[str, list[float]]) -> list[Point]:
    keys = list(sweep)
    return [replace(base, **dict(zip(keys, combo))) for combo in itertools.product(*(sweep[k] for k in keys))]


def _policy_options(name: str, opts: dict[str, Any], pt: Point) -> dict[str, Any]:
    """The MLFQ weighs preemption against the restart cost: it is told the replay's, as an operator
    sets [scheduler] restart_cost for the cluster, unless -o mlfq.restart_cost says otherwise."""
    if name != "mlfq" or "restart_cost" in opts:
        return opts
    cost = pt.restart_cost + pt.restart_cost_per_gpu  # per-GPU redo: counted for one GPU (a floor)
    if "config" in opts:
        return {**opts, "config": replace(opts["config"], restart_cost=cost)}
    return {**opts, "restart_cost": cost}


def run_all(jobs: Sequence[TraceJob], cluster: Cluster, policies: Sequence[str], pts: Sequence[Point], *,
            swept: Sequence[str] = (), options: dict[str, dict[str, Any]] | None = None,
            progress: Callable[[str, int, int], None] | None = None,
            reservations: Sequence[Reservation] = (), known_sizes: bool = False) -> list[Run]:
    """All runs, sweep point by sweep point. `jobs` are in submit order and all fit the cluster;
    known_sizes: simulate's (the size model is the trace's own from the start)."""
    options = options or {}
    runs: list[Run] = []
    calm: dict[tuple, SimResult] = {}  # (policy, load scale) -> a run with no preemption
    scaled: dict[float, list[TraceJob]] = {}
    for pt in pts:
        if pt.load_scale not in scaled:
            scaled[pt.load_scale] = prepare(jobs, load_scale=pt.load_scale)
        for name in policies:
            label = f"{name} {pt.label(swept)}".strip()
            key = (name, pt.load_scale)
            if key in calm:
                res = replace(calm[key], restart_cost=pt.restart_cost, restart_cost_per_gpu=pt.restart_cost_per_gpu)
                runs.append(Run(name, pt, label, res, reused=True))
                if progress is not None:
                    progress(label, len(res.records), len(res.records))
                continue
            res = simulate(make_policy(name, **_policy_options(name, options.get(name, {}), pt)), scaled[pt.load_scale],
                           cluster,
                           restart_cost=pt.restart_cost, restart_cost_per_gpu=pt.restart_cost_per_gpu,
                           progress=None if progress is None else (lambda d, t, lb=label: progress(lb, d, t)),
                           reservations=reservations, known_sizes=known_sizes)
            told_cost = name == "mlfq" and "restart_cost" not in options.get(name, {})
            if res.preemptions == 0 and not told_cost:
                calm[key] = res  # (not a policy told the restart cost: it may act otherwise at another)
            runs.append(Run(name, pt, label, res))
    return runs
