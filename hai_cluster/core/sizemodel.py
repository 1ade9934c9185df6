"""What the cluster has learned about job sizes from its own finished jobs: the learned state of
the MLFQ's Gittins order (scheduling/gittins.py). Pure data and pure functions, no I/O.

Nobody tells the scheduler how long a job will run (a time limit is a cap, not an estimate). What
it can know is how long the jobs that already *finished* here ran: their service, in seconds on
their GPUs (attained GPU-seconds / GPUs, restart redo included, which is what a running job's
age counts too). `SizeModel` keeps a histogram of those on fixed log-spaced bins, one per key:

    "*"                   every job
    "g8"                  jobs of 8 GPUs ("share" for card shares)
    "g8/u:alice"          jobs of 8 GPUs of that user
    "g8/n:resnet50"       jobs of 8 GPUs of that job name

A key's weights decay by (1 - 1/memory) at each sample it gets, so a key holds at most `memory`
samples' worth and follows a drifting workload; at most `max_keys` keys are kept (the least
recently fed go first). The state is bounded whatever the history: max_keys x len(EDGES) + 1
numbers.

Interface (for the controller, the store and `hcontrol show scheduler`):

    FinishedJob(gpus, service_s, user="", name="")   one ended job's facts (service_s > 0)
    observe(model, facts) -> SizeModel                 pure; facts in the order the jobs ended
    rebuild(facts) -> SizeModel                        observe(SizeModel(), facts): the state is a
                                                       function of the ordered facts, so a lost
                                                       state is rebuilt from accounting, identically
    model.to_wire() -> dict / SizeModel.from_wire(d)   plain data (JSON or msgpack), exact round trip
    model.distribution(gpus, user, name) -> Dist       the blended histogram the scheduler uses

Feed it every job that ended after it ran (completed, failed, cancelled, timed out: a job's size is
what it ran), in the order of their ends (ties by job id), once each. The snapshot carries the
model (`Snapshot.sizes`); an empty one makes the order attained-service (LAS) like Tiresias'.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

# Bin i holds service in [EDGES[i-1], EDGES[i]) seconds (bin 0 from 0, the last one to infinity):
# a factor of sqrt(2) per bin, 10 s to ~1.5 years.
EDGES: tuple[float, ...] = tuple(10.0 * 2 ** (i / 2) for i in range(45))
NBINS = len(EDGES) + 1
# Where a bin's mass is taken to sit: its geometric middle (half of 10 s for the first).
POINTS: tuple[float, ...] = (5.0,) + tuple(math.sqrt(EDGES[i - 1] * EDGES[i]) for i in range(1, len(EDGES))) \
    + (EDGES[-1] * 1.2,)
LOWER: tuple[float, ...] = (0.0,) + EDGES  # each bin's lower edge
WIRE_VERSION = 1


def bin_of(seconds: float) -> int:
    """The bin of a service time (seconds)."""
    if seconds < EDGES[0]:
        return 0
    i = min(NBINS - 1, int(2 * math.log2(seconds / EDGES[0])) + 1)
    # Float rounding at an edge: settle on the bin whose range holds the value.
    while i < NBINS - 1 and seconds >= EDGES[i]:
        i += 1
    while i > 0 and seconds < EDGES[i - 1]:
        i -= 1
    return min(i, NBINS - 1)


def gpu_key(gpus: float) -> str:
    if 0 < gpus < 1:
        return "share"
    return f"g{int(gpus)}"


@dataclass(frozen=True)
class FinishedJob:
    """One ended job, as accounting knows it: its GPUs, its service (seconds on those GPUs,
    all runs), and its user and name where the cluster has them."""
    gpus: float
    service_s: float
    user: str = ""
    name: str = ""


@dataclass(frozen=True)
class Hist:
    weights: tuple[float, ...]  # per bin, decayed
    last: int  # the model's sample count when it was last fed (eviction order)

    @property
    def total(self) -> float:
        return sum(self.weights)


@dataclass(frozen=True)
class Dist:
    """A blended distribution over the bins: probabilities, and how many samples stand behind it."""
    probs: tuple[float, ...]
    samples: float  # weight of real samples in the closest key (0: prior only)
    source: str  # the most specific key that had samples ("prior" when none)


@dataclass(frozen=True)
class SizeModel:
    hists: Mapping[str, Hist] = field(default_factory=dict)
    seen: int = 0  # samples observed in all
    memory: float = 1000.0  # a key's weights decay by 1 - 1/memory per sample it gets
    max_keys: int = 512
    # Pseudo-samples with which a key's parent is blended into it (shrinkage: a key with few
    # samples says little, and its parent's shape fills in).
    prior_weight: float = 4.0
    # The per-pass memo of blended distributions (not state: rebuilt on demand, never compared).
    _memo: dict = field(default_factory=dict, compare=False, repr=False, hash=False)

    def __post_init__(self) -> None:
        if self.memory < 1 or self.max_keys < 4 or self.prior_weight <= 0:
            raise ValueError("size model: memory >= 1, max_keys >= 4 and prior_weight > 0 are required")

    @property
    def empty(self) -> bool:
        return not self.hists

    # ---- wire ------------------------------------------------------------------------------
    def to_wire(self) -> dict[str, Any]:
        return {"version": WIRE_VERSION, "seen": self.seen, "memory": self.memory, "max_keys": self.max_keys,
                "prior_weight": self.prior_weight, "edges": [EDGES[0], len(EDGES)],
                "hists": {k: {"last": h.last, "w": list(h.weights)} for k, h in sorted(self.hists.items())}}

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> "SizeModel":
        if d.get("version") != WIRE_VERSION or list(d.get("edges", ())) != [EDGES[0], len(EDGES)]:
            raise ValueError(f"size model: unknown wire version or bins {d.get('version')!r} {d.get('edges')!r}")
        hists = {}
        for k, h in dict(d["hists"]).items():
            w = tuple(float(x) for x in h["w"])
            if len(w) != NBINS or any(x < 0 or x != x for x in w):
                raise ValueError(f"size model: bad histogram for {k!r}")
            hists[str(k)] = Hist(w, int(h["last"]))
        return cls(hists=hists, seen=int(d["seen"]), memory=float(d["memory"]), max_keys=int(d["max_keys"]),
                   prior_weight=float(d["prior_weight"]))

    # ---- reading ---------------------------------------------------------------------------
    def distribution(self, gpus: float, user: str = "", name: str = "") -> Dist:
        """The service distribution of a job of this many GPUs (and user, name): each key in the
        chain * -> gN -> gN/u:user -> gN/n:name blended with its parent's by prior_weight
        pseudo-samples, from a log-uniform prior at the root (no data: attained-service order)."""
        memo_key = ("dist", gpus, user, name)
        got = self._memo.get(memo_key)
        if got is not None:
            return got
        g = gpu_key(gpus)
        chain = ["*", g] + ([f"{g}/u:{user}"] if user else []) + ([f"{g}/n:{name}"] if name else [])
        probs = [1.0 / NBINS] * NBINS
        samples, source = 0.0, "prior"
        for key in chain:
            h = self.hists.get(key)
            if h is None:
                continue
            total = h.total
            if total <= 0:
                continue
            k = self.prior_weight
            probs = [(w + k * p) / (total + k) for w, p in zip(h.weights, probs)]
            samples, source = total, key
        dist = Dist(tuple(probs), samples, source)
        if len(self._memo) > 65536:  # bounded like the state (it holds the scheduler's tables too)
            self._memo.clear()
        self._memo[memo_key] = dist
        return dist


def keys_of(fact: FinishedJob) -> list[str]:
    g = gpu_key(fact.gpus)
    return ["*", g] + ([f"{g}/u:{fact.user}"] if fact.user else []) + ([f"{g}/n:{fact.name}"] if fact.name else [])


def observe(model: SizeModel, facts: Iterable[FinishedJob]) -> SizeModel:
    """The model after these jobs ended (in that order). Pure: the input model is not changed."""
    hists = dict(model.hists)
    seen = model.seen
    decay = 1.0 - 1.0 / model.memory
    changed = False
    for fact in facts:
        if not (fact.service_s > 0) or not (fact.gpus > 0) or math.isinf(fact.service_s):
            continue  # never ran (or nonsense): it says nothing about sizes
        seen += 1
        b = bin_of(fact.service_s)
        for key in keys_of(fact):
            old = hists.get(key)
            w = [x * decay for x in old.weights] if old is not None else [0.0] * NBINS
            w[b] += 1.0
            hists[key] = Hist(tuple(w), seen)
        changed = True
    if not changed:
        return model
    if len(hists) > model.max_keys:
        # Drop the least recently fed keys, never the root nor a GPU-count key.
        keep = sorted(hists, key=lambda k: (k == "*" or "/" not in k, hists[k].last, k), reverse=True)
        hists = {k: hists[k] for k in keep[:model.max_keys]}
    return SizeModel(hists=hists, seen=seen, memory=model.memory, max_keys=model.max_keys,
                     prior_weight=model.prior_weight)


def rebuild(facts: Iterable[FinishedJob], **settings: Any) -> SizeModel:
    """The model from nothing, from the ended jobs in the order they ended (accounting)."""
    return observe(SizeModel(**settings), facts)
