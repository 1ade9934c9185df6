"""sattach's tee: a running step's output, copied to the connections attached to it.

A client's step (salloc's srun, srun outside a job: client_steps.py) has every task's output
pass through the controller (steps.py `_to_client`); each chunk is also teed here, to every
attached sattach, and kept in a short replay buffer, so an attacher first sees the step's recent
output, as Slurm's slurmstepd replays its buffer to a new sattach. A batch job's step has its
other nodes' tasks' output pass through here on its way to srun (steps.py `output`), teed alike;
srun's own node's tasks' output reaches the controller only while someone is attached: srun
copies it then (cli/srun_tee.py, with its own replay, merged in here by time: `merge`).

Bounds: a step keeps REPLAY_BYTES of recent output and has at most MAX_WATCHERS attachers; each
attacher has at most WATCH_QUEUED bytes waiting to be written to it. A chunk that finds no room
waits for it a moment (TEE_WAIT: an attacher that keeps up slows the step a little, as a slow
sattach slows a Slurm step, rather than lose output); an attacher still full then is lagging and
loses chunks (counted, and said to it) with no more waiting until it has caught up: a stopped
sattach costs the step one such wait, never a queue. Tasks' ends are kept apart (a few integers) and sent with
the step's end, so they are never dropped. (The requests: step_watch.py.)
"""
from __future__ import annotations

import asyncio
import collections
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..transport.rpc import ConnectionLost

if TYPE_CHECKING:
    from .steps import LiveStep

MAX_WATCHERS = 8  # sattach clients on one step at once
REPLAY_BYTES = 64 * 1024  # recent output a step keeps for a new attacher
WATCH_QUEUED = 512 * 1024  # output waiting to be written to one attacher; more is dropped for it
OFFER_WAIT = 10.0  # seconds one event may wait for room in the attacher's socket
OFFER_BUFFERED = 256 * 1024  # bytes unread by the attacher in its socket before we wait
# An attacher that keeps up holds the step back a little rather than lose its output: a chunk
# waits up to TEE_WAIT for room in its queue. One that still has none is lagging (stopped, or
# slower than the step): it loses chunks, with no more waiting, until its queue is half empty.
TEE_WAIT = 1.0


@dataclass(eq=False)
class Watcher:
    """One attached connection: what waits to be written to it, and its writer task."""
    conn: Any
    key: tuple[int, int]
    uid: int
    queue: collections.deque = field(default_factory=collections.deque)  # (kind, message, size)
    queued: int = 0
    lost: int = 0  # output chunks dropped for it since it last heard so
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    writer: asyncio.Task | None = None
    closed: bool = False
    lagging: bool = False
    room: asyncio.Event = field(default_factory=asyncio.Event)  # set as its queue shrinks

    def fits(self, size: int) -> bool:
        return self.queued + size <= (WATCH_QUEUED // 2 if self.lagging else WATCH_QUEUED)

    async def offer(self, message: dict, size: int) -> None:
        """A task's output: queued; else waited for (TEE_WAIT, unless it lags); else lost to it."""
        if not self.fits(size) and not self.lagging and not self.closed:
            deadline = asyncio.get_running_loop().time() + TEE_WAIT
            while not self.fits(size) and not self.closed:
                self.room.clear()
                left = deadline - asyncio.get_running_loop().time()
                try:
                    await asyncio.wait_for(self.room.wait(), max(left, 0))
                except asyncio.TimeoutError:
                    break
        if not self.fits(size):
            self.lagging = True
            self.lost += 1
            return
        self.lagging = False
        self.put("output", message, size)

    def put(self, kind: str, message: dict, size: int, *, must: bool = False) -> None:
        if self.closed:
            return
        if not must and self.queued + size > WATCH_QUEUED:
            self.lost += 1
            return
        if self.lost:
            self.queue.append(("watch_lost", {"step_id": self.key[1], "chunks": self.lost}, 0))
            self.lost = 0
        self.queue.append((kind, message, size))
        self.queued += size
        self.ready.set()

    async def run(self) -> None:
        try:
            while not self.closed:
                await self.ready.wait()
                self.ready.clear()
                while self.queue:
                    kind, message, size = self.queue[0]
                    if not await self.conn.offer(kind, message, OFFER_WAIT, OFFER_BUFFERED):
                        continue  # offered again: it is bounded by WATCH_QUEUED meanwhile
                    self.queue.popleft()
                    self.queued -= size
                    self.room.set()
                    if kind == "watch_end":
                        self.closed = True
                        return
        except (ConnectionLost, asyncio.CancelledError):
            pass
        finally:
            self.closed = True
            self.queue.clear()
            self.room.set()


@dataclass(eq=False)
class StepWatch:
    """A client step's attachers, its recent output and its tasks' ends (LiveStep.watch)."""
    watchers: list[Watcher] = field(default_factory=list)
    recent: collections.deque = field(default_factory=collections.deque)  # (time, output message), oldest first
    recent_bytes: int = 0
    next_seq: dict[int, int] = field(default_factory=dict)  # per task: a chunk offered again is teed once
    exits: dict[int, tuple[Any, Any]] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # a batch step: starting or stopping srun's copy


def _watch(live: "LiveStep") -> StepWatch:
    if live.watch is None:
        live.watch = StepWatch()
    return live.watch


def _keep(w: StepWatch, task: int, message: dict, at: float) -> bool:
    """Into the replay buffer, unless it was teed already (offered again); whether it is new."""
    seq = message["seq"]
    if seq < w.next_seq.get(task, 0):
        return False
    w.next_seq[task] = seq + 1
    data = message["data"]
    kept = {**message, "data": data[-REPLAY_BYTES:]} if len(data) > REPLAY_BYTES else message
    w.recent.append((at, kept))
    w.recent_bytes += len(kept["data"])
    while w.recent_bytes > REPLAY_BYTES:
        w.recent_bytes -= len(w.recent.popleft()[1]["data"])
    return True


async def tee(live: "LiveStep", kind: str, message: dict, *, at: float | None = None) -> None:
    """A task's output or end on its way to the step's client (or srun): kept, and copied to the
    attachers. `at`: when it was read (srun's copy), else now."""
    w = _watch(live)
    task = message["task"]
    if kind == "exit":
        w.exits[task] = (message["exit_code"], message["signal"])
        return
    if not _keep(w, task, message, time.time() if at is None else at):
        return  # offered again (its client was busy): teed already
    w.watchers = [x for x in w.watchers if not x.closed]
    for watcher in list(w.watchers):
        await watcher.offer(message, len(message["data"]))


def merge(live: "LiveStep", events) -> None:
    """srun's replay of its own tasks (protocol.steps.TeeEvent): into the replay buffer, in time
    order with the other nodes' output (before any attacher of this copy is given it)."""
    w = _watch(live)
    present = {(m["task"], m["seq"]) for _at, m in w.recent}  # srun's first copies may have come first
    for e in events:
        task = e.message["task"]
        if e.kind == "exit":
            w.exits[task] = (e.message["exit_code"], e.message["signal"])
        elif (task, e.message["seq"]) not in present:
            w.recent.append((e.at, e.message))
            w.recent_bytes += len(e.message["data"])
            w.next_seq[task] = max(w.next_seq.get(task, 0), e.message["seq"] + 1)
    w.recent = collections.deque(sorted(w.recent, key=lambda kept: kept[0]))
    while w.recent_bytes > REPLAY_BYTES:
        w.recent_bytes -= len(w.recent.popleft()[1]["data"])


def replay(live: "LiveStep") -> list[dict]:
    return [message for _at, message in _watch(live).recent]


def lost(live: "LiveStep", chunks: int) -> None:
    """srun dropped chunks of its copy (its queue was full): every attacher is told."""
    if chunks and live.watch is not None:
        for watcher in live.watch.watchers:
            watcher.lost += chunks


def watched(live: "LiveStep") -> bool:
    w = live.watch
    return w is not None and any(not x.closed for x in w.watchers)


def held(live: "LiveStep") -> bool:
    """A batch step's routing stays while it has attachers, or srun's copy is on or being started."""
    return watched(live) or live.teeing or (live.watch is not None and live.watch.lock.locked())


def ended(live: "LiveStep", key: tuple[int, int], state: str, code: int | None, sig: int | None) -> None:
    """The step's end: every attacher hears it, with the tasks' ends, and is let go."""
    w = live.watch
    if w is None:
        return
    end = {"step_id": key[1], "state": state, "exit_code": code, "signal": sig,
           "exits": [[t, c, s] for t, (c, s) in sorted(w.exits.items())]}
    for watcher in w.watchers:
        watcher.put("watch_end", end, 0, must=True)
    w.watchers.clear()


def drop(link: Any) -> set[tuple[int, int]]:
    """A connection closed: its attachments go. The steps they were attached to."""
    keys = set()
    for watcher in list(getattr(link, "watches", ())):
        watcher.closed = True
        watcher.ready.set()
        keys.add(watcher.key)
    link.watches.clear()
    return keys
