"""srun's step as srun sees it, wherever its tasks run: their output written as it comes (whole
lines, `-l` labels, -o/-e files: srun_output.py), their ends, the signals srun passes on, and
srun's report and exit code. srun.py runs it through this node's agent (inside a job),
srun_relay.py through the controller (salloc's srun, srun outside a job)."""
from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from typing import Any

from ..core.steps import StepRequest
from ..core.usertext import printable
from ..job.tasks import NodeTasks, describe_end
from ..transport.rpc import ConnectionLost, RpcConnection, RpcError
from .srun_output import Sinks

PROG = "srun"


def _env_count(name: str) -> int | None:
    v = os.environ.get(name, "")
    return int(v) if v.isdigit() and int(v) > 0 else None


def request_of(args: argparse.Namespace) -> StepRequest:
    """srun's options over its input variables, as Slurm's srun reads them."""
    return StepRequest(
        nodes=args.nodes or _env_count("SLURM_NNODES"),
        ntasks=args.ntasks or _env_count("SLURM_NTASKS"),
        ntasks_per_node=args.ntasks_per_node or _env_count("SLURM_NTASKS_PER_NODE"),
        cpus_per_task=args.cpus_per_task or _env_count("SLURM_CPUS_PER_TASK"),
        gpus_per_task=args.gpus_per_task or _env_count("SLURM_GPUS_PER_TASK"),
        nodelist=tuple(args.nodelist), exclude=tuple(args.exclude),
        overcommit=args.overcommit)  # -O, or SLURM_OVERCOMMIT (srun.main)


def kept_per_node(req: StepRequest) -> int | None:
    """The --ntasks-per-node (given, or the job's) that srun keeps and exports to its tasks as
    SLURM_NTASKS_PER_NODE: opt.c drops one that is not -n over -N (the tasks then see the job's)."""
    per = req.ntasks_per_node
    if per is None or req.ntasks is None or req.nodes is None or per == req.ntasks // req.nodes:
        return per
    return None


def error(message: str) -> None:
    print(f"{PROG}: error: {printable(message)}", file=sys.stderr)


class Step:
    """One step: its local tasks, the remote ones' output and ends as the agent passes them on."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.layout = None
        self.node = ""
        self.ends: dict[int, tuple[int | None, int | None]] = {}
        self.all_ended = asyncio.Event()
        self.width = 1
        self.sinks = Sinks(sys.stdout.buffer, sys.stderr.buffer)
        self.local: NodeTasks | None = None
        self.conn: RpcConnection | None = None
        self.killed = False
        self.interrupted = False  # by SIGINT/SIGTERM: the step ends CANCELLED
        self.early: list[tuple[str, Any]] = []
        self.next_seq: dict[int, int] = {}  # per remote task: the next output message expected
        self.tee = None  # inside a batch job: the copy of this node's tasks' output for sattach (srun_tee.py)

    def write(self, procid: int, stream: str, data: bytes) -> None:
        f = self.sinks.target(procid, stream)
        if f is None:  # -o none, or another task's number
            return
        if self.args.label:
            prefix = f"{procid:>{self.width}}: ".encode()
            lines = data.splitlines(keepends=True)
            data = b"".join(prefix + line for line in lines)
        try:
            f.write(data)
            f.flush()
        except (BrokenPipeError, OSError):
            pass

    async def on_local_output(self, procid: int, stream: str, data: bytes) -> None:
        self.write(procid, stream, data)
        if self.tee is not None:  # may wait a moment for room, as the other nodes' tasks' output does
            await self.tee.output(procid, stream, data)

    async def on_local_exit(self, procid: int, code: int | None, sig: int | None) -> None:
        if self.tee is not None:
            self.tee.exit(procid, code, sig)
        self.ended(procid, code, sig)

    def ended(self, procid: int, code: int | None, sig: int | None) -> None:
        self.ends[procid] = (code, sig)
        if (code or sig) and self.args.kill_on_bad_exit not in (None, "0") and not self.killed:
            self.killed = True
            asyncio.ensure_future(self.signal(signal.SIGKILL))
        if self.layout is not None and len(self.ends) == self.layout.ntasks:
            self.all_ended.set()

    async def on_event(self, name: str, body: Any) -> None:
        # no await before the write: events are handled in the order they came
        if self.layout is None:  # the other nodes' tasks began before the agent's answer reached us
            self.early.append((name, body))
            return
        self.handle(name, body)

    def started(self, layout) -> None:
        self.layout = layout
        self.width = len(str(layout.ntasks - 1))
        early, self.early = self.early, []
        for name, body in early:
            self.handle(name, body)

    def handle(self, name: str, body: Any) -> None:
        if not isinstance(body, dict) or body.get("step_id") != self.layout.step_id:
            return
        task = body.get("task")
        if not isinstance(task, int) or not 0 <= task < self.layout.ntasks:
            return
        if name == "output" and isinstance(body.get("data"), bytes) and body.get("stream") in ("out", "err"):
            seq = body.get("seq")
            if not isinstance(seq, int) or seq < self.next_seq.get(task, 0):
                return  # sent again after an agent restarted: we have it
            self.next_seq[task] = seq + 1
            self.write(task, body["stream"], body["data"])
        elif name == "exit":
            code, sig = body.get("exit_code"), body.get("signal")
            self.ended(task, code if isinstance(code, int) else None, sig if isinstance(sig, int) else None)

    def interrupt(self, sig: int) -> None:
        """srun was sent SIGINT or SIGTERM (scancel, Ctrl-C): passed on to every task."""
        self.interrupted = True
        asyncio.ensure_future(self.signal(sig))

    async def signal(self, sig: int) -> None:
        if self.local is not None:
            self.local.signal(sig)
        if self.conn is not None and not self.conn.closed and self.layout is not None:
            try:
                await self.conn.call("step_signal", {"job_id": self.layout.job_id, "step_id": self.layout.step_id,
                                                     "signal": int(sig)}, timeout=10)
            except (RpcError, ConnectionLost, asyncio.TimeoutError):
                pass


def job_open_mode() -> str | None:
    """The job's --open-mode (SLURM_OPEN_MODE, `a` or `t`, as slurmctld sets it): a step's files
    follow it unless srun is given its own."""
    return {"a": "append", "t": "truncate"}.get(os.environ.get("SLURM_OPEN_MODE", ""))


def stopped_by_agent() -> bool:
    """The job is being stopped (preempted, cancelled, out of time): its node's agent wrote the
    notice into $HAI_CONTROL_DIR and then signals every process of the job, srun's tasks too. A
    signal passed on by srun as well would reach them twice (submitit's handler, run again while it
    pickles its checkpoint, failed)."""
    control = os.environ.get("HAI_CONTROL_DIR")
    return bool(control) and any(os.path.exists(os.path.join(control, name)) for name in ("preempt", "terminate"))


def warn(args: argparse.Namespace, warnings) -> None:
    if not args.quiet:
        for w in warnings:
            print(f"{PROG}: Warning: {printable(str(w))}", file=sys.stderr)


def step_outcome(ends) -> tuple[int, int | None]:
    """The step's exit code for accounting, as Slurm's: the highest code of its tasks, and a fatal
    signal of one of them."""
    ends = list(ends)
    return (max((code or 0 for code, _sig in ends), default=0),
            max((sig for _code, sig in ends if sig), default=None))


def report(step: Step) -> int:
    """srun's error lines for the tasks that failed, and its exit code."""
    worst = 0
    layout = step.layout
    for procid in sorted(step.ends):
        code, sig = step.ends[procid]
        node = layout.nodes[layout.tasks[procid].node]
        line = describe_end(node, procid, code, sig)
        if line is not None:
            error(line)
        worst = max(worst, 128 + sig if sig else (code or 0))
    return worst
