"""The Gittins order of jobs from the learned size distribution (core/sizemodel.py), and the
readable account of it (`explain`).

A job that has received `a` seconds of service on its g GPUs, whose total service D follows the
learned distribution of its kind, has the Gittins rank

    rank(a) = g x min over D' > a of  E[min(D, D') - a | D > a] / P(D <= D' | D > a)

in GPU-seconds: the least GPU-time it is expected to take per completion, serving it up to some
point D'. Serving the lowest rank first minimizes mean completion time for a known distribution
(Gittins; Scully et al.'s SOAP analysis); on a decreasing-hazard distribution it is
least-attained-service (Tiresias' 2D-LAS), and where the hazard rises (most jobs of a kind end
near some length) it keeps a job that is about to end ahead of fresh ones. The distribution is the
cluster's own (no job tells its duration); with no data it is a log-uniform prior, whose rank grows
with the service received: attained-service order.

The rank is computed per age bin (the model's bins, a factor sqrt(2) apart) at the bin's lower
edge, as a table per distribution, kept with the model across passes. Levels are the rank on a
log scale (`level_ratio` apart from `base_rank` GPU-seconds), so the MLFQ's machinery (queues by
level, victims of a lower level) runs on them unchanged.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..core.model import JobView
from ..core.sizemodel import EDGES, LOWER, NBINS, POINTS, Dist, SizeModel, bin_of

INF = math.inf
_NEDGES = len(EDGES)


def _prefix(probs: tuple[float, ...]) -> tuple[list[float], list[float]]:
    c0, c1 = [0.0], [0.0]  # prefix sums of p and of p x point
    for p, x in zip(probs, POINTS):
        c0.append(c0[-1] + p)
        c1.append(c1[-1] + p * x)
    return c0, c1


def rank_row(probs: tuple[float, ...], s: int, prefix=None) -> float:
    """The Gittins rank per GPU (seconds) of a job whose age is at the lower edge of bin s: the
    least, over the bin edges D' above it, of E[min(D, D') - age] / P(D <= D'), given D > age."""
    c0, c1 = prefix or _prefix(probs)
    lo, total = LOWER[s], c0[-1]
    a0, a1 = c0[s], c1[s]
    best = INF
    # Serving up to the upper edge of bin j (j >= s): the mass of bins s..j ends, the rest
    # (above EDGES[j]) is served EDGES[j] - lo and goes on.
    for j in range(s, NBINS):
        den = c0[j + 1] - a0
        if den <= 0:
            continue
        num = (c1[j + 1] - a1) - lo * den
        if j < NBINS - 1:
            num += (total - c0[j + 1]) * (EDGES[j] - lo)
        value = num / den
        if value < best:
            best = value
    return best if best < INF else POINTS[s] - lo


def rank_table(probs: tuple[float, ...]) -> tuple[float, ...]:
    """rank_row for every age bin."""
    prefix = _prefix(probs)
    return tuple(rank_row(probs, s, prefix) for s in range(NBINS))


def finish_within(probs: tuple[float, ...], age: float, seconds: float, prefix=None) -> float:
    """P(D <= age + seconds | D > age), the mass of each bin spread evenly over it."""
    return _finish_within(probs, _tails((prefix or _prefix(probs))[0]), age, seconds)


def _tails(c0: list[float]) -> list[float]:
    """P(D >= the upper edge of bin b) (unnormalized), for each bin b."""
    total = c0[-1]
    return [total - c0[b + 1] for b in range(len(c0) - 1)]


def _above(probs, tails, x: float) -> float:  # P(D > x), unnormalized
    b = bin_of(x)
    lo = LOWER[b]
    hi = EDGES[b] if b < _NEDGES else max(x, lo) * 2 + 1
    return probs[b] * max(0.0, hi - x) / (hi - lo) + tails[b]


def _finish_within(probs, tails, age: float, seconds: float) -> float:
    now = _above(probs, tails, age)
    if now <= 0:
        return 1.0
    return max(0.0, min(1.0, 1.0 - _above(probs, tails, age + seconds) / now))


def quantile_remaining(probs: tuple[float, ...], age: float, q: float) -> float:
    """The q-quantile of D - age given D > age (bin points; for explain)."""
    b = bin_of(age)
    tail = sum(probs[b:])
    if tail <= 0:
        return 0.0
    acc = 0.0
    for j in range(b, NBINS):
        acc += probs[j]
        if acc >= q * tail:
            return max(0.0, POINTS[j] - age)
    return max(0.0, POINTS[-1] - age)


@dataclass(frozen=True)
class RankSettings:
    level_ratio: float = 4.0  # ranks of adjacent levels differ by this factor
    base_rank: float = 60.0  # GPU-seconds: ranks below are level 0
    levels: int = 40  # the last level takes every rank above


class Ranker:
    """The Gittins ranks and levels of one pass. What depends only on a job's kind and age bin (its
    rank, level, next level change, chance to end soon) is kept with the model between passes."""

    def __init__(self, model: SizeModel, settings: RankSettings) -> None:
        self.model, self.s = model, settings
        self._log_ratio = math.log(settings.level_ratio)
        self._memo = model._memo  # (kind, ...) -> value; cleared with the model

    @staticmethod
    def kind(job: JobView) -> tuple:
        return (service_rate(job), job.user, job.name)

    def dist(self, job: JobView) -> Dist:
        return self.model.distribution(*self.kind(job))

    def age(self, job: JobView, now: float) -> float:
        """Seconds of service on its GPUs: attained GPU-seconds over its GPU rate."""
        rate = service_rate(job)
        return job.attained(now) / rate if rate > 0 else 0.0

    def _probs(self, kind: tuple) -> tuple:
        """The kind's learned bin probabilities and their prefix sums (memoized for the pass)."""
        probs = self.model.distribution(*kind).probs
        pkey = ("prefix", kind)
        prefix = self._memo.get(pkey)
        if prefix is None:
            prefix = self._memo[pkey] = _prefix(probs)
        return probs, prefix

    def _kind_row(self, kind: tuple, b: int) -> tuple[float, int]:
        """(rank in GPU-seconds, level) of a job of this kind in age bin b."""
        key = ("row", kind, b)
        got = self._memo.get(key)
        if got is None:
            probs, prefix = self._probs(kind)
            rank = rank_row(probs, b, prefix) * kind[0]
            got = self._memo[key] = (rank, self.level_of_rank(rank))
        return got

    def rank_at(self, job: JobView, age: float) -> float:
        return self._kind_row(self.kind(job), bin_of(age))[0]

    def rank(self, job: JobView, now: float) -> float:
        return self.rank_at(job, self.age(job, now))

    def level_of_rank(self, rank: float) -> int:
        if rank <= self.s.base_rank:
            return 0
        return min(self.s.levels - 1, 1 + int(math.log(rank / self.s.base_rank) / self._log_ratio))

    def level(self, job: JobView, now: float) -> int:
        return self._kind_row(self.kind(job), bin_of(self.age(job, now)))[1]

    def next_change(self, job: JobView, now: float) -> float | None:
        """When (on the clock) this running job's level next changes, if it keeps running."""
        if job.gpu_rate <= 0:
            return None
        kind = self.kind(job)
        age = self.age(job, now)
        return self.next_change_of(kind, age, bin_of(age), now, job.gpu_rate)

    def finish_within(self, job: JobView, now: float, seconds: float) -> float:
        """P(it ends within `seconds` more service), given the service it has."""
        return self.finish_prob(self.kind(job), self.age(job, now), seconds)

    def finish_prob(self, kind: tuple, age: float, seconds: float) -> float:
        """finish_within for a job of this kind and age (seconds of service)."""
        key = ("tails", kind)
        got = self._memo.get(key)
        if got is None:
            probs, prefix = self._probs(kind)
            got = self._memo[key] = (probs, _tails(prefix[0]))
        return _finish_within(got[0], got[1], age, seconds)

    def service_quantile(self, kind: tuple, q: float) -> float:
        """The q-quantile of the total service (seconds on its GPUs) of a job of this kind."""
        key = ("quantile", kind, q)
        got = self._memo.get(key)
        if got is None:
            got = self._memo[key] = quantile_remaining(self.model.distribution(*kind).probs, 0.0, q)
        return got

    def likely_within(self, kind: tuple, age: float, b: int, seconds: float, p: float) -> bool:
        """finish_prob(kind, age, seconds) >= p, for an age in bin b; first against a bound kept per
        kind and bin (the mass of the bins the window can reach over the mass above bin b), which
        settles most runs (long past the window's reach) without the exact sum."""
        key = ("fbound", kind, b, seconds)
        bound = self._memo.get(key)
        if bound is None:
            c0 = self._probs(kind)[1][0]
            above = c0[-1] - c0[b + 1]
            if b >= _NEDGES or above <= 0:
                bound = INF
            else:
                reach = bin_of(EDGES[b] + seconds)
                bound = (c0[reach + 1] - c0[b]) / above
            self._memo[key] = bound
        if bound < p:
            return False
        return self.finish_prob(kind, age, seconds) >= p

    def running_facts(self, job: JobView, now: float) -> tuple[tuple, float, int, float, int]:
        """(kind, age, age bin, rank, level) of a job, computed once (a pass asks a running job's
        several times: its level, whether it likely ends soon, when its level changes)."""
        kind = self.kind(job)
        rate = kind[0]
        age = job.attained(now) / rate if rate > 0 else 0.0
        b = bin_of(age)
        rank, level = self._kind_row(kind, b)
        return kind, age, b, rank, level

    def next_change_of(self, kind: tuple, age: float, b: int, now: float, rate: float) -> float | None:
        """next_change for a job of this kind, age and age bin, served at `rate` GPUs."""
        if rate <= 0:
            return None
        key = ("next", kind, b)
        nxt = self._memo.get(key)
        if nxt is None:
            level = self._kind_row(kind, b)[1]
            nxt = next((j for j in range(b + 1, NBINS) if self._kind_row(kind, j)[1] != level), -1)
            self._memo[key] = nxt
        if nxt < 0:
            return None
        return now + (LOWER[nxt] - age) * kind[0] / rate


def service_rate(job: JobView) -> float:
    """What the job's service is counted on: its GPUs, or its share of a card: the charge of its
    run, else what it asked (a fraction, or compute). A memory-only request not placed yet has no
    charge before a card's size is known: 0 (no age; its distribution falls back to every job's)."""
    if job.gpu_share is None:
        return job.gpus
    return job.gpu_charge or job.gpu_share.fraction or job.gpu_share.compute_percent / 100


def explain(model: SizeModel, job: JobView, now: float, settings: RankSettings | None = None) -> dict:
    """Why the job sits where it does in the Gittins order, as plain data and one readable line.
    `hcontrol show scheduler` (or show job) prints `text`."""
    r = Ranker(model, settings or RankSettings())
    d = r.dist(job)
    age = r.age(job, now)
    rank = r.rank_at(job, age)
    level = r.level_of_rank(rank)
    g = service_rate(job)
    median = quantile_remaining(d.probs, age, 0.5)
    mean_total = sum(p * x for p, x in zip(d.probs, POINTS))
    basis = (f"{d.samples:.0f} finished jobs of {d.source}" if d.source != "prior"
             else "no finished jobs yet (attained-service order)")
    text = (f"level {level}: Gittins rank {rank / 3600:.3g} GPU-h per completion at {age / 3600:.3g} h of service "
            f"on {g:g} GPU(s); expected to need {median / 3600:.3g} h more (median), from {basis}")
    return {"level": level, "rank_gpu_s": rank, "age_s": age, "gpus": g, "median_remaining_s": median,
            "mean_service_s": mean_total, "source": d.source, "samples": d.samples, "text": text}
