"""`sattach JOB.batch`: follow a batch job's output from the submit host, from the beginning of its
--output file to the job's end, whose exit code it exits with. The bytes come through the
controller from the job's first node (controller/follow.py, agent/follow.py): the submit host
need not see the node's file system. (Slurm 22.05's sattach takes the operand and then fails
with protocol errors: it cannot attach to a batch step; `tail -f` on a shared file system is what
its users do.)

A pending job is waited for; a requeued one (preempted, `scontrol requeue`) is followed into its
next run, from the byte reached (its file continues, as a requeued job's does). A controller
restart is bridged: the follow is asked for again from the byte reached, for up to REATTACH
seconds; past that sattach says where it stopped and exits 1. Ctrl-C stops following (the job
runs on).
"""
from __future__ import annotations

import asyncio
import signal
import sys
from typing import Any

from ..core.states import FINAL_STATES
from ..core.usertext import printable
from ..transport.rpc import ConnectionLost, RpcError
from .allocation import Controller

PROG = "sattach"
REATTACH = 60.0
PENDING_POLL = 2.0
FINAL = {s.value for s in FINAL_STATES}


class Follow:
    def __init__(self, job_id: int, quiet: bool) -> None:
        self.job_id, self.quiet = job_id, quiet
        self.offset = 0  # bytes of the file written out so far
        self.end: dict | None = None
        self.ended = asyncio.Event()
        self.out = sys.stdout.buffer

    async def on_event(self, name: str, body: Any) -> None:
        if not isinstance(body, dict) or body.get("job_id") != self.job_id:
            return
        if name == "follow_data" and isinstance(body.get("data"), bytes):
            data = body["data"]
            try:
                self.out.write(data)
                self.out.flush()
            except OSError:
                pass
            self.offset += len(data)
        elif name == "follow_end":
            self.end = body
            self.ended.set()

    def say(self, text: str) -> None:
        if not self.quiet:
            print(f"{PROG}: {printable(text)}", file=sys.stderr, flush=True)


def _error(text: str) -> None:
    print(f"{PROG}: error: {printable(text)}", file=sys.stderr, flush=True)


async def follow(ctl: Controller, o) -> int:
    f = Follow(o.job_id, o.quiet)
    ctl.handlers.append(f.on_event)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(sig, lambda s=sig: (setattr(stop, "sig", s), stop.set()))
    said_pending = False
    starting_until = loop.time() + REATTACH
    try:
        while True:
            try:
                reply = await ctl.call("output_follow", {"job_id": o.job_id, "offset": f.offset}, timeout=60)
            except RpcError as exc:
                if "try again" in str(exc) and loop.time() < starting_until:  # a controller that is starting
                    if await _wait(stop, 0.5):
                        break
                    continue
                _error(str(exc))
                return 1
            except (ConnectionLost, asyncio.TimeoutError) as exc:
                if not await _back(ctl, f, exc):
                    return 1
                starting_until = loop.time() + REATTACH
                continue
            if "node" not in reply:  # not followed (yet): pending, between runs, its node not back
                if not said_pending:
                    waiting = reply.get("waiting")
                    f.say(f"{waiting}: waiting for it" if waiting else
                          f"job {o.job_id} is {reply.get('state')}: waiting for it to run")
                    said_pending = True
                if await _wait(stop, PENDING_POLL):
                    break
                continue
            said_pending = False
            f.ended.clear()
            ending = asyncio.ensure_future(f.ended.wait())
            stopping = asyncio.ensure_future(stop.wait())
            done, _ = await asyncio.wait([ending, stopping, ctl.runner], return_when=asyncio.FIRST_COMPLETED)
            ending.cancel()
            stopping.cancel()
            if stop.is_set():
                break
            if not f.ended.is_set():  # the controller went away (a restart): ask again from here
                if not await _back(ctl, f, ctl.conn.close_reason):
                    return 1
                starting_until = loop.time() + REATTACH
                continue
            end = f.end
            if end.get("error"):
                _error(f"the output of job {o.job_id} could not be read on its node: {end['error']}")
                return 1
            state = str(end.get("state"))
            if state in FINAL or state == "UNKNOWN":
                return _report(o.job_id, end)
            f.say(f"job {o.job_id} was requeued ({state}): following its next run")
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.remove_signal_handler(sig)
    return -getattr(stop, "sig", signal.SIGINT)  # sattach dies of the signal (the job runs on)


async def _wait(stop: asyncio.Event, seconds: float) -> bool:
    try:
        await asyncio.wait_for(stop.wait(), seconds)
        return True
    except asyncio.TimeoutError:
        return False


async def _back(ctl: Controller, f: Follow, reason) -> bool:
    if await ctl.reconnect(within=REATTACH):
        return True
    _error(f"lost the connection to the controller ({reason or 'no answer'}); stopped following job "
           f"{f.job_id}'s output after {f.offset} bytes")
    return False


def _report(job_id: int, end: dict) -> int:
    """The job's end as its exit code: the script's, 128+N for a signal, 1 for an end with none."""
    state, code, sig = str(end.get("state")), end.get("exit_code"), end.get("signal")
    code = code if isinstance(code, int) else 0
    sig = sig if isinstance(sig, int) else 0
    if state == "COMPLETED" and not code and not sig:
        return 0
    _error(f"batch job {job_id} ended {state}, exit code {code}:{sig}")
    return 128 + sig if sig else (code or 1)
