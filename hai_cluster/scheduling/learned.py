"""What an operator reads of the scheduler's learned state (`hcontrol show scheduler`): the job
sizes it learned, key by key, and where a job stands in the MLFQ's order and why. Pure."""
from __future__ import annotations

from dataclasses import dataclass

from ..core.model import JobView
from ..core.sizemodel import SizeModel, bin_of
from .gittins import Ranker, explain, quantile_remaining, service_rate
from .mlfq import MlfqConfig


@dataclass(frozen=True)
class KeySummary:
    key: str  # "*", "g8", "g8/u:alice", "g8/n:resnet50" (core.sizemodel)
    samples: float  # decayed weight of the ended jobs behind it
    median_s: float  # service (seconds on the job's GPUs) half of them stayed under
    p90_s: float


def key_summaries(model: SizeModel, most: int = 40) -> list[KeySummary]:
    """The keys with the most samples behind them (the root and GPU counts first), at most `most`."""
    out = []
    for key, h in model.hists.items():
        total = h.total
        if total <= 0:
            continue
        probs = tuple(w / total for w in h.weights)
        out.append(KeySummary(key, total, quantile_remaining(probs, 0.0, 0.5), quantile_remaining(probs, 0.0, 0.9)))
    out.sort(key=lambda k: (k.key != "*", "/" in k.key, -k.samples, k.key))
    return out[:most]


def standing(cfg: MlfqConfig, model: SizeModel, job: JobView, now: float) -> dict:
    """The job's level in the order the MLFQ runs, with a readable line; and what the learned
    model says of it (its Gittins view), whichever order runs."""
    learned = explain(model, job, now, cfg.rank_settings)
    if cfg.order == "gittins":
        return {"order": "gittins", "level": learned["level"], "text": learned["text"], "learned": learned}
    attained = job.attained(now)
    level = cfg.level_of(attained)
    t = cfg.thresholds
    where = (f" ({'below' if level < len(t) else 'past'} {t[min(level, len(t) - 1)]:g}; thresholds "
             f"{', '.join(f'{x:g}' for x in t)})") if t else ""
    text = f"level {level}: {attained:.0f} GPU-seconds attained{where}, on {service_rate(job):g} GPU(s)"
    return {"order": "las", "level": level, "text": text, "learned": learned}


def level_now(cfg: MlfqConfig, model: SizeModel, rate: float, user: str, name: str, attained: float) -> int:
    """The level a job of `rate` GPUs (its share of a card) with `attained` GPU-seconds sits at in
    the order the MLFQ runs: what hqueue's LEVEL and `hcontrol show job`'s Level= show, from the
    job table's columns (no JobView). The same table a pass reads (Ranker's, per kind and age bin)."""
    if cfg.order != "gittins":
        return cfg.level_of(attained)
    age = attained / rate if rate > 0 else 0.0
    return Ranker(model, cfg.rank_settings)._kind_row((rate, user, name), bin_of(age))[1]
