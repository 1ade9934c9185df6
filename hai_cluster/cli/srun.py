"""srun inside a job: start a job step of tasks across the allocation, as Slurm's srun does.

    srun [options] command [args...]

It asks its node's agent ($HAI_STEP_SOCKET) for the step; the controller lays the tasks out
(core/steps.py) and has the other nodes' step servers start theirs, while this srun starts the
ones of its own node. Every task's stdout and stderr come out of srun's, in whole lines (`-l`
puts the task's rank before each); srun exits with the highest exit code of its tasks (128+N for
one killed by signal N); -o/-e send it to files instead (cli/srun_output.py). SIGINT, SIGTERM,
SIGUSR1 and SIGUSR2 are passed to every task (USR1/USR2 not while the agent stops the job: it
signals the tasks itself). As Slurm's srun, it takes its defaults from the job: SLURM_NNODES,
SLURM_NTASKS, SLURM_NTASKS_PER_NODE, SLURM_CPUS_PER_TASK, SLURM_OPEN_MODE.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from typing import Any

from ..core.hostlist import expand
from ..core.steps import StepRequest, layout_from_wire, task_environment
from ..core.usertext import printable
from ..job.tasks import NodeTasks, describe_end
from ..protocol.steps import request_to_wire
from ..transport.rpc import ConnectionLost, RpcConnection, RpcError
from .srun_output import OPEN_MODES, SinkError, Sinks

PROG = "srun"
class Usage(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:
        raise Usage(message)


def _count(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"invalid count {text!r}")
    return int(text)


def _names(text: str) -> list[str]:
    try:
        return expand(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"invalid node list {text!r}: {exc}") from None


def _open_mode(text: str) -> str:
    if text.lower() not in OPEN_MODES:
        raise argparse.ArgumentTypeError(f"invalid --open-mode {text!r} (append or truncate)")
    return text.lower()


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, add_help=True, allow_abbrev=False,
                usage="srun [OPTIONS] executable [args...]")
    p.add_argument("-N", "--nodes", type=_count)
    p.add_argument("-n", "--ntasks", type=_count)
    p.add_argument("--ntasks-per-node", type=_count)
    p.add_argument("-c", "--cpus-per-task", type=_count)
    p.add_argument("--gpus-per-task", type=_count)
    p.add_argument("-w", "--nodelist", type=_names, default=[])
    p.add_argument("-x", "--exclude", type=_names, default=[])
    p.add_argument("-l", "--label", action="store_true")
    p.add_argument("-K", "--kill-on-bad-exit", nargs="?", const="1", default=None)
    p.add_argument("-W", "--wait", type=int, default=None)
    p.add_argument("-D", "--chdir")
    p.add_argument("--jobid", type=_count)
    p.add_argument("-u", "--unbuffered", action="store_true")
    p.add_argument("-J", "--job-name")
    p.add_argument("--export", default="ALL")
    p.add_argument("-Q", "--quiet", action="store_true")
    p.add_argument("-v", "--verbose", action="count", default=0)
    for flag in ("--exact", "--exclusive", "--overlap"):
        p.add_argument(flag, action="store_true")
    p.add_argument("-o", "--output")
    p.add_argument("-e", "--error")
    p.add_argument("--open-mode", type=_open_mode)
    for opt in ("--mpi", "--cpu-bind", "--hint", "--gpu-bind", "-m", "--mem-bind"):
        p.add_argument(opt)
    p.add_argument("command", nargs=argparse.REMAINDER)
    return p


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
        nodelist=tuple(args.nodelist), exclude=tuple(args.exclude))


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

    async def on_local_exit(self, procid: int, code: int | None, sig: int | None) -> None:
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


async def run(args: argparse.Namespace, job_id: int, socket_path: str) -> int:
    step = Step(args)
    try:
        reader, writer = await asyncio.open_unix_connection(socket_path)
    except OSError as exc:
        error(f"cannot reach this node's agent at {socket_path}: {exc.strerror or exc}")
        return 1
    conn = step.conn = RpcConnection(reader, writer, on_event=step.on_event, name="agent")
    runner = asyncio.ensure_future(conn.run())
    cwd = args.chdir or os.getcwd()
    env = dict(os.environ) if args.export.upper() != "NONE" else {
        k: v for k, v in os.environ.items() if k.startswith("SLURM_") or k.startswith("HAI_")}
    request = request_of(args)
    if (per_node := kept_per_node(request)) is not None:  # the step's count, as Slurm's srun exports it
        env["SLURM_NTASKS_PER_NODE"] = str(per_node)
    try:
        reply = await conn.call("step_create", {"job_id": job_id, "request": request_to_wire(request),
                                                "argv": list(args.command), "cwd": cwd, "env": env}, timeout=180)
        warn(args, reply.get("warnings") or ())
        if "refused" in reply:
            error(str(reply["refused"]))
            runner.cancel()
            return 1
        layout = layout_from_wire(reply["layout"])
        step.node = str(reply["node"])
        master = str(reply["master_addr"])
    except RpcError as exc:
        error(str(exc))
        runner.cancel()
        return 1
    except (ConnectionLost, asyncio.TimeoutError, ValueError, KeyError, TypeError) as exc:
        error(f"the step could not be created: {exc or 'no answer from the agent'}")
        runner.cancel()
        return 1
    try:
        step.sinks.route(layout, args.output, args.error, args.open_mode or job_open_mode(),
                         args.chdir or os.getcwd(), os.environ)
    except SinkError as exc:  # the other nodes' tasks have started: they go, the step failed
        error(str(exc))
        step.layout = layout
        await step.signal(signal.SIGKILL)
        await _done(conn, job_id, layout.step_id, 1, None, False)
        await conn.close()
        runner.cancel()
        return 1
    step.started(layout)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, lambda s=sig: step.interrupt(s))
    for sig in (signal.SIGUSR1, signal.SIGUSR2):  # passed on as well, as Slurm's: `kill -USR1 $srun_pid`
        loop.add_signal_handler(sig, lambda s=sig: None if stopped_by_agent() else asyncio.ensure_future(step.signal(s)))
    mine = layout.on(step.node)
    step.local = NodeTasks(step.on_local_output, step.on_local_exit)
    await step.local.start(args.command, cwd, [(t.procid, task_environment(env, os.environ, layout, t, master))
                                               for t in mine])
    waiting = asyncio.ensure_future(step.all_ended.wait())
    done, _ = await asyncio.wait([waiting, runner], return_when=asyncio.FIRST_COMPLETED)
    if waiting not in done:  # the agent went away: our own tasks still end, the others' news is lost
        error(f"lost the connection to node {step.node}'s agent: {conn.close_reason}")
        await step.local.wait()
        waiting.cancel()
        for t in layout.tasks:
            step.ends.setdefault(t.procid, (None, signal.SIGKILL))
    else:
        await _done(conn, job_id, layout.step_id, *step_outcome(step.ends.values()), step.interrupted)
    step.sinks.close()
    await conn.close()
    runner.cancel()
    return report(step)


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


async def _done(conn: RpcConnection, job_id: int, step_id: int, code: int, sig: int | None, cancelled: bool) -> None:
    """Tell srun's agent the step is over (it records the end): its routing there can go."""
    try:
        await conn.call("step_done", {"job_id": job_id, "step_id": step_id, "exit_code": code, "signal": sig,
                                      "cancelled": cancelled}, timeout=10)
    except (RpcError, ConnectionLost, asyncio.TimeoutError):
        pass


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


def main(argv: list[str] | None = None) -> int:
    try:
        args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    except Usage as exc:
        error(str(exc))
        return 1
    if not args.command:
        error("No command given to execute.")
        return 1
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    job = str(args.jobid) if args.jobid else os.environ.get("SLURM_JOB_ID", "")
    path = os.environ.get("HAI_STEP_SOCKET", "")
    if not job.isdigit() or not path:
        error("srun runs inside a job allocation here (SLURM_JOB_ID and HAI_STEP_SOCKET are unset): submit a "
              "script that calls srun with hsubmit/sbatch; interactive allocations are not available yet")
        return 1
    try:
        return asyncio.run(run(args, int(job), path))
    except KeyboardInterrupt:
        return 130
