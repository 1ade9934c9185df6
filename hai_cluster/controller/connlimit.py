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
from typing import Any

from .. import timeouts
from ..protocol.codec import Limits
from ..transport.rpc import RequestError, RpcConnection, Share

log = logging.getLogger("hai.access")

REFUSED_LINGER = 5.0  # seconds a refused connection is kept to say why
REFUSED_LINGERING = 4  # refused connections of one uid kept at once to say it


class _Refuse:
    def __init__(self, message: str) -> None:
        self.message = message

    async def dispatch(self, method: str, body: Any, context: Any) -> Any:
        raise RequestError(self.message)


class ConnectionCounter:
    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.open: dict[int, int] = {}
        self.lingering: dict[int, int] = {}

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
        log.warning("refused a connection from uid=%d pid=%d: %d connections open, the cap per uid", uid, pid,
                    self.cap)
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
