"""One link per node: connect, say hello, keep it alive, and reconnect with backoff when it drops.

While a link is down the node shows as not responding and gets no new work; the controller
reconciles what the agent reports every time the link comes back.
"""
from __future__ import annotations

import asyncio
import logging
import random
from typing import Any, Awaitable, Callable

from ..config import NodeConfig, SshConfig
from ..transport.rpc import ConnectionLost, RpcConnection, RpcTable
from ..transport.connect import open_stream
from ..transport.streams import TransportError

log = logging.getLogger(__name__)

BACKOFF_FIRST = 0.5
BACKOFF_MAX = 30.0


class NodeUnavailable(Exception):
    pass


# What a call to an agent may raise besides its own refusal (RpcError): the link is down or broke.
AGENT_ERRORS = (NodeUnavailable, ConnectionLost, asyncio.TimeoutError, OSError)


class NodeLink:
    def __init__(self, node: NodeConfig, ssh: SshConfig, ping_interval: float, *,
                 on_hello: Callable[[str, dict], Awaitable[None]],
                 on_event: Callable[[str, str, Any], Awaitable[None]],
                 on_lost: Callable[[str, str], Awaitable[None]], table: RpcTable | None = None) -> None:
        self.node = node
        self.table = table  # what the agent may ask on this link (job steps), context: the node's name
        self.ssh = ssh
        self.ping_interval = ping_interval
        self._on_hello = on_hello
        self._on_event = on_event
        self._on_lost = on_lost
        self._conn: RpcConnection | None = None
        self.generation = 0  # bumps on every new connection; lets callers tell links apart
        self.last_error: str | None = None
        # Set by an active controller: the lease epoch every command carries (it raises when the
        # lease may have run out, so nothing is sent). Pings carry none: they change nothing.
        self.epoch: Callable[[], int] | None = None

    def _with_epoch(self, method: str, body: Any) -> Any:
        if self.epoch is None or method == "ping":
            return body
        return {**(body or {}), "epoch": self.epoch()}

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def connected(self) -> bool:
        return self._conn is not None and not self._conn.closed

    async def call(self, method: str, body: Any = None, timeout: float = 30.0) -> Any:
        conn = self._conn
        if conn is None or conn.closed:
            raise NodeUnavailable(f"node {self.name} is not responding")
        return await conn.call(method, self._with_epoch(method, body), timeout=timeout)

    async def run(self) -> None:
        delay = BACKOFF_FIRST
        while True:
            before = self.generation
            try:
                await self._session()  # ends only by raising
            except asyncio.CancelledError:
                raise
            except (TransportError, ConnectionLost, asyncio.TimeoutError, OSError) as exc:
                self._note_error(str(exc) or exc.__class__.__name__)
            except Exception as exc:  # a bug must not end the link for good
                log.exception("link to %s failed", self.name)
                self._note_error(f"internal error: {exc}")
            if self.generation != before:  # it was up (a hello went through): try again soon
                delay = BACKOFF_FIRST
            # Jitter keeps many links from reconnecting in lockstep after a controller restart.
            await asyncio.sleep(delay * random.uniform(0.8, 1.2))
            delay = min(delay * 2, BACKOFF_MAX)

    def _note_error(self, error: str) -> None:
        if error != self.last_error:
            log.warning("node %s: %s", self.name, error)
        self.last_error = error

    async def _session(self) -> None:
        stream = await open_stream(self.node, self.ssh)
        gen = self.generation + 1

        async def on_event(name: str, body: Any) -> None:
            await self._on_event(self.name, name, body)

        conn = RpcConnection(stream.reader, stream.writer, on_event=on_event, name=f"agent {self.name}",
                             table=self.table, context=self.name)
        reader = asyncio.create_task(conn.run())
        try:
            hello = await conn.call("hello", self._with_epoch("hello", {"controller": "hai-controller"}),
                                    timeout=2 * self.ping_interval)
            if hello.get("node") != self.name:
                raise ConnectionLost(f"agent at {self.node.address} says it is node {hello.get('node')!r}, "
                                     f"expected {self.name!r}")
            self._conn, self.generation, self.last_error = conn, gen, None
            log.info("node %s connected (%d GPUs, %s)", self.name, len(hello.get("gpus", [])),
                     hello.get("gpu_backend"))
            await self._on_hello(self.name, hello)
            while not conn.closed:
                await asyncio.wait([reader], timeout=self.ping_interval)
                if conn.closed:
                    break
                await conn.call("ping", {}, timeout=2 * self.ping_interval)
            raise ConnectionLost(conn.close_reason or "connection closed")
        finally:
            was_up = self._conn is conn
            self._conn = None
            await conn.close()
            reader.cancel()
            await stream.close()
            if was_up:
                try:  # must not replace a cancellation (shutdown) with the store's error
                    await self._on_lost(self.name, conn.close_reason or "link closed")
                except Exception as exc:
                    log.warning("node %s: could not record the lost link: %s", self.name, exc)
