"""A cap on the controller connections one uid holds open, so that one user (or a runaway
script) cannot use up the controller's file descriptors and attention. uid 0 is never capped.

The connection over the cap is not dropped silently: every request on it is answered with a clear
error for a few seconds, then it is closed. Other users' connections are unaffected. A refused
connection is read within the same limits as any other of its uid (frame shape, the uid's share of
requests and bytes), and at most REFUSED_LINGERING of one uid linger: beyond them, they are
closed at once (else refused connections, counted nowhere, would be a way around the cap)."""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable

from .. import timeouts
from ..protocol.codec import Limits
from ..transport.rpc import RequestError, RpcConnection, Share
from .submitrate import SubmitRate

log = logging.getLogger("hai.access")

REFUSED_LINGER = 5.0  # seconds a refused connection is kept to say why
REFUSED_LINGERING = 4  # refused connections of one uid kept at once to say it
# New connections of one uid per second, sustained, and at once: beyond, one is closed as soon
# as it is accepted (no log line, no RPC set-up). A user connecting and closing in a loop made
# ~2,900 a second, each costing the event loop what every other user's requests wait for.
CONNECT_RATE = 100.0
CONNECT_BURST = 1000
LOG_EVERY = 10.0  # seconds between two log lines about one uid's refused connections


class _Refuse:
    def __init__(self, message: str) -> None:
        self.message = message

    async def dispatch(self, method: str, body: Any, context: Any) -> Any:
        raise RequestError(self.message)


class ConnectionCounter:
    def __init__(self, cap: int, rate: float = CONNECT_RATE, burst: int = CONNECT_BURST,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cap = cap
        self.open: dict[int, int] = {}
        self.lingering: dict[int, int] = {}
        self.rate, self.clock = rate, clock
        self._connects = SubmitRate(rate, burst, clock)  # a token bucket per uid, as submissions have
        self._refused: dict[int, tuple[int, float]] = {}  # uid -> (refused since the last line, its time)

    def too_fast(self, uid: int) -> bool:
        """Whether this new connection of `uid` is over its rate (token bucket; uid 0 never is)."""
        if self._connects.take_now(uid):
            return False
        self.note_refused(uid, "connecting faster than %g a second" % self.rate)
        return True

    def note_refused(self, uid: int, why: str) -> None:
        """One log line per uid every LOG_EVERY seconds, with the count: refusals by the thousand
        must not become log lines by the thousand."""
        now = self.clock()
        count, last = self._refused.get(uid, (0, float("-inf")))
        if now - last >= LOG_EVERY:
            log.warning("refused %d connection(s) from uid=%d: %s", count + 1, uid, why)
            self._refused[uid] = (0, now)
        else:
            self._refused[uid] = (count + 1, last)

    def admit(self, uid: int) -> bool:
        if self.cap and uid != 0 and self.open.get(uid, 0) >= self.cap:
            return False
        self.open[uid] = self.open.get(uid, 0) + 1
        return True

    def release(self, uid: int) -> None:
        left = self.open.get(uid, 0) - 1
        if left > 0:
            self.open[uid] = left
        else:
            self.open.pop(uid, None)

    async def refuse(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, uid: int, pid: int, *,
                     limits: Limits, share: Share | None) -> None:
        self.note_refused(uid, f"{self.cap} connections open, the cap per uid (the latest from pid {pid})")
        if self.lingering.get(uid, 0) >= REFUSED_LINGERING:
            writer.transport.abort()
            return
        self.lingering[uid] = self.lingering.get(uid, 0) + 1
        message = (f"too many connections to the controller from uid {uid} ({self.cap} open, the most allowed "
                   f"per user); close some and try again")
        conn = RpcConnection(reader, writer, table=_Refuse(message), name=f"refused client uid={uid} pid={pid}",
                             limits=limits, max_in_flight=1, share=share)
        try:
            await timeouts.wait_for(conn.run(), REFUSED_LINGER)
        except asyncio.TimeoutError:
            pass
        finally:
            await conn.close()
            self.lingering[uid] -= 1
            if not self.lingering[uid]:
                del self.lingering[uid]
