"""Request/response and pushed events over one framed stream (asyncio).

Both daemons and the controller's node links use this. Serving side: an RpcTable lists the
methods a peer may call; anything not listed is refused (deny by default). A peer that sends
garbage gets its connection closed; the serving process carries on.

A serving side may also close half-open and forgotten connections: `frame_timeout` bounds how long
a frame may take from its first byte to its last (a peer that sends half a frame and stalls), and
how long one frame may wait to be written (a peer that stops reading); `idle_timeout` closes a
connection that sent nothing and has nothing in flight for that long. A peer that keeps calling
(the controller's pings to agents, hstat's polls) is never idle.

Every request has a bounded cost: frames are checked and decoded as they arrive, within `limits`
(protocol/codec.py); at most `max_in_flight` requests per connection are handled at once, and a
`Share` bounds one peer's requests and frame bytes across its connections (the controller: per
uid). A connection at a limit is simply not read until a request completes (backpressure, not an
error): a peer that pipelines thousands of requests waits for its own answers, not others.
"""
from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import time
from typing import Any, Awaitable, Callable

from .. import timeouts
from ..logsetup import LogBudget
from ..protocol import messages
from ..protocol.codec import LINK_LIMITS, FrameDecoder, Limits, ProtocolError, encode_frame

log = logging.getLogger(__name__)

TRACEBACKS_PER_MINUTE = 20  # a handler's unexpected failures logged whole; the rest are counted


CLOSINGS_PER_MINUTE = 60  # connections closed for garbage or stalls, logged; the rest counted
# Tracebacks of failed handlers: a request that makes a handler fail, sent in a loop, must not
# become 80 GB of log a day (fifth audit); nor may garbage that gets its connection closed.
_failures = LogBudget(log, TRACEBACKS_PER_MINUTE, "handler failure(s)")
_closings = LogBudget(log, CLOSINGS_PER_MINUTE, "connection(s) closed for garbage or stalls")

READ_CHUNK = 64 * 1024


class RpcError(Exception):
    """The peer answered a request with an error."""


class ConnectionLost(Exception):
    """The connection closed before the answer came."""


class RequestError(Exception):
    """Raised by a handler to answer with a clear error text (bad input, permission, not found)."""


Handler = Callable[[Any, Any], Awaitable[Any]]


def refusing(fn: Handler, *errors: type[Exception]) -> Handler:
    """The handler, with `errors` (a body that fails its checks) answered as a RequestError: the
    peer is told what was wrong, and no traceback is logged for its input."""
    async def wrapper(body: Any, ctx: Any) -> Any:
        try:
            return await fn(body, ctx)
        except errors as exc:
            raise RequestError(str(exc)) from None
    return wrapper


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


class ByteBudget:
    """Bytes of frames a peer may have being decoded or handled at once; waiters go in turn."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._waiters: collections.deque[tuple[int, asyncio.Future]] = collections.deque()

    def fits(self, n: int) -> bool:
        """Whether take(n) would not wait."""
        return not self._waiters and self.used + min(n, self.limit) <= self.limit

    async def take(self, n: int) -> int:
        """Wait for room for `n` bytes; returns what was charged (give it back)."""
        n = min(n, self.limit)  # a frame over the whole budget waits for all of it, not forever
        if self.fits(n):
            self.used += n
            return n
        entry = (n, asyncio.get_running_loop().create_future())
        self._waiters.append(entry)
        try:
            await entry[1]
        except asyncio.CancelledError:
            if entry[1].done() and not entry[1].cancelled():
                self.give(n)  # granted as we were cancelled
            else:
                self._waiters.remove(entry)
                self._wake()
            raise
        return n

    def give(self, n: int) -> None:
        self.used -= n
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self.used + self._waiters[0][0] <= self.limit:
            n, fut = self._waiters.popleft()
            self.used += n
            fut.set_result(None)


class Share:
    """What one peer may have under way across all its connections: requests being handled,
    bytes of frames being decoded or handled, and bytes of replies it has not read yet (a reply
    waits for room before it is written). None: no such limit."""

    def __init__(self, requests: int | None, nbytes: int | None) -> None:
        self.requests = asyncio.Semaphore(requests) if requests else None
        self.budget = ByteBudget(nbytes) if nbytes else None
        self.replies = ByteBudget(nbytes) if nbytes else None
        self.connections = 0


class Shares:
    """One Share per key (the controller: per uid), kept while the key has a connection open."""

    def __init__(self, requests: int | None, nbytes: int | None) -> None:
        self._requests, self._nbytes = requests, nbytes
        self._shares: dict[Any, Share] = {}

    def open(self, key: Any) -> Share:
        share = self._shares.get(key)
        if share is None:
            share = self._shares[key] = Share(self._requests, self._nbytes)
        share.connections += 1
        return share

    def close(self, key: Any) -> None:
        share = self._shares[key]
        share.connections -= 1
        if not share.connections:
            del self._shares[key]


class RpcConnection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *,
                 table: RpcTable | None = None, context: Any = None,
                 on_event: Callable[[str, Any], Awaitable[None]] | None = None,
                 name: str = "peer", frame_timeout: float | None = None,
                 idle_timeout: float | None = None, limits: Limits = LINK_LIMITS,
                 max_in_flight: int | None = None, share: Share | None = None) -> None:
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
        self._frame_timeout = frame_timeout or None  # 0: off
        # How long one frame may wait to be written: the frame timeout, unless the peer may read
        # as slowly as it likes (an interactive client whose own step's output this is)
        self.write_timeout = self._frame_timeout
        self._idle_timeout = idle_timeout or None
        self._last_activity = time.monotonic()  # a frame received or a request answered
        self._limits = limits
        self._slots = asyncio.Semaphore(max_in_flight) if max_in_flight else None
        self._share = share
        self._budget = share.budget if share is not None else None

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    async def wait_closed(self) -> None:
        await self._closed.wait()

    async def _send(self, message: dict) -> None:
        if self.closed:
            raise ConnectionLost(f"connection to {self.name} is closed")
        await self._write(encode_frame(message))

    async def _write(self, frame: bytes) -> None:
        async with self._write_lock:
            try:
                self._writer.write(frame)
                await timeouts.wait_for(self._writer.drain(), self.write_timeout)
            except asyncio.TimeoutError:
                reason = f"peer read nothing for {self.write_timeout:g} s"
                if _closings.allow():
                    log.warning("closing connection to %s: %s", self.name, reason)
                self._shutdown(reason, abort=True)
                raise ConnectionLost(f"connection to {self.name} lost: {reason}") from None
            except (ConnectionError, OSError, RuntimeError) as exc:
                self._shutdown(f"write failed: {exc}")
                raise ConnectionLost(f"connection to {self.name} lost: {exc}") from None

    async def call(self, method: str, body: Any = None, timeout: float | None = 30.0) -> Any:
        rid = next(self._ids)
        fut = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        try:
            await self._send(messages.request(rid, method, body))
            return await timeouts.wait_for(fut, timeout)
        finally:
            self._pending.pop(rid, None)

    async def push(self, name: str, body: Any = None) -> None:
        await self._send(messages.event(name, body))

    async def offer(self, name: str, body: Any, wait: float, max_buffered: int) -> bool:
        """Push an event only as fast as the peer reads: within `wait` seconds the bytes it has not
        read yet must fall to `max_buffered`, else nothing is written and the answer is False (the
        sender keeps the event and offers it again). A peer that stops reading thus holds at most
        max_buffered bytes and the frames being offered, never an ever longer queue of writes."""
        if self.closed:
            raise ConnectionLost(f"connection to {self.name} is closed")
        frame = encode_frame(messages.event(name, body))
        deadline = time.monotonic() + wait
        try:
            await timeouts.wait_for(self._write_lock.acquire(), wait)
        except asyncio.TimeoutError:
            return False
        try:
            while self._writer.transport.get_write_buffer_size() > max_buffered:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                try:  # drain returns once the buffer is under the transport's low-water mark
                    await timeouts.wait_for(self._writer.drain(), left)
                except asyncio.TimeoutError:
                    return False
            self._writer.write(frame)
            return True
        except (ConnectionError, OSError, RuntimeError) as exc:
            self._shutdown(f"write failed: {exc}")
            raise ConnectionLost(f"connection to {self.name} lost: {exc}") from None
        finally:
            self._write_lock.release()

    async def run(self) -> None:
        """Read and dispatch until the peer closes or breaks the protocol."""
        decoder = FrameDecoder(self._limits, gated=self._budget is not None)
        charges: collections.deque[int] = collections.deque()  # budget taken per frame admitted, oldest first
        reason = "closed by peer"
        abort = False  # a peer that broke the rules gets no flush of what is left to write
        frame_started: float | None = None  # when the first byte of a frame not yet complete came
        try:
            while True:
                timeout = self._read_timeout(frame_started)
                try:
                    data = await timeouts.wait_for(self._reader.read(READ_CHUNK), timeout)
                except asyncio.TimeoutError:
                    stalled = self._stalled(frame_started)
                    if stalled is None:
                        continue  # busy answering, or a deadline moved: look again
                    reason, abort = stalled, True
                    if _closings.allow():
                        log.warning("closing connection to %s: %s", self.name, reason)
                    break
                if not data or self.closed:
                    if not data and decoder.pending_bytes:
                        reason = "truncated frame at end of stream"
                    break
                frames, got, waited = decoder.feed(data), False, False
                while True:
                    for raw in frames:
                        if self.closed:
                            break
                        msg = messages.parse_message(raw)
                        got = True
                        waited |= await self._accept(msg, charges.popleft() if self._budget else 0)
                    if decoder.waiting is None or self.closed:
                        break
                    waited |= not self._budget.fits(decoder.waiting)
                    charges.append(await self._budget.take(decoder.waiting))  # not read meanwhile
                    frames = decoder.admit()
                now = time.monotonic()
                if got or waited:
                    self._last_activity = now
                if not decoder.pending_bytes:
                    frame_started = None
                elif got or waited or frame_started is None:
                    frame_started = now  # a new frame began in this chunk, or we kept the peer waiting
        except ProtocolError as exc:
            reason, abort = f"protocol error: {exc}", True
            if _closings.allow():
                log.warning("closing connection to %s: %s", self.name, reason)
        except (ConnectionError, OSError) as exc:
            reason = f"connection error: {exc}"
        except asyncio.CancelledError:
            reason = "cancelled"
            raise
        finally:
            if charges:
                self._budget.give(sum(charges))  # frames begun and never completed
            self._shutdown(reason, abort=abort)

    async def _accept(self, msg: messages.Message, charge: int) -> bool:
        """Start on a message; a request waits for its slots (this connection's, then the
        share's). Whether it had to wait."""
        if not isinstance(msg, messages.Request):
            self._give(charge)
            self._handle(msg)
            return False
        waited, taken = False, []
        try:
            for slots in (self._slots, self._share.requests if self._share else None):
                if slots is not None:
                    waited |= slots.locked()
                    await slots.acquire()
                    taken.append(slots)
        except BaseException:
            self._release(taken, charge)
            raise
        if self.closed:  # closed while it waited: nobody to answer
            self._release(taken, charge)
            return waited
        task = self._spawn(self._serve(msg))
        task.add_done_callback(lambda _: self._release(taken, charge))  # runs even if cancelled unstarted
        return waited

    def _release(self, taken: list[asyncio.Semaphore], charge: int) -> None:
        for slots in taken:
            slots.release()
        self._give(charge)

    def _give(self, charge: int) -> None:
        if charge:
            self._budget.give(charge)

    def _busy(self) -> bool:
        return bool(self._tasks or self._pending)

    def _read_timeout(self, frame_started: float | None) -> float | None:
        """How long the next read may wait before the deadlines are looked at; None: forever."""
        now = time.monotonic()
        waits = []
        if frame_started is not None and self._frame_timeout:
            waits.append(frame_started + self._frame_timeout - now)
        elif self._idle_timeout:
            waits.append(self._idle_timeout if self._busy() else self._last_activity + self._idle_timeout - now)
        return max(0.0, min(waits)) if waits else None

    def _stalled(self, frame_started: float | None) -> str | None:
        """Why the connection is to be closed now, if it is."""
        now = time.monotonic()
        if frame_started is not None and self._frame_timeout:
            if now - frame_started >= self._frame_timeout:
                return f"incomplete frame for {self._frame_timeout:g} s"
            return None
        if self._idle_timeout:
            if self._busy():
                self._last_activity = now
            elif now - self._last_activity >= self._idle_timeout:
                return f"idle for {self._idle_timeout:g} s"
        return None

    def _handle(self, msg: messages.Message) -> None:
        """A response or an event (requests go through _accept)."""
        if isinstance(msg, messages.Response):
            fut = self._pending.get(msg.id)
            if fut is not None and not fut.done():
                if msg.ok:
                    fut.set_result(msg.body)
                else:
                    fut.set_exception(RpcError(msg.error))
        elif isinstance(msg, messages.Event) and self._on_event is not None:
            self._spawn(self._event(msg))

    def _spawn(self, coro: Awaitable[None]) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        self._last_activity = time.monotonic()

    async def _event(self, msg: messages.Event) -> None:
        try:
            await self._on_event(msg.name, msg.body)
        except Exception:
            log.exception("event handler for %s from %s failed", msg.name, self.name)

    async def _serve(self, req: messages.Request) -> None:
        body = None
        if self._table is None:
            reply = messages.error_response(req.id, "this side serves no requests")
        else:
            try:
                body = await self._table.dispatch(req.method, req.body, self._context)
                reply = messages.response(req.id, body)
            except RequestError as exc:
                reply = messages.error_response(req.id, str(exc))
            except Exception as exc:
                if _failures.allow():
                    log.exception("handler %s failed for %s", req.method, self.name)
                reply = messages.error_response(req.id, f"internal error in {req.method}: {exc}")
        try:
            frame = encode_frame(reply)
        except ProtocolError as exc:  # reply too large to frame
            frame = encode_frame(messages.error_response(req.id, str(exc)))
        # Only the bytes wait to be read, not the objects they came from (a 10,000-row page held
        # ~65 MB until its peer read it); and a peer's unread replies fit its share's budget:
        # one that reads nothing pinned 2 GB with 32 small requests (eleventh audit).
        body = reply = None
        replies = self._share.replies if self._share is not None else None
        charge = await replies.take(len(frame)) if replies is not None else 0
        try:
            if not self.closed:
                await self._write(frame)
        except ConnectionLost:
            pass
        finally:
            if charge:
                replies.give(charge)

    def _shutdown(self, reason: str, *, abort: bool = False) -> None:
        if self._closed.is_set():
            return
        self.close_reason = reason
        self._closed.set()
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(ConnectionLost(f"connection to {self.name} lost: {reason}"))
        transport = getattr(self._writer, "transport", None)
        try:
            if abort and transport is not None:
                transport.abort()  # close() would keep the socket until a peer that reads nothing read it all
            else:
                self._writer.close()
        except Exception:
            pass

    async def close(self) -> None:
        self._shutdown("closed locally")
        for task in list(self._tasks):
            task.cancel()
