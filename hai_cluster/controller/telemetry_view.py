"""The telemetry replies of the API (hstat, hinfo --gpus) and the Prometheus page: the hub's
samples joined with the store's nodes, GPUs and live runs. Pure shaping, no I/O."""
from __future__ import annotations

from typing import Iterable, Mapping, Sequence

from ..core.model import NodeView
from ..store.repository import RankRef
from .telemetry import TelemetryHub

READING_KEYS = ("util", "mem_used_mb", "mem_total_mb", "power_w", "temp_c", "sm_mhz", "ecc_corrected",
                "ecc_uncorrected")


def gpu_rows(hub: TelemetryHub, view: NodeView, holders: Mapping[tuple[str, int], int]) -> list[dict]:
    latest = hub.latest(view.name)
    readings = {g["index"]: g for g in latest["gpus"]} if latest else {}
    rows = []
    for g in view.gpus:
        r = readings.get(g.index, {})
        rows.append({"index": g.index, "name": g.name, "memory_mb": g.memory_mb,
                     "job_id": holders.get((view.name, g.index)), **{k: r.get(k) for k in READING_KEYS}})
    return rows


def holders_of(ranks: Iterable[RankRef]) -> dict[tuple[str, int], int]:
    return {(r.node, g): r.job_id for r in ranks for g in r.gpus}


def nodes_telemetry(hub: TelemetryHub, node_rows: Sequence[dict], views: Sequence[NodeView],
                    ranks: Sequence[RankRef], jobs: list[dict], connected: Mapping[str, bool]) -> dict:
    by_name = {v.name: v for v in views}
    holders = holders_of(ranks)
    nodes = []
    for n in node_rows:
        latest = hub.latest(n["name"])
        view = by_name.get(n["name"])
        nodes.append({"name": n["name"], "state": n["state"], "responding": n["responding"],
                      "connected": connected.get(n["name"], False), "gpu_backend": n["gpu_backend"],
                      "cpus": n["cpus"], "sample_t": latest["t"] if latest else None,
                      "sample_cost_ms": latest["cost_ms"] if latest else None,
                      "interval": hub.intervals.get(n["name"]),
                      "gpus": gpu_rows(hub, view, holders) if view else []})
    return {"nodes": nodes, "jobs": jobs, "events": list(hub.events)[-20:]}


def job_telemetry(hub: TelemetryHub, job: dict, runs: list[dict]) -> dict:
    """One job: its runs with their stored rollups, and the latest run's recent history."""
    attempt = runs[-1]["attempt"] if runs else None
    history = hub.history((job["id"], attempt)) if attempt is not None else []
    return {"job": job, "runs": runs, "history": history}
