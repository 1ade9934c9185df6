"""The controller's side of what the scheduler learns (core.sizemodel): the model the policy sees
in every snapshot, folded from the jobs that ended, in the order of their ends, and kept in the
store (store/sizes.py). At the start it is loaded, and what ended after its saved point is folded
in; without a saved state (a new store, a lost row, a model of another version) it is rebuilt from
the newest ended jobs. Every pass folds in what ended since the last one (one indexed query); the
state is written back at most once a minute and at shutdown."""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from ..core.sizemodel import SizeModel, observe
from ..store import sizes as store

if TYPE_CHECKING:
    from .service import Controller

log = logging.getLogger(__name__)

REBUILD_JOBS = 50_000  # a model's keys forget a sample in ~memory (1,000) of their own samples
FOLD_BATCH = 5_000  # ended jobs folded in per pass (a backlog takes a few passes)
SAVE_EVERY = 60.0  # seconds
FOLD_EVERY = 1.0  # seconds: a burst of passes (one per 50 ms) reads the ended jobs once a second


class SizeLearner:
    def __init__(self, ctl: "Controller") -> None:
        self.ctl = ctl
        self.model = SizeModel()
        self.through: tuple[float, int] | None = None  # the last ended job folded in
        self._dirty = False
        self._saved = time.monotonic()
        self._folded = -FOLD_EVERY

    async def start(self) -> None:
        saved = await self.ctl.db(store.load, self.ctl.repo.engine)
        model = None
        if saved is not None:
            try:
                model = SizeModel.from_wire(saved.state)
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("the scheduler's saved size model is not usable (%s): rebuilding it from the "
                            "jobs that ended", exc)
        if model is None:
            ended = await self.ctl.db(store.ended_after, self.ctl.repo.engine, None, REBUILD_JOBS)
            self._fold(SizeModel(), ended)
            self._dirty = True
            log.info("scheduler: size model rebuilt from %d ended job(s)", len(ended))
        else:
            self.model, self.through = model, saved.through
        await self.catch_up()

    def _fold(self, model: SizeModel, ended) -> None:
        if ended:
            self.model = observe(model, [e.fact for e in ended])
            self.through = ended[-1].at
            self._dirty = True

    async def catch_up(self, force: bool = True) -> None:
        """Fold in the jobs that ended since the last fold; write the state if it is time."""
        if not force and time.monotonic() - self._folded < FOLD_EVERY:
            return
        self._folded = time.monotonic()
        while True:
            ended = await self.ctl.db(store.ended_after, self.ctl.repo.engine, self.through, FOLD_BATCH)
            self._fold(self.model, ended)
            if len(ended) < FOLD_BATCH:
                break
        if self._dirty and time.monotonic() - self._saved >= SAVE_EVERY:
            await self.save()

    async def save(self) -> None:
        if not self._dirty or self.through is None:
            return
        await self.ctl.db(store.save, self.ctl.repo.engine, self.model.to_wire(), self.through, time.time())
        self._dirty, self._saved = False, time.monotonic()
