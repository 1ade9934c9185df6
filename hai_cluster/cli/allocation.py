"""An interactive allocation as its client (salloc, srun outside a job) sees it: one connection to
the controller (controller/client_steps.py) that submits the job, waits for it with Slurm's
words, holds it (the connection's close ends it), watches it while the command or step runs,
and releases it with the exit code.

    salloc: Pending job allocation 12                 (only when it is not granted at once)
    salloc: job 12 queued and waiting for resources
    salloc: job 12 has been allocated resources
    salloc: Granted job allocation 12
    ...
    salloc: Relinquishing job allocation 12
    salloc: Job allocation 12 has been revoked.       (scancel; Slurm's words for its time limit:
    salloc: Job 12 has exceeded its time limit and its allocation has been revoked.)

srun prints only the queued and allocated lines, as Slurm's srun does.
"""
from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from ..core.usertext import printable
from ..paths import client_socket
from ..transport.rpc import ConnectionLost, RpcConnection, RpcError

FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL")
ALLOCATION_SCRIPT = "#!/bin/sh\n# an interactive allocation (salloc, srun): it runs no batch script\n"
QUICK = 1.0  # seconds a new allocation may take before the client says it waits
FIRST_POLL = 0.05  # while it may start any moment (a pass takes ~50 ms)
POLL = 0.5  # while pending
# While it runs: a scancel is pushed at once, a time limit or a lost node is seen within this; it
# also keeps the connection from being idle (and costs the store one read a session)
WATCH = 5.0
RETRY_WINDOW = 20.0  # seconds a lost submission's retry waits for a controller that restarts (hsubmit's)


class AllocationError(Exception):
    """Why the allocation could not be had: the text after `PROG: error: `."""


def slurm_words(text: str) -> str:
    """The controller's refusals name sbatch's failure; an allocation's are Slurm's salloc's."""
    return text.replace("Batch job submission failed: ", "Job submit/allocate failed: ")


class Controller:
    """The client's connection, with the controller's pushed events passed to `on_event`."""

    def __init__(self) -> None:
        self.conn: RpcConnection | None = None
        self.runner: asyncio.Future | None = None
        self.handlers: list = []
        self._reconnecting: asyncio.Lock | None = None

    async def connect(self) -> None:
        path = client_socket()
        try:
            reader, writer = await asyncio.open_unix_connection(path)
        except OSError as exc:
            raise AllocationError(f"cannot reach the controller at {path}: {exc.strerror or exc} "
                                  "(is hai-controller running? HAI_CONTROLLER names its socket)") from None
        self.conn = RpcConnection(reader, writer, on_event=self._event, name="controller")
        self.runner = asyncio.ensure_future(self.conn.run())

    async def reconnect(self, within: float) -> bool:
        """A new connection once the last one is lost (a controller restart), trying for up to
        `within` seconds; the callers hold what they held again (allocation, step_attach)."""
        self._reconnecting = self._reconnecting or asyncio.Lock()
        async with self._reconnecting:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + within
            while self.conn is None or self.conn.closed:
                if self.runner is not None:
                    self.runner.cancel()
                try:
                    await self.connect()
                except AllocationError:
                    if loop.time() >= deadline:
                        return False
                    await asyncio.sleep(0.5)
            return True

    async def _event(self, name: str, body: Any) -> None:
        for handler in self.handlers:
            await handler(name, body)

    async def call(self, method: str, body: Any, timeout: float | None = 60.0) -> Any:
        return await self.conn.call(method, body, timeout=timeout)

    async def close(self) -> None:
        if self.conn is not None:
            await self.conn.close()
        if self.runner is not None:
            self.runner.cancel()


class Allocation:
    def __init__(self, prog: str, ctl: Controller, *, quiet: bool = False) -> None:
        self.prog, self.ctl, self.quiet = prog, ctl, quiet
        self.job_id: int | None = None
        self.info: dict = {}
        self.revoked = asyncio.Event()  # the controller said it is ending it (scancel)
        ctl.handlers.append(self._on_event)

    async def _on_event(self, name: str, body: Any) -> None:
        if name == "revoked" and isinstance(body, dict) and body.get("job_id") == self.job_id:
            self.info = {**self.info, "state": str(body.get("state")), "ending": True}
            self.revoked.set()
        elif name == "notice" and isinstance(body, dict) and body.get("job_id") == self.job_id:
            # a warning (idle reclamation): shown even with --quiet, as Slurm shows its errors
            print(f"{self.prog}: {printable(str(body.get('text', '')))[:500]}", file=sys.stderr, flush=True)

    def say(self, text: str) -> None:
        if not self.quiet:
            print(f"{self.prog}: {printable(text)}", file=sys.stderr, flush=True)

    async def submit(self, option_args: list[str], *, immediate: bool, detached: bool = False) -> int:
        """The allocation's job. `detached` (salloc --no-shell): no client holds it, and the
        controller must not end it as one whose client is gone. A lost reply is asked again once,
        with the same idempotency key: the controller answers with the job it already made."""
        body = {"script": ALLOCATION_SCRIPT, "option_args": option_args, "script_args": [], "cwd": os.getcwd(),
                "env": dict(os.environ), "umask": _umask(), "script_name": "interactive", "interactive": True,
                "immediate": immediate, "detached": detached, "key": os.urandom(16).hex()}
        for retry in (False, True):
            try:
                reply = await self.ctl.call("submit", body)
                break
            except RpcError as exc:
                raise AllocationError(slurm_words(str(exc))) from None
            except (ConnectionLost, asyncio.TimeoutError) as exc:
                if retry or not await self.ctl.reconnect(RETRY_WINDOW):
                    raise AllocationError(f"the controller did not answer: {exc or 'timeout'}; the allocation may "
                                          f"have been made: check squeue") from None
        self.job_id = int(reply["job_id"])
        return self.job_id

    async def state(self, *, hold: bool = True, env: bool = False) -> dict:
        self.info = await self.ctl.call("allocation", {"job_id": self.job_id, "hold": hold, "env": env})
        return self.info

    async def granted(self, *, salloc: bool, within: float | None, hold: bool = True) -> dict:
        """Wait until the job runs: its state and (salloc's) variables. AllocationError if it ends
        first, or `within` seconds pass (--immediate=N: the job is cancelled)."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        said = False
        delay = 0.02
        while True:
            info = await self.state(hold=hold, env=True)
            if info["state"] == "RUNNING":
                if said:
                    self.say(f"job {self.job_id} has been allocated resources")
                if salloc:
                    self.say(f"Granted job allocation {self.job_id}")
                return info
            if info["state"] in FINAL:
                if salloc:
                    self.say(f"Job allocation {self.job_id} has been revoked.")
                self.say("Job has been cancelled" if info["state"] == "CANCELLED" else
                         f"Job ended before it started: {info['state']} ({info.get('reason') or 'no reason'})")
                what = "Job submit/allocate failed" if salloc else "Unable to allocate resources"
                raise AllocationError(f"{what}: Job/step already completing or completed")
            waited = loop.time() - start
            if within is not None and waited >= within:
                await self.cancel()
                raise AllocationError("Unable to allocate resources: Connection timed out")
            # the scheduler looked and could not start it (a pending reason), or it takes a while
            if not said and (waited >= QUICK or info.get("reason") not in (None, "None")):
                if salloc:
                    self.say(f"Pending job allocation {self.job_id}")
                self.say(f"job {self.job_id} queued and waiting for resources")
                said = True
            await asyncio.sleep(delay)
            delay = min(delay * 2, FIRST_POLL if waited < QUICK else POLL)

    async def ended(self, *, hold: bool = True) -> dict:
        """Return once the running job is ending or has left RUNNING (scancel, time limit, a
        node's loss): its state. Across a controller restart it asks again until one answers."""
        while True:
            try:
                await asyncio.wait_for(self.revoked.wait(), WATCH)
                return self.info
            except asyncio.TimeoutError:
                pass
            try:
                info = await self.state(hold=hold)
            except (RpcError, ConnectionLost, asyncio.TimeoutError):
                await self.reconnect()  # the next pass asks again (and holds the job again)
                continue
            if info["state"] != "RUNNING" or info.get("ending"):
                return info

    async def still_running(self) -> dict | None:
        """None while the job runs and nobody ends it; else its state (a revocation that came
        with the command's end: its steps were killed first)."""
        if self.revoked.is_set():
            return self.info
        try:
            info = await self.state()
        except (RpcError, ConnectionLost, asyncio.TimeoutError):
            return None
        return info if info["state"] != "RUNNING" or info.get("ending") else None

    async def reconnect(self) -> bool:
        """After a lost connection (a controller restart): a new one; the next poll holds the job again."""
        return await self.ctl.reconnect(within=0)

    async def release(self, code: int) -> None:
        """The command ended with `code`: so does the allocation (COMPLETED, or FAILED with it)."""
        try:
            await self.ctl.call("release_allocation", {"job_id": self.job_id, "exit_code": max(0, min(255, code))})
        except (RpcError, ConnectionLost, asyncio.TimeoutError) as exc:
            print(f"{self.prog}: error: releasing job allocation {self.job_id} failed: {printable(str(exc))}",
                  file=sys.stderr)

    async def cancel(self) -> None:
        try:
            await self.ctl.call("cancel", {"ids": [self.job_id]})
        except (RpcError, ConnectionLost, asyncio.TimeoutError):
            pass


def revoked_message(job_id: int, info: dict) -> str:
    """salloc's words for an allocation that ended under its command."""
    if info.get("state") == "TIMEOUT":
        return f"Job {job_id} has exceeded its time limit and its allocation has been revoked."
    if info.get("state") == "NODE_FAIL":
        return f"Job allocation {job_id} has been revoked: node failure ({info.get('reason') or 'a node was lost'})"
    return f"Job allocation {job_id} has been revoked."


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
