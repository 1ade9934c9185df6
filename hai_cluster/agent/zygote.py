"""The shepherd zygote: a small single-threaded process that has already imported the shepherd and
forks one per run, so that starting a shepherd costs a fork instead of an interpreter start and
its imports (~50 ms of CPU).

`python -m hai_cluster.agent.zygote ROOM`: started once by the agent (starter.py), with its end of
a SOCK_SEQPACKET socketpair as stdin and the environment a shepherd gets (helper_env). It is not
the agent: the agent has threads and an event loop, and a fork of it would copy both. ROOM is a
blank argument: the room in the argument area that each child rewrites to the shepherd's own
command line, `python -m hai_cluster.agent.shepherd RUN_DIR` (argv[0] padded with blanks), so that
/proc/PID/cmdline identifies it exactly as it identifies a shepherd started by exec
(spool.is_shepherd: agents old and new find it after a restart).

The protocol, one request at a time (the agent serializes them):

    zygote -> agent  {"ready": PID}        once, when the imports are done
    agent -> zygote  {"run_dir": "/abs"}   with two fds (SCM_RIGHTS): the launch report pipe's
                                           write end and the shepherd log
    child -> agent   {"forked": PID}       the forked child's first act, before anything else
    zygote -> agent  {"error": "..."}      the request was refused: nothing was forked

The child acknowledges itself, and exits if it cannot: if the agent gave up on the request (shut
its end down after a timeout) no shepherd comes of it, and the agent may start one another way
without ever running two. Then the child drops everything of the zygote (its socket, the
SIGCHLD disposition, stdin and stdout, argv) and runs shepherd.detach_and_run, which only calls
setsid here: this child is the shepherd, in a session of its own, never the agent's child (an
exec'd shepherd forks twice for that), and neither the agent's nor the zygote's death reaches
it. The zygote ignores SIGCHLD, so the kernel reaps its shepherds as they end. The zygote exits
when the agent's end closes.
"""
from __future__ import annotations

import ctypes
import gc
import json
import logging
import os
import select
import signal
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import NoReturn

from . import contain, runtimes, shepherd, spool  # noqa: F401 - imported once here, for every child
from ..core.runtimes import TABLE

MAX_MESSAGE = 65536
REQUEST_FDS = 2  # the report pipe and the shepherd log


def _say(level: str, message: str) -> None:
    """The zygote's own few lines, to the agent's stderr (the log). Not through the logging module:
    that is configured here for the shepherds (warm), in their format."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    print(f"{stamp} zygote[{os.getpid()}] {level} {message}", file=sys.stderr, flush=True)


class ArgvArea:
    """This process's argument area (what /proc/PID/cmdline shows), rewritten in place."""

    def __init__(self, start: int, end: int) -> None:
        self.start, self.end = start, end

    @classmethod
    def of_self(cls) -> "ArgvArea":
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().decode(errors="replace").rsplit(")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (fields 48, 49)
        if not 0 < start < end:
            raise OSError("/proc/self/stat does not show the argument area")
        return cls(start, end)

    def encode(self, argv: list[str]) -> bytes | None:
        """argv filling the area exactly (the kernel shows the whole area when its last byte is
        NUL: a shorter argv would show trailing empty arguments); None if it does not fit."""
        args = [a.encode() for a in argv]
        if any(b"\0" in a for a in args):
            return None
        pad = (self.end - self.start) - sum(len(a) + 1 for a in args)
        if pad < 0:
            return None
        args[0] += b" " * pad  # blanks after the interpreter's path: invisible in ps
        return b"\0".join(args) + b"\0"

    def write(self, raw: bytes) -> None:
        ctypes.memmove(self.start, raw, len(raw))


class Zygote:
    def __init__(self, sock: socket.socket, area: ArgvArea) -> None:
        self.sock = sock
        self.area = area
        # Dispositions the zygote changed, restored in each child. Ignoring SIGCHLD lets the
        # kernel reap the children (the shepherds) when they end.
        self.saved = {signal.SIGCHLD: signal.signal(signal.SIGCHLD, signal.SIG_IGN)}

    def reply(self, msg: dict) -> None:
        try:
            self.sock.send(json.dumps(msg).encode())
        except OSError as exc:
            _say("WARNING", f"cannot answer the agent: {exc}")

    def hung_up(self) -> bool:
        p = select.poll()
        p.register(self.sock, select.POLLIN)
        return any(ev & (select.POLLHUP | select.POLLERR) for _, ev in p.poll(0))

    def serve(self) -> int:
        self.reply({"ready": os.getpid()})
        while True:
            try:
                msg, fds, flags, _ = socket.recv_fds(self.sock, MAX_MESSAGE, REQUEST_FDS + 1)
            except ConnectionResetError:
                return 0  # the agent gave up on us (a deadline missed) and closed its end
            except OSError as exc:
                _say("ERROR", f"reading the agent's socket failed: {exc}; exiting")
                return 1
            if not msg and not fds and self.hung_up():
                return 0  # the agent is gone (or closed us): the shepherds are not ours to wait for
            try:
                error = self.handle(msg, fds, flags)
            except Exception as exc:  # noqa: BLE001 - one bad request must not end the zygote
                error = f"zygote: {exc!r}"
            finally:
                for fd in fds:  # ours are copies (a child has its own): closed before we answer
                    try:
                        os.close(fd)
                    except OSError:
                        pass
            if error is not None:
                _say("WARNING", f"refused a request: {error}")
                self.reply({"error": error})

    def handle(self, msg: bytes, fds: list[int], flags: int) -> str | None:
        """Fork the shepherd of a good request (its child answers); else what is wrong with it."""
        problem, run_dir, raw = self.check(msg, fds, flags)
        if problem is not None:
            return problem
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            pid = os.fork()
        except OSError as exc:
            return f"fork failed: {exc}"
        if pid == 0:
            self.child(run_dir, raw, fds[0], fds[1])
        return None

    def check(self, msg: bytes, fds: list[int], flags: int) -> tuple[str | None, str, bytes]:
        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
            return f"request too large (more than {MAX_MESSAGE} bytes or {REQUEST_FDS} fds)", "", b""
        if len(fds) != REQUEST_FDS:
            return f"a request carries {REQUEST_FDS} fds (report pipe, log), got {len(fds)}", "", b""
        try:
            req = json.loads(msg)
        except ValueError:
            return "a request is a JSON object", "", b""
        if not isinstance(req, dict) or set(req) != {"run_dir"}:
            return "a request is {\"run_dir\": PATH}", "", b""
        run_dir = req["run_dir"]
        if not isinstance(run_dir, str) or not os.path.isabs(run_dir):
            return f"run_dir must be an absolute path, got {run_dir!r}", "", b""
        raw = self.area.encode(spool.shepherd_argv(run_dir))
        if raw is None:
            return f"run dir {run_dir!r} does not fit the zygote's command line", "", b""
        return None, run_dir, raw

    def child(self, run_dir: str, argv_raw: bytes, report_fd: int, log_fd: int) -> NoReturn:
        code = 1
        try:
            self.area.write(argv_raw)  # first: whoever scans /proc sees a shepherd from now on
            try:
                self.sock.send(json.dumps({"forked": os.getpid()}).encode())
            except OSError:
                os._exit(1)  # the agent gave up on this request: it starts the shepherd another way
            self.sock.close()
            for sig, handler in self.saved.items():
                signal.signal(sig, handler)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(log_fd, 1)  # as the exec'd shepherd's stdout and stderr
            os.dup2(log_fd, 2)
            os.close(null)
            os.close(log_fd)
            os.set_inheritable(report_fd, True)  # as passed to an exec'd shepherd
            sys.argv = [shepherd.__file__, run_dir]
            code = shepherd.detach_and_run(Path(run_dir), report_fd, fork_first=False)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:  # noqa: BLE001 - a child must never return into the zygote's loop
            traceback.print_exc()
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)


def warm() -> None:
    """Do once, here, what every shepherd would otherwise do first on its own copy of this
    process: each first time writes memory that a child then copies page by page (~80 pages
    for the logging setup, ~20 for loading the NSS modules of its group lookup)."""
    for name in TABLE:  # every runtime's module, imported once here (shepherds import them lazily)
        runtimes.get(name)
    shepherd.configure_logging()  # to sys.stderr, which each child points at its shepherd.log
    for handler in logging.getLogger().handlers:  # a line formatted: the time zone is read on first use
        handler.format(logging.makeLogRecord({"msg": "warm"}))
    try:
        os.getgrouplist("root", 0)
    except (KeyError, OSError):
        pass


def main() -> int:
    try:
        sock = socket.socket(fileno=os.dup(0))  # the agent's socketpair end came as stdin
    except OSError:
        print("usage: started by hai-agent, with a socket as stdin (agent/starter.py)", file=sys.stderr)
        return 2
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    try:
        area = ArgvArea.of_self()
    except (OSError, ValueError, IndexError) as exc:
        sock.send(json.dumps({"error": f"zygote: cannot rewrite its command line: {exc}"}).encode())
        return 1
    warm()
    gc.freeze()  # the imports stay in the permanent generation: children do not copy them to collect
    return Zygote(sock, area).serve()


if __name__ == "__main__":
    sys.exit(main())
