"""The agent's side of controller fencing: commands from an old controller are refused.

Every command of an active controller carries its lease epoch. The agent keeps the newest epoch it
has seen in its spool (written before the command that raised it is acted on, so an agent restart
does not forget it) and refuses any command with an older one: a controller that lost the lease
(stopped, partitioned, then back) cannot start, signal, end or forget a run. Commands with no epoch
(tools talking to the agent directly) are refused too once an epoch has been seen, except the ones
that change nothing (hello, list_runs, ping).
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Awaitable, Callable

from ..transport.rpc import RequestError

log = logging.getLogger(__name__)

EPOCH_FILE = "controller_epoch"
READ_ONLY = frozenset({"hello", "list_runs", "ping"})


class EpochGate:
    def __init__(self, spool: str | os.PathLike) -> None:
        self.path = Path(spool) / EPOCH_FILE
        self.newest = self._load()

    def _load(self) -> int:
        try:
            return int(self.path.read_text().strip() or 0)
        except FileNotFoundError:
            return 0
        except ValueError:
            log.error("%s is unreadable; refusing every command until it is removed", self.path)
            return 2**62

    def _store(self, epoch: int) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            f.write(f"{epoch}\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def admit(self, method: str, body: Any) -> Any:
        """The body without its epoch, or RequestError for a command from a superseded controller."""
        epoch = None
        if isinstance(body, dict) and "epoch" in body:
            body = dict(body)
            epoch = body.pop("epoch")
            if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 1:
                raise RequestError(f"{method}.epoch must be a positive integer, got {epoch!r}")
        if epoch is None:
            if self.newest and method not in READ_ONLY:
                raise RequestError(f"refusing {method} without a controller epoch (this node follows epoch "
                                   f"{self.newest})")
            return body
        if epoch < self.newest:
            log.warning("refusing %s from a superseded controller (epoch %d, newest %d)", method, epoch, self.newest)
            raise RequestError(f"refusing {method}: controller epoch {epoch} is older than {self.newest}, the "
                               f"newest this node has seen (that controller is no longer the active one)")
        if epoch > self.newest:
            self._store(epoch)
            if self.newest:
                log.warning("controller epoch %d -> %d (a new active controller)", self.newest, epoch)
            self.newest = epoch
        return body

    def wrap(self, method: str, fn: Callable[[Any, Any], Awaitable[Any]]) -> Callable[[Any, Any], Awaitable[Any]]:
        async def gated(body: Any, ctx: Any) -> Any:
            return await fn(self.admit(method, body), ctx)
        return gated
