"""sattach: attach to a running job step's output (and stdin), as Slurm's sattach does.

    sattach [options] <jobid.stepid>

It reaches any running step, from any host that reaches the controller's socket: those of
salloc's and srun's allocations (their tasks' output passes through the controller), and those
srun starts in a batch script (the other nodes' tasks' output passes through the controller; srun
copies its own node's there while someone is attached: srun_tee.py). It first shows the step's
recent output (the controller keeps its last 64 KiB, as slurmstepd replays its buffer), then what
the tasks print, until the step ends; it then says which tasks failed and exits with the highest
exit code, as Slurm's. Its stdin goes to the tasks of an allocation's step (--input-filter: one),
its end is not passed on (the step's stdin is srun's); a batch job's step is sent none (its tasks
read srun's stdin in the script), and --input-filter or --pty on one is refused. Ctrl-C (SIGINT) detaches, as Slurm's sattach dies of it: the step runs on. Only the
step's owner (and root) may attach; the controller checks it (controller/step_watch.py).

Words and exit codes are Slurm 22.05's, compared on the Slurm peer: an unknown job or a step that
is not running, `Could not get job step info: Invalid job id specified` (1); an ended job's,
`... Job/step already completing or completed` (1); an operand that is not JOB.STEP,
`Failed to parse stepid from command line options` and the usage line (1). Slurm lets anyone try
and then reports `Node X: no tasks running` (exit 0) for another user's step; here the controller
refuses it: `Could not get job step info: Access/permission denied` (1).
"""
from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from dataclasses import dataclass
from typing import Any

from .. import __version__
from ..core.hostlist import compress
from ..core.usertext import printable
from ..transport.rpc import ConnectionLost, RpcError
from .allocation import AllocationError, Controller
from .gnu_getopt import NO, REQUIRED, GetoptError, LongOption, getopt_long
from .rawtty import RawTerminal

PROG = "sattach"
REATTACH = 60.0  # seconds it tries to reach a restarting controller again
USAGE = "Usage: sattach [options] <jobid.stepid>\n"
HELP = USAGE + """      --input-filter=taskid  send stdin to only the specified task
      --output-filter=taskid only print stdout from the specified task
      --error-filter=taskid  only print stderr from the specified task
  -l, --label        prepend task number to lines of stdout & stderr
      --layout       print task layout info and exit (does not attach to tasks)
  -Q, --quiet        quiet mode (suppress informational messages)
  -v, --verbose      verbose mode (multiple -v's increase verbosity)
  -V, --version      print the Slurm version and exit

Help options:
  -h, --help         print this help message
  -u, --usage        print a brief usage message
"""
LONG_OPTIONS = [
    LongOption("input-filter", REQUIRED, "input-filter"), LongOption("output-filter", REQUIRED, "output-filter"),
    LongOption("error-filter", REQUIRED, "error-filter"), LongOption("label", NO, "l"),
    LongOption("layout", NO, "layout"), LongOption("pty", NO, "pty"), LongOption("quiet", NO, "Q"),
    LongOption("verbose", NO, "v"), LongOption("version", NO, "V"), LongOption("help", NO, "h"),
    LongOption("usage", NO, "u"),
]
STEP = re.compile(r"^(\d{1,10})\.(\d{1,10})$")
BATCH = -1  # Options.step_id of JOB.batch


class Exit(Exception):
    def __init__(self, code: int) -> None:
        self.code = code


@dataclass
class Options:
    job_id: int = 0
    step_id: int = 0
    input_filter: int | None = None
    output_filter: int | None = None
    error_filter: int | None = None
    label: bool = False
    layout: bool = False
    pty: bool = False
    quiet: bool = False
    verbose: int = 0


def error(text: str) -> None:
    print(f"{PROG}: error: {printable(text)}", file=sys.stderr, flush=True)


def parse(argv: list[str]) -> Options:
    """Slurm's sattach options (opt.c); Exit(code) for help, usage, version and wrong input."""
    try:
        opts, operands = getopt_long(PROG, argv, "hlQuvV", LONG_OPTIONS)
    except GetoptError as exc:
        print(printable(str(exc)), file=sys.stderr)
        print(f'Try "{PROG} --help" for more information', file=sys.stderr)
        raise Exit(1) from None
    o = Options()
    for key, value in opts:
        if key in ("input-filter", "output-filter", "error-filter"):
            if not value.isdigit() or int(value) > 0xFFFFFFFE:
                error(f'Invalid numeric value "{value}" for {key}.')
                raise Exit(1)
            setattr(o, key.replace("-", "_"), int(value))
        elif key == "l":
            o.label = True
        elif key == "layout":
            o.layout = True
        elif key == "pty":
            o.pty = True
        elif key == "Q":
            o.quiet = True
        elif key == "v":
            o.verbose += 1
        elif key == "V":
            print(f"hai-cluster {__version__}")
            raise Exit(0)
        elif key == "h":
            sys.stdout.write(HELP)
            raise Exit(0)
        elif key == "u":
            sys.stdout.write(USAGE)
            raise Exit(0)
    if o.pty and (o.input_filter, o.output_filter, o.error_filter) != (None, None, None):
        error("--pty is not compatible with --input-filter, --output-filter or --error-filter")
        raise Exit(1)
    if len(operands) != 1:  # none too: Slurm's words for both
        error("too many parameters")
        sys.stdout.write(USAGE)
        raise Exit(1)
    m = STEP.match(operands[0])
    if m is None and (b := re.match(r"^(\d{1,10})\.batch$", operands[0])):
        o.job_id, o.step_id = int(b.group(1)), BATCH  # follow the batch script's output (follow_batch.py)
        return o
    if m is None:
        error("Failed to parse stepid from command line options")
        sys.stdout.write(USAGE)
        raise Exit(1)
    o.job_id, o.step_id = int(m.group(1)), int(m.group(2))
    return o


def layout_text(layout: dict) -> str:
    """Slurm's print_layout_info(): the tasks of each node, each id followed by a space."""
    nodes, tasks = layout["nodes"], layout["tasks"]
    out = ["Job step layout:", f"\t{len(tasks)} tasks, {len(nodes)} nodes ({compress(list(nodes))})", ""]
    for i, name in enumerate(nodes):
        mine = [t for t, n in enumerate(tasks) if n == name]
        out.append(f"\tNode {i} ({name}), {len(mine)} task(s): " + "".join(f"{t} " for t in mine))
    return "\n".join(out) + "\n"


class Attached:
    """The step's output as it comes (the replay first), written as srun writes it."""

    def __init__(self, o: Options) -> None:
        self.o = o
        self.ntasks: int | None = None
        self.width = 1
        self.early: list[tuple[str, Any]] = []
        self.next_seq: dict[int, int] = {}
        self.end: dict | None = None
        self.ended = asyncio.Event()
        self.out, self.err = sys.stdout.buffer, sys.stderr.buffer

    def started(self, ntasks: int) -> None:
        self.ntasks = ntasks
        self.width = len(str(max(ntasks - 1, 0)))
        early, self.early = self.early, []
        for name, body in early:
            self.handle(name, body)

    async def on_event(self, name: str, body: Any) -> None:
        if self.ntasks is None:
            self.early.append((name, body))
        else:
            self.handle(name, body)

    def handle(self, name: str, body: Any) -> None:
        if not isinstance(body, dict) or body.get("step_id") != self.o.step_id:
            return
        if name == "watch_end":
            self.end = body
            self.ended.set()
        elif name == "watch_lost":
            if not self.o.quiet:
                print(f"{PROG}: {int(body.get('chunks') or 0)} chunk(s) of output were dropped: this sattach "
                      f"read too slowly", file=sys.stderr, flush=True)
        elif name == "output":
            task, seq, data, stream = body.get("task"), body.get("seq"), body.get("data"), body.get("stream")
            if not isinstance(task, int) or not 0 <= task < self.ntasks or not isinstance(seq, int) \
                    or not isinstance(data, bytes) or stream not in ("out", "err"):
                return
            if seq < self.next_seq.get(task, 0):
                return
            self.next_seq[task] = seq + 1
            self.write(task, stream, data)

    def write(self, task: int, stream: str, data: bytes) -> None:
        wanted = self.o.output_filter if stream == "out" else self.o.error_filter
        if wanted is not None and wanted != task:
            return
        if self.o.label:
            prefix = f"{task:>{self.width}}: ".encode()
            data = b"".join(prefix + line for line in data.splitlines(keepends=True))
        f = self.out if stream == "out" else self.err
        try:
            f.write(data)
            f.flush()
        except OSError:
            pass

    def report(self) -> int:
        """Slurm's _exit_handler: a line for each task that exited non-zero, the highest code (a
        task killed by a signal is said only with -v, and leaves the code as it is, as Slurm's)."""
        worst = 0
        for task, code, sig in self.end.get("exits") or []:
            if sig:
                if self.o.verbose:
                    print(f"{PROG}: task {int(task)} killed by signal {int(sig)}", file=sys.stderr)
            elif code:
                error(f"task {int(task)} exited with exit code {int(code)}")
                worst = max(worst, int(code))
        return worst


async def _watch(ctl: Controller, o: Options) -> dict:
    body = {"job_id": o.job_id, "step_id": o.step_id}
    if o.input_filter is not None or o.pty:  # asked for: a batch job's step refuses it (its stdin is srun's)
        body["input"] = True
    return await ctl.call("step_watch", body, timeout=60)


async def _stdin(ctl: Controller, o: Options, reply: dict, relayed: asyncio.Event) -> None:
    from .srun_relay import StdinReader, reads_terminal
    if not reads_terminal():
        return
    reader = StdinReader(0)
    task = 0 if reply.get("pty") else o.input_filter
    while True:
        data = await reader.queue.get()
        if not data:
            return  # its end stays here: the step's stdin is srun's to close
        while True:
            await relayed.wait()
            try:
                await ctl.call("watch_input", {"job_id": o.job_id, "step_id": o.step_id, "task": task,
                                               "data": data}, timeout=None)
                break
            except ConnectionLost:
                await asyncio.sleep(0.2)
            except RpcError:
                return


async def attach(o: Options) -> int:
    ctl = Controller()
    try:
        await ctl.connect()
    except AllocationError as exc:
        error(str(exc))
        return 1
    try:
        if o.layout:
            try:
                layout = await ctl.call("step_layout", {"job_id": o.job_id, "step_id": o.step_id})
            except RpcError as exc:
                error(str(exc))
                return 1
            sys.stdout.write(layout_text(layout))
            return 0
        if o.step_id == BATCH:
            from .follow_batch import follow
            return await follow(ctl, o)
        return await _attached(ctl, o)
    except (ConnectionLost, asyncio.TimeoutError) as exc:
        error(f"the controller did not answer: {exc or 'timeout'}")
        return 1
    finally:
        await ctl.close()


async def _attached(ctl: Controller, o: Options) -> int:
    seen = Attached(o)
    ctl.handlers.append(seen.on_event)
    try:
        reply = await _watch(ctl, o)
    except RpcError as exc:
        error(str(exc))
        return 1
    seen.started(len(reply["tasks"]))
    relayed = asyncio.Event()
    relayed.set()
    loop = asyncio.get_running_loop()
    detached = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(sig, lambda s=sig: (setattr(detached, "sig", s), detached.set()))
    pty = o.pty and reply.get("pty") and os.isatty(0)
    feeding = asyncio.ensure_future(_stdin(ctl, o, reply, relayed)) if o.pty or reply.get("input") != "none" else None
    with RawTerminal(0) if pty else _Nothing():
        try:
            while True:
                ending = asyncio.ensure_future(seen.ended.wait())
                stop = asyncio.ensure_future(detached.wait())
                done, _ = await asyncio.wait([ending, stop, ctl.runner], return_when=asyncio.FIRST_COMPLETED)
                ending.cancel()
                stop.cancel()
                if seen.ended.is_set() or detached.is_set():
                    break
                relayed.clear()  # the controller went away (a restart): attach again
                reason = ctl.conn.close_reason
                if not await _reattach(ctl, o, seen):
                    error(f"lost the connection to the controller ({reason}); stopped following step "
                          f"{o.job_id}.{o.step_id}")
                    return 1
                relayed.set()
        finally:
            if feeding is not None:
                feeding.cancel()
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                loop.remove_signal_handler(sig)
    if detached.is_set() and not seen.ended.is_set():
        # as Slurm's sattach: the signal ends it (the shell sees 128+N); the step runs on
        raise Exit(-getattr(detached, "sig", signal.SIGINT))
    return seen.report()


async def _reattach(ctl: Controller, o: Options, seen: Attached) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + REATTACH
    while loop.time() < deadline:
        if not await ctl.reconnect(within=max(0.0, deadline - loop.time())):
            return False
        try:
            await _watch(ctl, o)
            return True
        except RpcError as exc:
            if "try again" not in str(exc):
                error(f"step {o.job_id}.{o.step_id} could not be attached again: {exc}")
                return False
        except (ConnectionLost, asyncio.TimeoutError):
            pass
        await asyncio.sleep(0.5)
    return False


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


def main(argv: list[str] | None = None) -> int:
    try:
        o = parse(sys.argv[1:] if argv is None else argv)
        code = asyncio.run(attach(o))
        if code < 0:  # detached by a signal (JOB.batch): die of it
            raise Exit(code)
        return code
    except Exit as exc:
        if exc.code < 0:
            sys.stdout.flush()
            signal.signal(-exc.code, signal.SIG_DFL)
            os.kill(os.getpid(), -exc.code)
        return exc.code
    except KeyboardInterrupt:
        return 130
