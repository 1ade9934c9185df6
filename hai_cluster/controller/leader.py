"""Active and standby controllers: waiting for the lease, keeping it, and stopping when it is lost.

A controller first opens and migrates the store, then waits as a standby until it holds the
lease (store/lease.py), and only then starts scheduling and connecting to agents, exactly as a
restarted controller does (recovery is the same code). While it is active:

- the lease is renewed every lease_duration/3 seconds on its own thread (a slow tick cannot
  starve it);
- every store write is fenced by the epoch (FencedEngine);
- every agent command carries the epoch (agents refuse an epoch older than the newest they saw),
  and is not even sent once the lease may have run out by our own clock (the renewal that
  succeeded last, sent at t, gives us until t + 0.8 x lease_duration; a standby takes over only
  after t + lease_duration on the database's clock);
- if a renewal finds another epoch, or a write is fenced, the controller stops at once (exit
  status 3: systemd restarts it, and it comes back as a standby).

A standby answers every client request with "not the active controller (active: HOST:SOCKET)".
"""
from __future__ import annotations

import asyncio
import logging
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from sqlalchemy.exc import DBAPIError

from .. import timeouts
from ..config import ControllerConfig
from ..store.lease import Fenced, FencedEngine, LeaseState, LeaseStore
from ..transport.rpc import ConnectionLost, RequestError, RpcTable

log = logging.getLogger(__name__)

LOCAL_MARGIN = 0.8  # of lease_duration: how long a renewal lets us command agents, by our clock
LOST_EXIT = 3


class LeaseExpired(ConnectionLost):
    """An agent command not sent: our lease may have run out (the link treats it as a lost link)."""


class Leader:
    def __init__(self, cfg: ControllerConfig) -> None:
        self.cfg = cfg
        self.duration = cfg.lease_duration
        self.holder = f"{socket.gethostname()}:{cfg.socket}"
        self.store = LeaseStore(cfg.database, cfg.lease_duration)
        self.epoch: int | None = None
        self.active = False
        self.lost: str | None = None  # why we stopped being the active controller
        self.other: LeaseState | None = None  # who is active while we wait
        self.unreadable = False  # the last look at the lease failed
        self._valid_until = 0.0  # time.monotonic()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lease")
        self._loop: asyncio.AbstractEventLoop | None = None
        self.on_lost: Callable[[], None] | None = None  # called (on the loop) when the lease is lost

    async def _run(self, fn: Callable, *args) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def open(self) -> None:
        """Refuse a second controller on an SQLite file, then migrate (one controller at a time)."""
        self._loop = asyncio.get_running_loop()
        self.store.lock_single(self.holder)
        await self._run(self.store.migrate)

    async def wait_until_active(self, stop: asyncio.Event) -> bool:
        """Poll the lease until we hold it (True) or are told to stop (False)."""
        poll = min(1.0, self.duration / 10)
        said = None
        while not stop.is_set():
            sent = time.monotonic()
            try:
                epoch, other = await self._run(self.store.acquire, self.holder)
            except DBAPIError as exc:  # store down, a leader's write holding the row, a race on insert
                epoch, other, self.unreadable = None, None, True
                if said != "error":
                    log.warning("standby: cannot read the controller lease yet (%s)",
                                str(exc.orig or exc).strip().splitlines()[0])
                said = "error"
            else:
                self.unreadable = False
            if epoch is not None:
                self.epoch, self.active, self.other = epoch, True, None
                self._valid_until = sent + LOCAL_MARGIN * self.duration
                log.warning("active controller %s, epoch %d", self.holder, epoch)
                return True
            if other is not None:
                self.other = other
                if said != other.holder:
                    log.info("standby: %s is the active controller (epoch %d, lease good for %.1f s more); "
                             "taking over if it stops renewing for %g s", other.holder, other.epoch,
                             other.expires_in, self.duration)
                said = other.holder
            try:
                await timeouts.wait_for(stop.wait(), poll)
            except asyncio.TimeoutError:
                pass
        return False

    # ---- while active ------------------------------------------------------------------------
    async def keep(self) -> None:
        """Renew the lease until it is lost (then on_lost()) or this task is cancelled."""
        while self.active:
            await asyncio.sleep(self.duration / 3)
            sent = time.monotonic()
            try:
                ours = await self._run(self.store.renew, self.epoch)
            except DBAPIError as exc:  # the store is down: nobody else can take over meanwhile either
                log.warning("could not renew the controller lease (%s); agent commands stop when it may "
                            "have run out", str(exc.orig or exc).strip().splitlines()[0])
                continue
            except Exception:  # a bug here must not stop the renewals (the lease would lapse)
                log.exception("renewing the controller lease failed")
                continue
            if ours:
                self._valid_until = sent + LOCAL_MARGIN * self.duration
            else:
                self._lose("another controller took over the lease")

    def _lose(self, why: str) -> None:
        if self.lost is not None:
            return
        self.active, self.lost = False, why
        log.error("no longer the active controller (epoch %s): %s; stopping", self.epoch, why)
        if self.on_lost is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(self.on_lost)

    def agent_epoch(self) -> int:
        """The epoch for an agent command, or LeaseExpired when we may no longer give commands."""
        if not self.active:
            raise LeaseExpired(f"not the active controller ({self.lost or 'standby'})")
        if time.monotonic() > self._valid_until:
            raise LeaseExpired(f"the controller lease (epoch {self.epoch}) was not renewed in time; "
                               f"no agent commands until it is")
        return self.epoch

    def _check(self, c) -> None:
        if not self.active:
            raise Fenced(f"not the active controller ({self.lost or 'standby'})")
        try:
            self.store.check_epoch(c, self.epoch)
        except Fenced as exc:
            self._lose(str(exc))
            raise

    def fenced_engine(self) -> FencedEngine:
        return FencedEngine(self.store.engine, self._check)

    async def release(self) -> None:
        """On a clean shutdown: let the standby take over without waiting out the lease."""
        if self.active and self.epoch is not None:
            self.active = False
            try:
                await self._run(self.store.release, self.epoch)
            except DBAPIError:
                pass

    def close(self) -> None:
        self._executor.shutdown(wait=True)
        self.store.close()

    def standby_message(self) -> str:
        if self.cfg.database.startswith("sqlite"):  # no standby there: say what keeps this one back
            why = f"it lost the lease: {self.lost}" if self.lost else (
                "its store cannot be read or written" if self.unreadable else "it is starting")
            return f"the controller is not serving yet ({why}); try again in a moment"
        if self.lost:
            return f"not the active controller (it lost the lease: {self.lost})"
        active = (self.other.holder if self.other else
                  "unknown: the store cannot be read" if self.unreadable else "not known yet")
        return (f"not the active controller (active: {active}); "
                f"point HAI_CONTROLLER at the active controller's socket")

    def status_line(self) -> str:
        return f"standby; active: {self.other.holder if self.other else 'unknown'}"


STARTING = "the controller is starting (its store is not open yet); try again"


class Gate(RpcTable):
    """The client API behind the lease: a standby (or a fenced leader) refuses every request, and
    so does an active one until `ready()` (its store is open: Controller.start has run)."""

    def __init__(self, inner: RpcTable, leader: Leader, ready: Callable[[], bool] = lambda: True) -> None:
        super().__init__()
        self._inner, self._leader, self._ready = inner, leader, ready

    @property
    def methods(self) -> frozenset[str]:
        return self._inner.methods

    async def dispatch(self, method: str, body: Any, context: Any) -> Any:
        if not self._leader.active:
            raise RequestError(self._leader.standby_message())
        if not self._ready():
            raise RequestError(STARTING)
        try:
            return await self._inner.dispatch(method, body, context)
        except Fenced as exc:
            raise RequestError(str(exc)) from None
