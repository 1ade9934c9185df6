"""srun: start a job step of tasks across an allocation, as Slurm's srun does.

    srun [options] command [args...]

Inside a job (its batch script or a step's task: HAI_STEP_SOCKET is set) it goes through its
node's agent, as below. Inside salloc's command (SLURM_JOB_ID without a node agent), the
controller relays it (srun_relay.py); outside any allocation srun first gets one (an interactive
job, with sbatch's options: -t, -p, --gpus-per-node, ...), runs its step there, and the job ends
with the step; `--pty` runs task 0 on a terminal, and srun's stdin reaches the tasks.

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
from ..core.hostlist import expand
from ..core.steps import StepIO, layout_from_wire, task_environment
from ..job.tasks import NodeTasks
from ..protocol.steps import request_to_wire
from ..transport.rpc import ConnectionLost, RpcConnection, RpcError
from . import srun_client
from .srun_client import JOB_OPTIONS
from .srun_output import OPEN_MODES, SinkError
from .srun_relay import StdinReader, reads_terminal
from .srun_tee import LocalTee
from .srun_step import (PROG, Step, error, job_open_mode, kept_per_node, report, request_of, step_outcome,
                        stopped_by_agent, warn)


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
    p.add_argument("-O", "--overcommit", action="store_true")
    p.add_argument("--gpus-per-task", type=_count)
    p.add_argument("-w", "--nodelist", type=_names, default=[])
    p.add_argument("-x", "--exclude", type=_names, default=[])
    p.add_argument("-l", "--label", action="store_true")
    p.add_argument("-K", "--kill-on-bad-exit", action="store_const", const="1", default=None)
    p.add_argument("--kill-on-bad-exit-value", dest="kill_on_bad_exit", help=argparse.SUPPRESS)
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
    # a step from a client (salloc's srun, srun outside a job): its terminal and stdin
    p.add_argument("--pty", action="store_true")
    p.add_argument("-i", "--input", type=_input)
    # outside an allocation: the job's (sbatch's), and how long to wait for it
    # --immediate[=S] and --nice[=N]: a value only when attached (normalized() spells them so)
    p.add_argument("-I", "--immediate", action="store_const", const=0)
    p.add_argument("--immediate-seconds", dest="immediate", type=_seconds, help=argparse.SUPPRESS)
    for opt, short in JOB_OPTIONS:
        p.add_argument(*((short, opt) if short else (opt,)))
    p.add_argument("--nice", action="store_const", const="100")
    p.add_argument("--nice-value", dest="nice", help=argparse.SUPPRESS)
    p.add_argument("-H", "--hold", action="store_true")
    p.add_argument("command", nargs=argparse.REMAINDER)
    return p


# srun's options that only the job it creates outside an allocation takes (sbatch's meaning)
def normalized(p: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """srun's options as argparse reads them: `-I5`/`--immediate=5`, `-K1` and `--nice=N` (values
    only when attached, as getopt's optional arguments) spelled apart; the command left as it is."""
    out = list(argv)
    i = 0
    while i < len(out):
        tok = out[i]
        if tok == "--" or not tok.startswith("-") or tok == "-":
            break
        name = tok.split("=", 1)[0]
        if tok.startswith("--immediate=") or (tok.startswith("-I") and tok[2:].isdigit()):
            out[i] = "--immediate-seconds=" + (tok.split("=", 1)[1] if "=" in tok else tok[2:])
        elif tok.startswith("--nice="):
            out[i] = "--nice-value=" + tok.split("=", 1)[1]
        elif tok.startswith("--kill-on-bad-exit=") or (tok.startswith("-K") and tok[2:].isdigit()):
            out[i] = "--kill-on-bad-exit-value=" + (tok.split("=", 1)[1] if "=" in tok else tok[2:])
        else:
            action = p._option_string_actions.get(name if name.startswith("--") else tok[:2])
            takes = action is not None and action.nargs is None and not isinstance(
                action, (argparse._StoreConstAction, argparse._StoreTrueAction, argparse._CountAction))
            attached = "=" in tok if name.startswith("--") else len(tok) > 2
            if takes and not attached:
                i += 1  # its value
        i += 1
    return out


def _input(text: str) -> str:
    if text.lower() in ("all", "none") or text.isdigit():
        return text.lower()
    raise argparse.ArgumentTypeError(f"invalid --input {text!r} (all, none or a task id; files not yet)")


def _seconds(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"invalid --immediate {text!r} (seconds)")
    return int(text)


async def run(args: argparse.Namespace, job_id: int, socket_path: str) -> int:
    step = Step(args)
    try:
        reader, writer = await asyncio.open_unix_connection(socket_path)
    except OSError as exc:
        error(f"cannot reach this node's agent at {socket_path}: {exc.strerror or exc}")
        return 1
    step.tee = LocalTee(job_id)  # the agent asks for a copy of our tasks' output while a sattach is attached
    conn = step.conn = step.tee.conn = RpcConnection(reader, writer, table=step.tee.table(), on_event=step.on_event,
                                                     name="agent")
    runner = asyncio.ensure_future(conn.run())
    cwd = args.chdir or os.getcwd()
    env = dict(os.environ) if args.export.upper() != "NONE" else {
        k: v for k, v in os.environ.items() if k.startswith("SLURM_") or k.startswith("HAI_")}
    request = request_of(args)
    if (per_node := kept_per_node(request)) is not None:  # the step's count, as Slurm's srun exports it
        env["SLURM_NTASKS_PER_NODE"] = str(per_node)
    inp = args.input or "all"  # Slurm's default: srun's stdin to every task
    io = StepIO(input=inp if inp in ("all", "none") else int(inp))
    try:
        reply = await conn.call("step_create", {"job_id": job_id, "request": request_to_wire(request),
                                                "argv": list(args.command), "cwd": cwd, "env": env,
                                                "io": io.to_wire()}, timeout=180)
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
    step.tee.step_id = layout.step_id
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, lambda s=sig: step.interrupt(s))
    for sig in (signal.SIGUSR1, signal.SIGUSR2):  # passed on as well, as Slurm's: `kill -USR1 $srun_pid`
        loop.add_signal_handler(sig, lambda s=sig: None if stopped_by_agent() else asyncio.ensure_future(step.signal(s)))
    mine = layout.on(step.node)
    step.local = NodeTasks(step.on_local_output, step.on_local_exit)
    await step.local.start(args.command, cwd, [(t.procid, task_environment(env, os.environ, layout, t, master))
                                               for t in mine], stdin=[t.procid for t in mine if io.reads_input(t.procid)])
    feeding = asyncio.ensure_future(_stdin(step, conn, layout, io)) if io.input != "none" else None
    waiting = asyncio.ensure_future(step.all_ended.wait())
    done, _ = await asyncio.wait([waiting, runner], return_when=asyncio.FIRST_COMPLETED)
    if waiting not in done:  # the agent went away: our own tasks still end, the others' news is lost
        error(f"lost the connection to node {step.node}'s agent: {conn.close_reason}")
        await step.local.wait()
        waiting.cancel()
        for t in layout.tasks:
            step.ends.setdefault(t.procid, (None, signal.SIGKILL))
    else:
        await step.tee.flush()  # an attached sattach has every task's output before the step's end
        await _done(conn, job_id, layout.step_id, *step_outcome(step.ends.values()), step.interrupted)
    if feeding is not None:
        feeding.cancel()
    step.sinks.close()
    await conn.close()
    runner.cancel()
    return report(step)


async def _stdin(step: Step, conn: RpcConnection, layout, io: StepIO) -> None:
    """srun's stdin to the tasks that read it (-i: all, or one task), as Slurm's srun: its own
    node's written here, the others' a chunk at a time through the agent and the controller (the
    next once the last is in); its end ends theirs. A terminal's is read only while srun is in
    its foreground; a batch script's stdin is /dev/null (the tasks see its end at once)."""
    task = None if io.input == "all" else io.input
    local = {t.procid for t in layout.on(step.node)}
    remote = any(t.procid not in local and io.reads_input(t.procid) for t in layout.tasks)
    reader = StdinReader(0) if reads_terminal() else None
    while True:
        data = await reader.queue.get() if reader is not None else b""
        eof = not data
        await step.local.write_input(task, data, eof)
        if remote:
            try:
                await conn.call("step_input", {"job_id": layout.job_id, "step_id": layout.step_id, "task": task,
                                               "data": data, "eof": eof}, timeout=None)
            except (RpcError, ConnectionLost) as exc:
                error(f"stdin not passed on to the other nodes' tasks: {exc}")
                remote = False
        if eof:
            return


async def _done(conn: RpcConnection, job_id: int, step_id: int, code: int, sig: int | None, cancelled: bool) -> None:
    """Tell srun's agent the step is over (it records the end): its routing there can go."""
    try:
        await conn.call("step_done", {"job_id": job_id, "step_id": step_id, "exit_code": code, "signal": sig,
                                      "cancelled": cancelled}, timeout=10)
    except (RpcError, ConnectionLost, asyncio.TimeoutError):
        pass


def main(argv: list[str] | None = None) -> int:
    try:
        p = parser()
        args = p.parse_args(normalized(p, list(sys.argv[1:] if argv is None else argv)))
    except Usage as exc:
        error(str(exc))
        return 1
    if not args.command:
        error("No command given to execute.")
        return 1
    # srun's input variable for -O (set at all, as Slurm reads it): a job's sruns see its own
    args.overcommit = args.overcommit or "SLURM_OVERCOMMIT" in os.environ
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if not args.command:
        error("No command given to execute.")
        return 1
    job = str(args.jobid) if args.jobid else os.environ.get("SLURM_JOB_ID", "")
    path = os.environ.get("HAI_STEP_SOCKET", "")
    try:
        if job.isdigit() and path:  # in a job: through this node's agent
            if args.pty:
                error("--pty starts a terminal for salloc's or your own srun (outside a batch script) only")
                return 1
            return asyncio.run(run(args, int(job), path))
        # through the controller: salloc's command, or srun's own allocation
        return asyncio.run(srun_client.main(args, int(job) if job.isdigit() else None))
    except KeyboardInterrupt:
        return 130
