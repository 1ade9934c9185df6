"""A cap on the controller connections one uid holds open, so that one user (or a runaway
script) cannot use up the controller's file descriptors and attention. uid 0 is never capped.

The connection over the cap is not dropped silently: every request on it is answered with a clear
error for a few seconds, then it is closed. Other users' connections are unaffected."""
from __future__ import annotations

import asyncio
import logging
from typing import Any

from .. import timeouts
from ..transport.rpc import RequestError, RpcConnection

log = logging.getLogger("hai.access")

REFUSED_LINGER = 5.0  # seconds a refused connection is kept to say why


class _Refuse:
    def __init__(self, message: str) -> None:
        self.message = message

    async def dispatch(self, method: str, body: Any, context: Any) -> Any:
        raise RequestError(self.message)


class ConnectionCounter:
    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.open: dict[int, int] = {}

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

    async def refuse(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, uid: int, pid: int) -> None:
        log.warning("refused a connection from uid=%d pid=%d: %d connections open, the cap per uid", uid, pid,
                    self.cap)
        message = (f"too many connections to the controller from uid {uid} ({self.cap} open, the most allowed "
                   f"per user); close some and try again")
        conn = RpcConnection(reader, writer, table=_Refuse(message), name=f"refused client uid={uid} pid={pid}")
        try:
            await timeouts.wait_for(conn.run(), REFUSED_LINGER)
        except asyncio.TimeoutError:
            pass
        finally:
            await conn.close()
