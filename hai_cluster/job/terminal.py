"""A task's pseudo-terminal (`srun --pty`): the task runs in a session of its own whose
controlling terminal is the pty's slave side, and the step server holds the master. What the
client types is written to the master as it comes (the line discipline on this side turns Ctrl-C
into SIGINT for the foreground process group, Ctrl-D into an end of file, and echoes); what the
task prints is read from the master and passed on as it comes (no line buffering); a new window
size is set on the master (the kernel sends SIGWINCH to the foreground process group).

Reads and writes are non-blocking and wait for the fd with the event loop, one chunk at a time:
the next read waits until the last chunk was taken, and a write waits until the pty takes it.
"""
from __future__ import annotations

import asyncio
import errno
import fcntl
import os
import signal
import struct
import termios

READ_CHUNK = 64 * 1024
MAX_ROWS_COLS = 10_000  # a window size beyond this is no terminal's


def open_pty(rows: int, cols: int) -> tuple[int, int]:
    """(master, slave), the window size set, the master non-blocking and not inherited."""
    master, slave = os.openpty()
    set_size(master, rows, cols)
    os.set_blocking(master, False)
    os.set_inheritable(master, False)
    return master, slave


def set_size(fd: int, rows: int, cols: int) -> None:
    rows, cols = max(1, min(rows, MAX_ROWS_COLS)), max(1, min(cols, MAX_ROWS_COLS))
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def become_session_leader_of_tty() -> None:
    """In the child, after setsid (subprocess's start_new_session): its stdin, the pty's slave,
    becomes the controlling terminal of the new session."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


async def _wait_fd(fd: int, writing: bool, stop: asyncio.Event | None = None) -> None:
    """Until `fd` is readable (writable), or `stop` is set."""
    loop = asyncio.get_running_loop()
    ready = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)
    (loop.add_writer if writing else loop.add_reader)(fd, wake)
    waiter = asyncio.ensure_future(stop.wait()) if stop is not None else None
    try:
        await asyncio.wait([ready] + ([waiter] if waiter else []), return_when=asyncio.FIRST_COMPLETED)
    finally:
        (loop.remove_writer if writing else loop.remove_reader)(fd)
        if waiter is not None:
            waiter.cancel()


async def pump(fd: int, on_data, exited: asyncio.Event) -> None:
    """Pass on what the task writes to its terminal until no process holds the slave side (EIO),
    or the task has exited and what it wrote is read (a background process it left behind keeps
    the slave open: it must not keep the step)."""
    while True:
        try:
            data = os.read(fd, READ_CHUNK)
        except BlockingIOError:
            if exited.is_set():
                return
            await _wait_fd(fd, False, exited)
            continue
        except OSError:  # EIO: the slave side is closed
            return
        if not data:
            return
        await on_data(data)


async def write_all(fd: int, data: bytes) -> None:
    """Write to the master as fast as the terminal takes it; OSError if it is gone."""
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except BlockingIOError:
            await _wait_fd(fd, True)
            continue
        view = view[n:]


def hang_up(fd: int, session: int) -> None:
    """What a closed terminal does to its session: SIGHUP (and SIGCONT) to the foreground
    process group and to the session's leader (an interactive shell passes it to its jobs)."""
    groups = {session}
    try:
        groups.add(os.tcgetpgrp(fd))
    except OSError:
        pass
    for group in groups:
        for sig in (signal.SIGHUP, signal.SIGCONT):
            try:
                os.killpg(group, sig)
            except OSError as exc:
                if exc.errno != errno.ESRCH:
                    raise
