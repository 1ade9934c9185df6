"""The MLFQ's settings ([scheduler] in controller.toml, `-o mlfq.KEY=VALUE` in hai-sim): one
frozen dataclass, checked when made (config.controller turns its errors into config errors)."""
from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass

from .gittins import RankSettings


@dataclass(frozen=True)
class MlfqConfig:
    # GPU-seconds of attained service at which a job leaves level i for level i+1.
    thresholds: tuple[float, ...] = (3600.0, 36000.0)
    # Seconds a run keeps its GPUs at level i before it may be preempted (one per level).
    quanta: tuple[float, ...] = (600.0, 1800.0, 3600.0)
    # Starvation guard (Tiresias' knob): a pending job that waited more than factor x its run time
    # (and more than the floor) counts as level 0 again; 0 turns it off. Off by default, as in
    # Tiresias: on the ElasticFlow traces it adds preemption cascades and costs mean JCT while p99
    # stays well under FIFO's without it (docs/BENCHMARKS.md).
    starvation_factor: float = 0.0
    starvation_floor: float = 3600.0
    # A starving job waiting longer than this holds a reservation on the nodes it needs, so that a
    # stream of small jobs cannot take them (one reservation per partition at a time).
    reservation_after: float = 7200.0
    placement: str = "binpack"  # binpack | spread
    # Among the runs a job may preempt, take those whose GPUs sit idle (JobView.idle, from the
    # controller's telemetry) first, whatever their level.
    prefer_idle_victims: bool = False
    gpu_pack: str = "binpack"  # [gpu_sharing] pack: binpack | spread, for card shares (core.sharing)
    # What sets a job's level: "gittins" (the default), its Gittins rank under the size distribution
    # the cluster learned from its finished jobs (Snapshot.sizes; scheduling/gittins.py), levels
    # `level_ratio` apart; or "las", its attained GPU-seconds against `thresholds` (Tiresias'
    # 2D-LAS), with `quanta`. "gittins" is ahead of "las" on mean JCT on 7 of the 8 real traces
    # measured (2 % behind on a saturated Philly VC; docs/BENCHMARKS.md). Its time slices follow
    # restart_cost: a run keeps its GPUs for min_run_restarts restart costs, so a cluster (or a demo)
    # whose checkpoints take a second time-slices within seconds.
    order: str = "gittins"
    # Seconds of work a preempted job redoes when it resumes (checkpoint, restart, lost progress):
    # the price preemption weighs against its gain. hai-sim sets it to the replay's restart cost.
    restart_cost: float = 30.0
    level_ratio: float = 4.0  # chosen on ElasticFlow cluster02, checked on six Philly VCs (docs/BENCHMARKS.md)
    # gittins: a run is preempted only for a job at least this many levels above it.
    preempt_margin: int = 1
    # gittins: a run keeps its GPUs for at least this many restart costs before it may be preempted
    # (so that at most 1/min_run_restarts of a time slice goes to redoing work) ...
    min_run_restarts: float = 10.0
    # ... and is never preempted while it is at least this likely to end within `finish_window`
    # restart costs (its preemption would cost more than waiting for it).
    finish_likely: float = 0.5
    finish_window: float = 2.0
    # gittins: a job whose time in the system passed max_slowdown x its service so far (at least
    # slowdown_floor seconds of it) is overdue: pending, it is served as level 0; running, it is not
    # preempted but by an urgent job. This bounds how far the Gittins order (which puts the longest
    # jobs last) may stretch a long job, the tail latency FIFO bounds by arrival order. 0: off.
    max_slowdown: float = 0.0
    slowdown_floor: float = 3600.0
    # At most this many runs are told to leave in one pass (a job's victims are never split); the
    # jobs that would preempt after that wait for the next pass (the controller's next tick; the
    # simulator decides again at once after a plan that preempted). It bounds the checkpoints one
    # tick sets off on the agents and the time decide() takes when a burst of arrivals outranks
    # thousands of runs at once (docs/BENCHMARKS.md). 0: no bound.
    max_preemptions: int = 256
    # gittins: a job whose time in the system passed lift_factor x the service that 90 % of its
    # kind need (as the cluster learned it; at least lift_floor seconds) is old: pending, it goes first (old jobs
    # in submit order) and may preempt runs that are not old; running, it is preempted by no
    # one but an urgent job. Each job turns old once and then runs to its end, so this bounds
    # the tail (the Gittins order puts the longest jobs last) without preemption cascades, at a
    # price in mean JCT that no factor tried made worth paying on every trace (docs/BENCHMARKS.md):
    # off (0) by default, for a cluster that values its tail more.
    lift_factor: float = 0.0
    lift_floor: float = 3600.0

    def __post_init__(self) -> None:
        if list(self.thresholds) != sorted(self.thresholds) or any(t <= 0 for t in self.thresholds):
            raise ValueError("mlfq thresholds must be positive and increasing")
        if len(self.quanta) != len(self.thresholds) + 1:
            raise ValueError(f"mlfq needs one quantum per level: {len(self.thresholds) + 1} levels, "
                             f"{len(self.quanta)} quanta")
        if any(q < 0 for q in self.quanta):
            raise ValueError("mlfq quanta must not be negative")
        if self.starvation_factor < 0 or self.starvation_floor < 0 or self.reservation_after < 0:
            raise ValueError("mlfq starvation_factor, starvation_floor and reservation_after must not be negative")
        if self.placement not in ("binpack", "spread"):
            raise ValueError(f"mlfq placement must be binpack or spread, got {self.placement!r}")
        if self.gpu_pack not in ("binpack", "spread"):
            raise ValueError(f"gpu_sharing pack must be binpack or spread, got {self.gpu_pack!r}")
        if self.order not in ("gittins", "las"):
            raise ValueError(f"mlfq order must be gittins or las, got {self.order!r}")
        if self.level_ratio <= 1:
            raise ValueError(f"mlfq level_ratio must be > 1, got {self.level_ratio!r}")
        if self.preempt_margin < 1:
            raise ValueError(f"mlfq preempt_margin must be >= 1 (levels), got {self.preempt_margin!r}")
        if not 0 < self.finish_likely <= 1:
            raise ValueError(f"mlfq finish_likely must be a probability in (0, 1] (1: off), got {self.finish_likely!r}")
        for key in ("restart_cost", "level_ratio", "min_run_restarts", "finish_window"):
            if not math.isfinite(getattr(self, key)):  # (nan passes every comparison)
                raise ValueError(f"mlfq {key} must be a finite number, got {getattr(self, key)!r}")
        for key in ("restart_cost", "min_run_restarts", "finish_window", "max_slowdown", "slowdown_floor",
                    "max_preemptions", "lift_factor", "lift_floor"):
            if getattr(self, key) < 0:
                raise ValueError(f"mlfq {key} must not be negative, got {getattr(self, key)!r}")

    @property
    def levels(self) -> int:
        return RankSettings().levels if self.order == "gittins" else len(self.quanta)

    @property
    def rank_settings(self) -> RankSettings:
        return RankSettings(level_ratio=self.level_ratio)

    def level_of(self, attained: float) -> int:
        # The first i with attained < thresholds[i] (the thresholds are increasing), in C.
        return bisect_right(self.thresholds, attained)
