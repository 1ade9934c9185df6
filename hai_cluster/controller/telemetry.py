"""What the controller keeps of the agents' telemetry: recent samples per node (bounded), and a
rollup per job run (mean and max GPU utilization, peak GPU memory, energy, mean CPU) that is
written to the run's row periodically and when the run ends, so hacct shows it afterwards.

Batches are checked strictly before anything is kept: a batch that is not exactly what an agent
sends is dropped whole with one log line. No I/O here; the controller persists what `dirty_rows`
and `finish` return.
"""
from __future__ import annotations

import collections
import logging
import math
from dataclasses import dataclass, field, replace
from typing import Any, Iterable

from ..config import TelemetryConfig
from ..core.model import Snapshot

log = logging.getLogger(__name__)

WIRE_VERSION = 1
MAX_SAMPLES = 1000  # per batch (agents send at most 120)
MAX_GPUS = 64
MAX_RUNS = 1024
MAX_EVENTS = 1000
FINISHED_KEPT = 10000  # ended runs remembered, so a late sample cannot reopen a rollup
GAP_FACTOR = 3  # a sample later than this many intervals after the previous one follows a gap
RECENT = 256  # per live run: its samples' (time, GPU utilizations) not yet taken by the idle reclaimer

Key = tuple[int, int]  # (job id, attempt)


class BatchError(ValueError):
    pass


def _num(where: str, v: Any, lo: float = 0.0, hi: float = math.inf, *, none: bool = False,
         integer: bool = False) -> Any:
    if v is None and none:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (integer and not isinstance(v, int)):
        raise BatchError(f"{where} must be {'an integer' if integer else 'a number'}, got {type(v).__name__}")
    if not (lo <= v <= hi):  # also refuses NaN
        raise BatchError(f"{where} = {v!r} is out of range [{lo:g}, {hi:g}]")
    return v


def _map(where: str, v: Any, keys: tuple[str, ...]) -> dict:
    if not isinstance(v, dict):
        raise BatchError(f"{where} must be a map")
    if set(v) != set(keys):
        missing, extra = set(keys) - set(v), set(v) - set(keys)
        raise BatchError(f"{where}: " + "; ".join(
            ([f"missing {sorted(missing)}"] if missing else []) + ([f"unknown {sorted(map(str, extra))}"] if extra else [])))
    return v


def _list(where: str, v: Any, most: int) -> list:
    if not isinstance(v, list):
        raise BatchError(f"{where} must be a list")
    if len(v) > most:
        raise BatchError(f"{where} has {len(v)} entries, more than {most}")
    return v


GPU_KEYS = ("index", "util", "mem_used_mb", "mem_total_mb", "power_w", "temp_c", "sm_mhz", "ecc_corrected",
            "ecc_uncorrected")
RUN_KEYS = ("job_id", "attempt", "gpus", "gpu_mem_mb", "cpu_pct", "rss_mb", "pids")
EVENT_KEYS = ("t", "gpu", "kind", "value")
SAMPLE_KEYS = ("t", "gpus", "runs", "events", "cost_ms")
INT_MAX = 2 ** 63 - 1


def _gpu(where: str, g: Any) -> dict:
    g = _map(where, g, GPU_KEYS)
    _num(f"{where}.index", g["index"], 0, MAX_GPUS - 1, integer=True)
    _num(f"{where}.util", g["util"], 0, 100, none=True)
    for k in ("mem_used_mb", "mem_total_mb", "sm_mhz", "ecc_corrected", "ecc_uncorrected"):
        _num(f"{where}.{k}", g[k], 0, INT_MAX, none=True, integer=True)
    _num(f"{where}.power_w", g["power_w"], 0, 100_000, none=True)
    _num(f"{where}.temp_c", g["temp_c"], -100, 300, none=True)
    return g


def _run(where: str, r: Any) -> dict:
    r = _map(where, r, RUN_KEYS)
    for k in ("job_id", "attempt", "gpu_mem_mb", "rss_mb", "pids"):
        _num(f"{where}.{k}", r[k], 0, INT_MAX, integer=True)
    for i, g in enumerate(_list(f"{where}.gpus", r["gpus"], MAX_GPUS)):
        _num(f"{where}.gpus[{i}]", g, 0, MAX_GPUS - 1, integer=True)
    _num(f"{where}.cpu_pct", r["cpu_pct"], 0, 1e6, none=True)
    return r


def validate_batch(body: Any, node: str) -> tuple[float, list[dict]]:
    """(interval, samples) of a telemetry batch from `node`'s agent; BatchError if it is not one."""
    b = _map("batch", body, ("v", "node", "interval", "samples"))
    if b["v"] != WIRE_VERSION:
        raise BatchError(f"batch version {b['v']!r}, expected {WIRE_VERSION}")
    if b["node"] != node:
        raise BatchError(f"batch from node {b['node']!r} arrived on the link of node {node!r}")
    interval = float(_num("batch.interval", b["interval"], 1e-3, 86400))
    samples = _list("batch.samples", b["samples"], MAX_SAMPLES)
    for i, s in enumerate(samples):
        where = f"samples[{i}]"
        _map(where, s, SAMPLE_KEYS)
        _num(f"{where}.t", s["t"], 0, 1e11)
        _num(f"{where}.cost_ms", s["cost_ms"], 0, 1e9)
        gpus = [_gpu(f"{where}.gpus[{j}]", g) for j, g in enumerate(_list(f"{where}.gpus", s["gpus"], MAX_GPUS))]
        if len({g["index"] for g in gpus}) != len(gpus):
            raise BatchError(f"{where}.gpus lists a GPU twice")
        for j, r in enumerate(_list(f"{where}.runs", s["runs"], MAX_RUNS)):
            _run(f"{where}.runs[{j}]", r)
        for j, e in enumerate(_list(f"{where}.events", s["events"], MAX_EVENTS)):
            e = _map(f"{where}.events[{j}]", e, EVENT_KEYS)
            _num(f"{where}.events[{j}].t", e["t"], 0, 1e11)
            _num(f"{where}.events[{j}].gpu", e["gpu"], 0, MAX_GPUS - 1, none=True, integer=True)
            _num(f"{where}.events[{j}].value", e["value"], 0, INT_MAX, integer=True)
            if not isinstance(e["kind"], str) or not 0 < len(e["kind"]) <= 32:
                raise BatchError(f"{where}.events[{j}].kind must be a short string")
    return interval, samples


@dataclass
class Rollup:
    """Running sums over a run's samples (all its nodes)."""
    util_sum: float = 0.0
    util_n: int = 0
    util_max: float | None = None
    gpu_mem_max_mb: int | None = None
    energy_j: float = 0.0
    cpu_sum: float = 0.0
    cpu_n: int = 0
    samples: int = 0
    idle_since: float | None = None  # first sample of the current run of samples under the threshold
    last_t: float = 0.0
    last_util: float | None = None  # the latest sample's mean over the run's GPUs
    last_gpu_mem_mb: int | None = None
    last_cpu: float | None = None
    # (sample time, its GPUs' utilizations) for the idle reclaimer (controller/reclaim.py), which
    # takes them every pass; bounded: a reclaimer that is off never takes them
    recent: collections.deque = field(default_factory=lambda: collections.deque(maxlen=RECENT))

    def add(self, utils: list[float], power_w: float, dt: float, gpu_mem_mb: int | None, cpu: float | None,
            t: float, idle_below: float) -> None:
        self.samples += 1
        if utils:
            self.util_sum += sum(utils)
            self.util_n += len(utils)
            self.util_max = max(utils) if self.util_max is None else max(self.util_max, max(utils))
            self.last_util = sum(utils) / len(utils)
            self.recent.append((t, tuple(utils)))
            if idle_below > 0 and max(utils) < idle_below:
                self.idle_since = t if self.idle_since is None else self.idle_since
            else:
                self.idle_since = None
        self.energy_j += power_w * dt
        if gpu_mem_mb is not None:
            self.gpu_mem_max_mb = gpu_mem_mb if self.gpu_mem_max_mb is None else max(self.gpu_mem_max_mb, gpu_mem_mb)
            self.last_gpu_mem_mb = gpu_mem_mb
        if cpu is not None:
            self.cpu_sum += cpu
            self.cpu_n += 1
            self.last_cpu = cpu
        self.last_t = max(self.last_t, t)

    def row(self, key: Key) -> dict:
        return {"job_id": key[0], "attempt": key[1],
                "gpu_util_mean": round(self.util_sum / self.util_n, 2) if self.util_n else None,
                "gpu_util_max": self.util_max, "gpu_mem_max_mb": self.gpu_mem_max_mb,
                "energy_j": round(self.energy_j, 1), "cpu_mean": round(self.cpu_sum / self.cpu_n, 2) if self.cpu_n else None,
                "telemetry_samples": self.samples}

    def idle(self, idle_after: float) -> bool:
        return self.idle_since is not None and self.last_t - self.idle_since >= idle_after


class TelemetryHub:
    def __init__(self, cfg: TelemetryConfig) -> None:
        self.cfg = cfg
        self.samples: dict[str, collections.deque[dict]] = {}
        self.intervals: dict[str, float] = {}
        self.rollups: dict[Key, Rollup] = {}
        self._dirty: set[Key] = set()
        self._finished: collections.OrderedDict[Key, None] = collections.OrderedDict()
        self.events: collections.deque[dict] = collections.deque(maxlen=1000)  # XID/ECC, newest last
        self.received = self.dropped = 0

    # ---- ingestion ------------------------------------------------------------------------
    def ingest(self, node: str, body: Any) -> int:
        """Keep a batch; returns the samples taken. Garbage is dropped whole with a log line."""
        try:
            interval, samples = validate_batch(body, node)
        except BatchError as exc:
            self.dropped += 1
            log.warning("node %s: telemetry batch dropped: %s", node, exc)
            return 0
        ring = self.samples.setdefault(node, collections.deque(maxlen=self.cfg.history))
        self.intervals[node] = interval
        taken = 0
        for s in sorted(samples, key=lambda s: s["t"]):
            prev = ring[-1]["t"] if ring else None
            if prev is not None and s["t"] <= prev:
                continue  # sent twice, or out of order: already counted
            dt = interval if prev is None or s["t"] - prev > GAP_FACTOR * interval else s["t"] - prev
            self._account(node, s, dt)
            ring.append(s)
            taken += 1
        self.received += taken
        return taken

    def _account(self, node: str, s: dict, dt: float) -> None:
        gpus = {g["index"]: g for g in s["gpus"]}
        for e in s["events"]:
            self.events.append({**e, "node": node})
            log.warning("node %s GPU %s: %s event (%s)", node, e["gpu"], e["kind"], e["value"])
        for r in s["runs"]:
            key = (r["job_id"], r["attempt"])
            if key in self._finished:
                continue  # arrived after the run's end was recorded
            mine = [gpus[i] for i in r["gpus"] if i in gpus]
            utils = [float(g["util"]) for g in mine if g["util"] is not None]
            power = sum(g["power_w"] for g in mine if g["power_w"] is not None)
            # NVML's per-process list, or (where it lists none, e.g. some containers) its GPUs' memory:
            # a run's GPUs are its own.
            used = [g["mem_used_mb"] for g in mine if g["mem_used_mb"] is not None]
            mem = r["gpu_mem_mb"] or (sum(used) if used else None)
            self.rollups.setdefault(key, Rollup()).add(utils, power, dt, mem, r["cpu_pct"], s["t"],
                                                       self.cfg.idle_util_below)
            self._dirty.add(key)

    # ---- persistence ----------------------------------------------------------------------
    def dirty_rows(self) -> list[dict]:
        """Rollups that changed since the last call (the controller writes them to the store)."""
        rows = [self.rollups[k].row(k) for k in sorted(self._dirty) if k in self.rollups]
        self._dirty.clear()
        return rows

    def finish(self, key: Key) -> dict | None:
        """The run ended: its final rollup (None if no sample came), and no more samples for it."""
        self._finished[key] = None
        while len(self._finished) > FINISHED_KEPT:
            self._finished.popitem(last=False)
        self._dirty.discard(key)
        rollup = self.rollups.pop(key, None)
        return rollup.row(key) if rollup else None

    # ---- views ----------------------------------------------------------------------------
    def run_fields(self, key: Key) -> dict:
        """What hqueue and hstat show for a live run (merged into job rows: the names must not
        collide with job columns, e.g. gpu_mem_mb is a sharing job's request)."""
        r = self.rollups.get(key)
        if r is None:
            return {"gpu_util": None, "gpu_mem_used_mb": None, "cpu_pct": None, "idle": False}
        return {"gpu_util": None if r.last_util is None else round(r.last_util, 1), "gpu_mem_used_mb": r.last_gpu_mem_mb,
                "cpu_pct": r.last_cpu, "idle": self.is_idle(key), **{f"run_{k}": v for k, v in r.row(key).items()
                                                                   if k not in ("job_id", "attempt")}}

    def is_idle(self, key: Key) -> bool:
        r = self.rollups.get(key)
        return bool(self.cfg.idle_util_below > 0 and r is not None and r.idle(self.cfg.idle_after))

    def take_samples(self) -> dict[Key, list[tuple[float, tuple[float, ...]]]]:
        """Every live run's samples since the last call: (time, GPU utilizations), oldest first."""
        out = {}
        for key, r in self.rollups.items():
            if r.recent:
                out[key] = list(r.recent)
                r.recent.clear()
        return out

    def idle_jobs(self) -> set[int]:
        return {k[0] for k in self.rollups if self.is_idle(k)}

    def mark_idle(self, snapshot: Snapshot) -> Snapshot:
        """The snapshot with JobView.idle set for the runs flagged idle (what a policy may use)."""
        idle = self.idle_jobs()
        if not idle:
            return snapshot
        return replace(snapshot, jobs=tuple(replace(j, idle=True) if j.id in idle and j.state.holds_resources else j
                                            for j in snapshot.jobs))

    def latest(self, node: str) -> dict | None:
        ring = self.samples.get(node)
        return ring[-1] if ring else None

    def history(self, key: Key) -> list[dict]:
        """The run's points from the samples still kept: per node and time, its GPUs' mean
        utilization, GPU memory, power and CPU."""
        points = []
        for node, ring in self.samples.items():
            for s in ring:
                for r in s["runs"]:
                    if (r["job_id"], r["attempt"]) == key:
                        gpus = {g["index"]: g for g in s["gpus"]}
                        mine = [gpus[i] for i in r["gpus"] if i in gpus]
                        utils = [g["util"] for g in mine if g["util"] is not None]
                        points.append({"t": s["t"], "node": node,
                                       "gpu_util": round(sum(utils) / len(utils), 1) if utils else None,
                                       "gpu_mem_mb": r["gpu_mem_mb"] or sum(g["mem_used_mb"] or 0 for g in mine),
                                       "power_w": round(sum(g["power_w"] or 0 for g in mine), 1),
                                       "cpu_pct": r["cpu_pct"]})
        points.sort(key=lambda p: (p["t"], p["node"]))
        return points

    def nodes_view(self, nodes: Iterable[str]) -> dict[str, dict | None]:
        return {n: self.latest(n) for n in nodes}
