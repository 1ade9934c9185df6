"""Request/response and pushed events over one framed stream (asyncio).

Both daemons and the controller's node links use this. Serving side: an RpcTable lists the
methods a peer may call; anything not listed is refused (deny by default). A peer that sends
garbage gets its connection closed; the serving process carries on.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Any, Awaitable, Callable

from ..protocol import messages
from ..protocol.codec import FrameDecoder, ProtocolError, encode_frame

log = logging.getLogger(__name__)

READ_CHUNK = 64 * 1024


class RpcError(Exception):
    """The peer answered a request with an error."""


class ConnectionLost(Exception):
    """The connection closed before the answer came."""


class RequestError(Exception):
    """Raised by a handler to answer with a clear error text (bad input, permission, not found)."""


Handler = Callable[[Any, Any], Awaitable[Any]]


class RpcTable:
    """The methods a connection may call. Handlers take (body, context) and return the reply body."""

    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}

    def expose(self, name: str) -> Callable[[Handler], Handler]:
        def register(fn: Handler) -> Handler:
            self._handlers[name] = fn
            return fn
        return register

    def add(self, name: str, fn: Handler) -> None:
        self._handlers[name] = fn

    @property
    def methods(self) -> frozenset[str]:
        return frozenset(self._handlers)

    async def dispatch(self, method: str, body: Any, context: Any) -> Any:
        handler = self._handlers.get(method)
        if handler is None:
            raise RequestError(f"method {method!r} is not allowed")
        return await handler(body, context)


class RpcConnection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *,
                 table: RpcTable | None = None, context: Any = None,
                 on_event: Callable[[str, Any], Awaitable[None]] | None = None,
                 name: str = "peer") -> None:
        self._reader = reader
        self._writer = writer
        self._table = table
        self._context = context
        self._on_event = on_event
        self.name = name
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self._tasks: set[asyncio.Task] = set()
        self._write_lock = asyncio.Lock()
        self._closed = asyncio.Event()
        self.close_reason: str | None = None

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    async def wait_closed(self) -> None:
        await self._closed.wait()

    async def _send(self, message: dict) -> None:
        if self.closed:
            raise ConnectionLost(f"connection to {self.name} is closed")
        frame = encode_frame(message)
        async with self._write_lock:
            try:
                self._writer.write(frame)
                await self._writer.drain()
            except (ConnectionError, OSError, RuntimeError) as exc:
                self._shutdown(f"write failed: {exc}")
                raise ConnectionLost(f"connection to {self.name} lost: {exc}") from None

    async def call(self, method: str, body: Any = None, timeout: float | None = 30.0) -> Any:
        rid = next(self._ids)
        fut = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        try:
            await self._send(messages.request(rid, method, body))
            return await asyncio.wait_for(fut, timeout)
        finally:
            self._pending.pop(rid, None)

    async def push(self, name: str, body: Any = None) -> None:
        await self._send(messages.event(name, body))

    async def run(self) -> None:
        """Read and dispatch until the peer closes or breaks the protocol."""
        decoder = FrameDecoder()
        reason = "closed by peer"
        try:
            while True:
                data = await self._reader.read(READ_CHUNK)
                if not data:
                    if decoder.pending_bytes:
                        reason = "truncated frame at end of stream"
                    break
                for raw in decoder.feed(data):
                    self._handle(messages.parse_message(raw))
        except ProtocolError as exc:
            reason = f"protocol error: {exc}"
            log.warning("closing connection to %s: %s", self.name, reason)
        except (ConnectionError, OSError) as exc:
            reason = f"connection error: {exc}"
        except asyncio.CancelledError:
            reason = "cancelled"
            raise
        finally:
            self._shutdown(reason)

    def _handle(self, msg: messages.Message) -> None:
        if isinstance(msg, messages.Response):
            fut = self._pending.get(msg.id)
            if fut is not None and not fut.done():
                if msg.ok:
                    fut.set_result(msg.body)
                else:
                    fut.set_exception(RpcError(msg.error))
        elif isinstance(msg, messages.Request):
            self._spawn(self._serve(msg))
        elif isinstance(msg, messages.Event) and self._on_event is not None:
            self._spawn(self._event(msg))

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _event(self, msg: messages.Event) -> None:
        try:
            await self._on_event(msg.name, msg.body)
        except Exception:
            log.exception("event handler for %s from %s failed", msg.name, self.name)

    async def _serve(self, req: messages.Request) -> None:
        if self._table is None:
            reply = messages.error_response(req.id, "this side serves no requests")
        else:
            try:
                body = await self._table.dispatch(req.method, req.body, self._context)
                reply = messages.response(req.id, body)
            except RequestError as exc:
                reply = messages.error_response(req.id, str(exc))
            except Exception as exc:
                log.exception("handler %s failed for %s", req.method, self.name)
                reply = messages.error_response(req.id, f"internal error in {req.method}: {exc}")
        try:
            await self._send(reply)
        except ConnectionLost:
            pass
        except ProtocolError as exc:  # reply too large to frame
            await self._send(messages.error_response(req.id, str(exc)))

    def _shutdown(self, reason: str) -> None:
        if self._closed.is_set():
            return
        self.close_reason = reason
        self._closed.set()
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(ConnectionLost(f"connection to {self.name} lost: {reason}"))
        try:
            self._writer.close()
        except Exception:
            pass

    async def close(self) -> None:
        self._shutdown("closed locally")
        for task in list(self._tasks):
            task.cancel()
