"""srun with no node agent of its own: in salloc's allocation (SLURM_JOB_ID names it), or outside
any allocation, where it gets one first (an interactive job with sbatch's options), runs its one
step there and ends it with the step (COMPLETED, or FAILED with the step's exit code), as Slurm's
srun does. The step itself: srun_relay.py."""
from __future__ import annotations

import argparse
import asyncio
import os
import signal

from ..core.steps import step_name
from .allocation import Allocation, AllocationError, Controller
from .srun_relay import REATTACH, run_step
from .srun_step import PROG, error

# srun's options that only the job it creates outside an allocation takes (sbatch's meaning)
JOB_OPTIONS = (("--time", "-t"), ("--partition", "-p"), ("--gpus-per-node", None), ("--gres", None),
               ("--gpus", "-G"), ("--mem", None), ("--mem-per-cpu", None), ("--mem-per-gpu", None),
               ("--account", "-A"), ("--qos", "-q"), ("--constraint", "-C"), ("--reservation", None),
               ("--priority", None), ("--begin", "-b"), ("--dependency", "-d"), ("--comment", None),
               ("--mail-type", None), ("--mail-user", None))


def job_options(args: argparse.Namespace) -> list[str]:
    """The sbatch options of the job srun creates outside an allocation: its step's shape (-N,
    -n, -c, ...), the job-only options, and its name (the command's, as Slurm's)."""
    out = [f"--job-name={args.job_name or step_name(args.command)}"]
    for flag, value in (("--nodes", args.nodes), ("--ntasks", args.ntasks), ("--ntasks-per-node", args.ntasks_per_node),
                        ("--cpus-per-task", args.cpus_per_task), ("--gpus-per-task", args.gpus_per_task),
                        ("--chdir", args.chdir), ("--export", None if args.export == "ALL" else args.export),
                        ("--nice", args.nice)):
        if value is not None:
            out.append(f"{flag}={value}")
    if args.nodelist:
        out.append(f"--nodelist={','.join(args.nodelist)}")
    if args.exclude:
        out.append(f"--exclude={','.join(args.exclude)}")
    if args.exclusive:
        out.append("--exclusive")
    if args.overcommit:
        out.append("--overcommit")
    if args.hold:
        out.append("--hold")
    for opt, _short in JOB_OPTIONS:
        value = getattr(args, opt[2:].replace("-", "_"))
        if value is not None:
            out.append(f"{opt}={value}")
    return out


async def main(args: argparse.Namespace, job_id: int | None) -> int:
    ctl = Controller()
    try:
        await ctl.connect()
    except AllocationError as exc:
        error(str(exc))
        return 1
    try:
        if job_id is not None:
            return await _in_allocation(args, ctl, job_id)
        return await _own_allocation(args, ctl)
    finally:
        await ctl.close()


async def _in_allocation(args: argparse.Namespace, ctl: Controller, job_id: int) -> int:
    """salloc's srun: a step in the allocation salloc holds (srun's connection does not hold it)."""
    alloc = Allocation(PROG, ctl, quiet=args.quiet)
    alloc.job_id = job_id
    try:
        info = await alloc.state(hold=False)
    except Exception as exc:  # noqa: BLE001 - the controller's refusal, said as srun's error
        error(f"Unable to create step for job {job_id}: {exc}")
        return 1
    if info["state"] != "RUNNING":
        error(f"Unable to create step for job {job_id}: Job/step already completing or completed")
        return 1
    return await run_step(args, ctl, alloc, dict(os.environ), hold=False)


async def _own_allocation(args: argparse.Namespace, ctl: Controller) -> int:
    alloc = Allocation(PROG, ctl, quiet=args.quiet)
    loop = asyncio.get_running_loop()
    try:
        await alloc.submit(job_options(args), immediate=args.immediate == 0)
    except AllocationError as exc:
        error(str(exc))
        return 1
    interrupted = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(sig, interrupted.set)
    granting = asyncio.ensure_future(alloc.granted(salloc=False, within=args.immediate or None))
    stop = asyncio.ensure_future(interrupted.wait())
    await asyncio.wait([granting, stop], return_when=asyncio.FIRST_COMPLETED)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        loop.remove_signal_handler(sig)
    stop.cancel()
    if not granting.done():
        granting.cancel()
        await alloc.cancel()
        alloc.say(f"Job allocation {alloc.job_id} has been revoked.")
        return 1
    try:
        info = granting.result()
    except AllocationError as exc:
        error(str(exc))
        return 1
    env = {**os.environ, **info.get("env", {}), "SLURM_SUBMIT_HOST": os.uname().nodename}
    code = 1
    try:
        code = await run_step(args, ctl, alloc, env, hold=True)
    finally:
        if ctl.conn.closed:  # lost with the step's end (a controller restart): said once it is back
            await ctl.reconnect(within=REATTACH)
        if not ctl.conn.closed:
            await alloc.release(code)
    return code
