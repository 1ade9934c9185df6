"""srun's step through the controller, for an srun with no node agent of its own: salloc's
command's srun, and srun outside a job once it has its allocation (controller/client_steps.py).

Every task runs on a step server, and its output and end are pushed to srun's connection; srun
writes them as srun inside a job does (srun.Step). srun's stdin goes to the tasks (Slurm's
default: to every task; -i/--input=none or a task id), a chunk at a time, the next once the last
is in; with --pty, task 0 runs on a terminal, this terminal is raw meanwhile, and its window size
follows this one's (SIGWINCH). A stdin that is a terminal is read only while srun is in its
foreground (an `srun ... &` leaves it to the shell, as Slurm's does).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import threading

from ..core.steps import StepIO, layout_from_wire
from ..core.usertext import printable
from ..protocol.steps import MAX_INPUT_CHUNK, request_to_wire
from ..transport.rpc import ConnectionLost, RpcError
from .allocation import Allocation, Controller, FINAL
from .rawtty import RawTerminal, window_size
from .srun_step import Step, error, job_open_mode, kept_per_node, report, request_of, step_outcome, warn
from .srun_output import SinkError

LATE_ENDS = 10.0  # seconds the tasks' ends may follow their allocation's end (a stop's grace aside)
REATTACH = 60.0  # seconds srun tries to reach a restarting controller again (its step waits as long)


class StdinReader:
    """srun's stdin (a terminal, a pipe or a file alike), read by a thread and handed over one
    chunk at a time: srun holds at most two (one being sent, one read)."""

    def __init__(self, fd: int = 0) -> None:
        self.fd = fd
        self.queue: asyncio.Queue[bytes] = asyncio.Queue(maxsize=1)
        self.loop = asyncio.get_running_loop()
        threading.Thread(target=self._read, name="stdin", daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.fd, MAX_INPUT_CHUNK)
            except OSError:
                data = b""
            try:
                asyncio.run_coroutine_threadsafe(self.queue.put(data), self.loop).result()
            except Exception:  # noqa: BLE001 - srun is ending: nobody takes it
                return
            if not data:
                return


def io_of(args: argparse.Namespace) -> StepIO:
    inp = args.input if args.input is not None else "all"
    if inp not in ("all", "none"):
        inp = int(inp)
    size = window_size(0) or window_size(1) or (24, 80)
    return StepIO(input=inp, pty=bool(args.pty), rows=size[0], cols=size[1], unbuffered=bool(args.unbuffered))


def reads_terminal() -> bool:
    """Whether srun may read its stdin: not a terminal, or one whose foreground srun is in."""
    try:
        return not os.isatty(0) or os.tcgetpgrp(0) == os.getpgrp()
    except OSError:
        return False


async def run_step(args: argparse.Namespace, ctl: Controller, alloc: Allocation, env: dict[str, str],
                   *, hold: bool) -> int:
    """Run srun's step in the allocation; srun's exit code. `hold`: the allocation is srun's own
    (its connection keeps it)."""
    job_id = alloc.job_id
    step = Step(args)
    step.conn = ctl.conn
    ctl.handlers.append(step.on_event)
    io = io_of(args)
    cwd = args.chdir or os.getcwd()
    if args.export.upper() == "NONE":
        env = {k: v for k, v in env.items() if k.startswith(("SLURM_", "HAI_"))}
    request = request_of(args)
    if (per_node := kept_per_node(request)) is not None:  # the step's count, as Slurm's srun exports it
        env = {**env, "SLURM_NTASKS_PER_NODE": str(per_node)}
    try:
        reply = await ctl.call("step_create", {"job_id": job_id, "request": request_to_wire(request),
                                               "argv": list(args.command), "cwd": cwd, "env": env,
                                               "io": io.to_wire()}, timeout=180)
        warn(args, reply.get("warnings") or ())
        if "refused" in reply:
            error(str(reply["refused"]))
            return 1
        layout = layout_from_wire(reply["layout"])
    except RpcError as exc:
        error(str(exc))
        return 1
    except (ConnectionLost, asyncio.TimeoutError, ValueError, KeyError, TypeError) as exc:
        error(f"the step could not be created: {exc or 'no answer from the controller'}")
        return 1
    try:
        step.sinks.route(layout, args.output, args.error, args.open_mode or job_open_mode(), cwd, env)
    except SinkError as exc:
        error(str(exc))
        await _done(ctl, job_id, layout.step_id, 1, None, False)
        return 1
    step.started(layout)
    try:
        await ctl.call("step_launch", {"job_id": job_id, "step_id": layout.step_id}, timeout=180)
    except (RpcError, ConnectionLost, asyncio.TimeoutError) as exc:
        error(str(exc) or "the step could not be launched")
        return 1
    with RawTerminal(0) if io.pty and os.isatty(0) and reads_terminal() else _nothing():
        await _follow(args, ctl, alloc, step, io, hold)
    step.sinks.close()
    return report(step)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


async def _follow(args, ctl: Controller, alloc: Allocation, step: Step, io: StepIO, hold: bool) -> None:
    """From the launch to the step's end: stdin, window size and signals go out, the allocation
    is watched (a scancel, its time limit, a lost node), a lost connection to the controller (its
    restart) is made again and the step taken back, and the end is recorded."""
    loop = asyncio.get_running_loop()
    layout = step.layout
    relayed = asyncio.Event()  # the connection carries the step (cleared while it is made again)
    relayed.set()
    helpers = []
    if io.pty or io.input != "none":
        helpers.append(asyncio.ensure_future(_stdin(ctl, step, io, relayed)))
    if io.pty:
        loop.add_signal_handler(signal.SIGWINCH, lambda: asyncio.ensure_future(_resize(ctl, step)))
    if not io.pty:  # on a terminal, Ctrl-C is a key like any other: it reaches the task's terminal
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, lambda s=sig: step.interrupt(s))
    else:
        loop.add_signal_handler(signal.SIGTERM, lambda: step.interrupt(signal.SIGTERM))
    for sig in (signal.SIGUSR1, signal.SIGUSR2):
        loop.add_signal_handler(sig, lambda s=sig: asyncio.ensure_future(step.signal(s)))
    watch = asyncio.ensure_future(alloc.ended(hold=hold))
    waiting = asyncio.ensure_future(step.all_ended.wait())
    try:
        while True:
            done, _ = await asyncio.wait([waiting, watch, ctl.runner], return_when=asyncio.FIRST_COMPLETED)
            if waiting in done or watch in done:
                break
            relayed.clear()
            reason = ctl.conn.close_reason
            if not await _reattach(ctl, step, io):
                error(f"lost the connection to the controller: {reason}")
                break
            step.conn = ctl.conn
            relayed.set()
        if waiting not in done:
            if watch in done:
                info = watch.result()
                _say(f"Job step aborted: the allocation ended ({info['state']}); waiting for its tasks")
            try:
                await asyncio.wait_for(step.all_ended.wait(), LATE_ENDS)
            except asyncio.TimeoutError:
                for t in layout.tasks:
                    step.ends.setdefault(t.procid, (None, signal.SIGKILL))
        if not ctl.conn.closed:
            await _done(ctl, layout.job_id, layout.step_id, *step_outcome(step.ends.values()), step.interrupted)
    finally:
        for task in (*helpers, watch, waiting):
            task.cancel()
        for sig in (signal.SIGWINCH, signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):
            loop.remove_signal_handler(sig)


async def _reattach(ctl: Controller, step: Step, io: StepIO) -> bool:
    """A new connection to the (restarted) controller, and the step taken back on it: what its
    tasks printed meanwhile waited for this and comes now."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + REATTACH
    while loop.time() < deadline:
        if not await ctl.reconnect(within=max(0.0, deadline - loop.time())):
            return False
        try:
            await ctl.call("step_attach", {"job_id": step.layout.job_id, "step_id": step.layout.step_id,
                                           "io": io.to_wire()}, timeout=30)
            return True
        except RpcError as exc:
            if "try again" not in str(exc):  # not a controller still starting: the step is gone
                error(f"the step could not be taken back: {exc}")
                return False
        except (ConnectionLost, asyncio.TimeoutError):
            pass
        await asyncio.sleep(0.5)
    return False


async def _stdin(ctl: Controller, step: Step, io: StepIO, relayed: asyncio.Event) -> None:
    """srun's stdin to the tasks; its end closes theirs (a terminal's never ends)."""
    if not reads_terminal():
        if not io.pty:
            await _input(ctl, step, b"", True, relayed)
        return
    reader = StdinReader(0)
    while True:
        data = await reader.queue.get()
        if not data and io.pty:
            return
        if not await _input(ctl, step, data, not data, relayed) or not data:
            return


async def _input(ctl: Controller, step: Step, data: bytes, eof: bool, relayed: asyncio.Event) -> bool:
    """One chunk to the tasks; across a controller restart it waits for the step to be taken back."""
    while True:
        try:
            await asyncio.wait_for(relayed.wait(), REATTACH)
            await ctl.call("step_input", {"job_id": step.layout.job_id, "step_id": step.layout.step_id,
                                          "data": data, "eof": eof}, timeout=None)
            return True
        except ConnectionLost:
            await asyncio.sleep(0.1)  # _follow sees the loss and makes the connection again
        except (RpcError, asyncio.TimeoutError):
            return False


async def _resize(ctl: Controller, step: Step) -> None:
    size = window_size(0) or window_size(1)
    if size is None:
        return
    try:
        await ctl.call("step_resize", {"job_id": step.layout.job_id, "step_id": step.layout.step_id,
                                       "rows": size[0], "cols": size[1]}, timeout=10)
    except (RpcError, ConnectionLost, asyncio.TimeoutError):
        pass


async def _done(ctl: Controller, job_id: int, step_id: int, code: int, sig, cancelled: bool) -> None:
    try:
        await ctl.call("step_done", {"job_id": job_id, "step_id": step_id, "exit_code": code, "signal": sig,
                                     "cancelled": cancelled}, timeout=10)
    except (RpcError, ConnectionLost, asyncio.TimeoutError):
        pass


def _say(text: str) -> None:
    print(f"srun: {printable(text)}", file=sys.stderr, flush=True)


__all__ = ["run_step", "FINAL"]
