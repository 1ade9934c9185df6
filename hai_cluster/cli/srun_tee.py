"""srun's copy of its own node's tasks' output for sattach, inside a batch job.

srun in a batch script runs its node's tasks itself (srun.py): their output never leaves it. The
other nodes' tasks' output passes through the controller, which tees it to sattach
(controller/step_tee.py). For the rest, while a sattach is attached the controller asks this
srun (through its node's agent: `tee` on srun's connection) to copy its tasks' output and ends
to it as well, as slurmstepd replays its buffer to a new sattach and copies on from there.

Bounds: srun keeps the last REPLAY_BYTES of its tasks' output (for the replay) whether or not
anyone is attached; it sends nothing unless asked, at most QUEUED bytes wait to be sent, and one
batch of at most MAX_TEE_BYTES is in flight at a time. Lag is handled as the controller handles
it for its attachers (step_tee.Watcher.offer): a chunk that finds the queue full waits for room
up to TEE_WAIT (srun reads its tasks' pipes a little later: an attacher that keeps up slows the
step a little rather than lose output); one still full then is lagging, and chunks are dropped,
with no more waiting, until the queue is half empty (the count goes with the next batch, so the
attachers are told).
"""
from __future__ import annotations

import asyncio
import collections
import time
from typing import Any

from ..protocol.runspec import check_keys
from ..protocol.steps import MAX_TEE_BYTES, MAX_TEE_EVENTS
from ..transport.rpc import ConnectionLost, RpcConnection, RpcError, RpcTable, refusing

REPLAY_BYTES = 64 * 1024  # as the controller keeps of the other nodes' tasks (step_tee.REPLAY_BYTES)
QUEUED = 512 * 1024  # output waiting to be sent to the agent
TEE_WAIT = 1.0  # as the controller's (step_tee.TEE_WAIT): a chunk waits this long for room, unless lagging
SEND_TIMEOUT = 60.0
FLUSH_WAIT = 10.0  # at the step's end: how long srun waits for its last copies to be taken


class LocalTee:
    def __init__(self, job_id: int) -> None:
        self.job_id = job_id
        self.step_id: int | None = None  # once the step is created
        self.conn: RpcConnection | None = None
        self.recent: collections.deque[dict] = collections.deque()  # wire events, oldest first
        self.recent_bytes = 0
        self.exits: dict[int, dict] = {}
        self.seq: dict[int, int] = {}
        self.on = False
        self.queue: collections.deque[dict] = collections.deque()
        self.queued = 0
        self.lost = 0
        self.lagging = False
        self.room = asyncio.Event()  # set as the queue shrinks
        self.ready = asyncio.Event()
        self.idle = asyncio.Event()  # nothing queued or in flight
        self.idle.set()
        self.sender: asyncio.Task | None = None

    def table(self) -> RpcTable:
        """What srun's node's agent may ask srun: start or stop the copy."""
        table = RpcTable()

        async def tee(body: Any, _ctx: Any) -> dict:
            check_keys("tee body", body, ("step_id", "on"))
            if self.step_id is None or body["step_id"] != self.step_id or not isinstance(body["on"], bool):
                raise ValueError(f"this srun runs no step {self.job_id}.{body['step_id']}")
            return self.subscribe(body["on"])

        table.add("tee", refusing(tee, ValueError))
        return table

    def subscribe(self, on: bool) -> dict:
        """On: the replay (recent output and the ends so far), then every new event is sent.
        Off: nothing more is sent."""
        self.on = on
        if not on:
            self.queue.clear()
            self.queued = self.lost = 0
            self.lagging = False
            self.room.set()
            self.idle.set()
            return {"events": []}
        if self.sender is None or self.sender.done():
            self.sender = asyncio.ensure_future(self._send())
        return {"events": [*self.recent, *self.exits.values()][-MAX_TEE_EVENTS:]}

    def fits(self, size: int) -> bool:
        return self.queued + size <= (QUEUED // 2 if self.lagging else QUEUED)

    async def output(self, task: int, stream: str, data: bytes) -> None:
        seq = self.seq.get(task, 0)
        self.seq[task] = seq + 1
        event = {"kind": "output", "at": time.time(), "task": task, "seq": seq, "stream": stream, "data": data}
        kept = event if len(data) <= REPLAY_BYTES else {**event, "data": data[-REPLAY_BYTES:]}
        self.recent.append(kept)
        self.recent_bytes += len(kept["data"])
        while self.recent_bytes > REPLAY_BYTES or len(self.recent) > MAX_TEE_EVENTS // 2:
            self.recent_bytes -= len(self.recent.popleft()["data"])
        if not self.on:
            return
        if not self.fits(len(data)) and not self.lagging:
            deadline = asyncio.get_running_loop().time() + TEE_WAIT
            while self.on and not self.fits(len(data)):
                self.room.clear()
                try:
                    await asyncio.wait_for(self.room.wait(), max(deadline - asyncio.get_running_loop().time(), 0))
                except asyncio.TimeoutError:
                    break
        if not self.on:
            return
        if not self.fits(len(data)):
            self.lagging = True
            self.lost += 1
            return
        self.lagging = False
        self._put(event, len(data))

    def exit(self, task: int, code: int | None, sig: int | None) -> None:
        event = {"kind": "exit", "at": time.time(), "task": task, "exit_code": code, "signal": sig}
        self.exits[task] = event
        if self.on:
            self._put(event, 0)  # a few integers: never dropped

    def _put(self, event: dict, size: int) -> None:
        self.queue.append(event)
        self.queued += size
        self.idle.clear()
        self.ready.set()

    def _batch(self) -> tuple[list[dict], int]:
        events, size = [], 0
        while self.queue and len(events) < MAX_TEE_EVENTS:
            n = len(self.queue[0].get("data", b""))
            if events and size + n > MAX_TEE_BYTES:
                break
            events.append(self.queue.popleft())
            size += n
        return events, size

    async def _send(self) -> None:
        """One batch at a time to the agent, while the copy is wanted (the controller's answer
        says when no attacher is left, e.g. after its restart)."""
        while self.on:
            await self.ready.wait()
            self.ready.clear()
            while self.queue and self.on:
                events, size = self._batch()
                lost, self.lost = self.lost, 0
                try:
                    reply = await self.conn.call("step_tee_data", {"job_id": self.job_id, "step_id": self.step_id,
                                                                   "lost": lost, "events": events},
                                                 timeout=SEND_TIMEOUT)
                except (RpcError, ConnectionLost, asyncio.TimeoutError):
                    reply = {"wanted": False}
                self.queued = max(self.queued - size, 0)
                self.room.set()
                if not (isinstance(reply, dict) and reply.get("wanted")):
                    self.subscribe(False)
            if not self.queue:
                self.idle.set()

    async def flush(self) -> None:
        """The step ends: what is queued reaches the attachers before its end is reported."""
        if self.on:
            try:
                await asyncio.wait_for(self.idle.wait(), FLUSH_WAIT)
            except asyncio.TimeoutError:
                pass
        self.on = False
        if self.sender is not None:
            self.sender.cancel()
