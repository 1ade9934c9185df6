"""salloc: get an interactive allocation and run a command (the user's shell by default) on this
host with its variables, so that `srun` from there starts job steps on it; the allocation ends
with the command (its exit code is salloc's, and the job's), with scancel or at its time limit.

    salloc [OPTIONS] [COMMAND [ARGS...]]

Options are sbatch's (-N, -n, --gpus-per-node, -t, -p, -J, -A, --qos, -C, -w, --exclusive, ...),
checked by the controller as a submission's are, plus salloc's own, as Slurm 22.05's:
  --no-shell            exit once the allocation is granted (srun --jobid=N or scancel it later)
  -I, --immediate[=S]   give up unless granted at once (within S seconds)
  -K, --kill-command[=SIGNAL]
                        when the allocation is revoked, send SIGNAL to the command (default:
                        SIGHUP when stdin is a terminal, else SIGTERM); without -K the command
                        is only told (`salloc: Job allocation N has been revoked.`), as in Slurm
  -Q, --quiet           no informational messages
The command runs in the foreground of this terminal (its own process group), as Slurm's does.
"""
from __future__ import annotations

import asyncio
import os
import signal
import sys

from ..core.jobscript import option_span
from ..core.usertext import printable
from .allocation import Allocation, AllocationError, Controller, revoked_message

PROG = "salloc"
OWN_FLAGS = {"--no-shell", "--bell", "--no-bell", "-Q", "--quiet"}


class Usage(Exception):
    pass


def error(text: str) -> None:
    print(f"{PROG}: error: {printable(text)}", file=sys.stderr)


def _signal_number(text: str) -> int:
    name = text.upper()
    if name.isdigit():
        num = int(name)
    else:
        name = name if name.startswith("SIG") else "SIG" + name
        num = getattr(signal, name, None)
    if not isinstance(num, int) or not 0 < int(num) < signal.NSIG:
        raise Usage(f"Invalid signal specification: {text}")
    return int(num)


def split(argv: list[str]) -> tuple[dict, list[str], list[str]]:
    """salloc's own options, sbatch's options (for the controller), and the command."""
    own = {"no_shell": False, "immediate": None, "kill": None, "quiet": False}
    options: list[str] = []
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok == "--":
            return own, options, argv[i + 1:]
        if not tok.startswith("-") or tok == "-":
            return own, options, argv[i:]
        if tok in OWN_FLAGS:
            own["no_shell"] |= tok == "--no-shell"
            own["quiet"] |= tok in ("-Q", "--quiet")
        elif tok in ("-I", "--immediate") or tok.startswith(("--immediate=", "-I")):
            value = tok.split("=", 1)[1] if "=" in tok else tok[2:] if tok.startswith("-I") else ""
            if value and not value.isdigit():
                raise Usage(f"invalid --immediate value {value!r} (seconds)")
            own["immediate"] = int(value) if value else 0
        elif tok in ("-K", "--kill-command") or tok.startswith(("--kill-command=", "-K")):
            value = tok.split("=", 1)[1] if "=" in tok else tok[2:] if tok.startswith("-K") else ""
            own["kill"] = _signal_number(value) if value else 0
        else:
            span = option_span(argv[i:])
            options.extend(argv[i:i + span])
            i += span
            continue
        i += 1
    return own, options, []


def _foreground() -> None:
    """In the command's process, before its exec: its own process group, in the terminal's
    foreground (job control in the shell; Ctrl-C reaches it, not salloc)."""
    os.setpgid(0, 0)
    old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        os.tcsetpgrp(0, os.getpgrp())
    finally:
        signal.signal(signal.SIGTTOU, old)


def _take_back_terminal() -> None:
    old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        os.tcsetpgrp(0, os.getpgrp())
    except OSError:
        pass
    finally:
        signal.signal(signal.SIGTTOU, old)


def _interactive() -> bool:
    try:
        return os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp()
    except OSError:
        return False


async def amain(own: dict, options: list[str], command: list[str]) -> int:
    ctl = Controller()
    try:
        await ctl.connect()
    except AllocationError as exc:
        error(str(exc))
        return 1
    alloc = Allocation(PROG, ctl, quiet=own["quiet"])
    loop = asyncio.get_running_loop()
    if not any(o in ("-J", "--job-name") or o.startswith(("-J", "--job-name=")) for o in options):
        options = [f"--job-name={'no-shell' if own['no_shell'] else 'interactive'}", *options]  # Slurm's names
    try:
        await alloc.submit(options, immediate=own["immediate"] == 0, detached=own["no_shell"])
        interrupted = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.add_signal_handler(sig, interrupted.set)
        granting = asyncio.ensure_future(alloc.granted(salloc=True, within=own["immediate"] or None,
                                                       hold=not own["no_shell"]))
        stop = asyncio.ensure_future(interrupted.wait())
        await asyncio.wait([granting, stop], return_when=asyncio.FIRST_COMPLETED)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.remove_signal_handler(sig)
        if not granting.done():
            granting.cancel()
            await alloc.cancel()
            alloc.say(f"Job allocation {alloc.job_id} has been revoked.")
            return 1
        stop.cancel()
        info = granting.result()
    except AllocationError as exc:
        error(str(exc))
        await ctl.close()
        return 1
    if own["no_shell"]:
        await ctl.close()
        return 0
    try:
        return await _run(own, alloc, info, command)
    finally:
        await ctl.close()


async def _run(own: dict, alloc: Allocation, info: dict, command: list[str]) -> int:
    loop = asyncio.get_running_loop()
    env = {**os.environ, **info.get("env", {}), "SLURM_SUBMIT_HOST": os.uname().nodename}
    argv = command or [os.environ.get("SHELL") or "/bin/sh"]
    interactive = _interactive()
    try:
        proc = await asyncio.create_subprocess_exec(*argv, env=env,
                                                    preexec_fn=_foreground if interactive else None)
    except OSError as exc:
        error(f"{argv[0]}: {exc.strerror or exc}")
        await alloc.release(127)
        return 127
    revoked = False

    def forward(sig: int) -> None:  # salloc's own hangup or termination: the command's
        try:
            (os.killpg if interactive else os.kill)(proc.pid, sig)
        except ProcessLookupError:
            pass
    for sig in (signal.SIGHUP, signal.SIGTERM):
        loop.add_signal_handler(sig, lambda s=sig: forward(s))
    for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        loop.add_signal_handler(sig, lambda: None)  # the command's business, not salloc's
    waiting = asyncio.ensure_future(proc.wait())
    watch = asyncio.ensure_future(alloc.ended())
    done, _ = await asyncio.wait([waiting, watch], return_when=asyncio.FIRST_COMPLETED)
    if watch in done:
        revoked = True
        alloc.say(revoked_message(alloc.job_id, watch.result()))
        if own["kill"] is not None:
            sig = own["kill"] or (signal.SIGHUP if interactive else signal.SIGTERM)
            forward(sig)
    else:
        watch.cancel()
    returncode = await waiting
    if not revoked and (info := await alloc.still_running()) is not None:
        revoked = True  # its end and the command's came together: it was revoked, not relinquished
        alloc.say(revoked_message(alloc.job_id, info))
    if interactive:
        _take_back_terminal()
    code = returncode if returncode >= 0 else 128 - returncode
    if not revoked:
        alloc.say(f"Relinquishing job allocation {alloc.job_id}")
        await alloc.release(code)
    return code


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["-h"], ["--help"], ["--usage"]):
        print(__doc__.split("\n\n", 1)[1], end="")
        return 0
    try:
        own, options, command = split(argv)
    except Usage as exc:
        error(str(exc))
        return 1
    if "SALLOC_OVERCOMMIT" in os.environ:  # salloc's input variable for -O (set at all, as Slurm reads it)
        options = ["--overcommit", *options]
    try:
        return asyncio.run(amain(own, options, command))
    except KeyboardInterrupt:
        return 130
