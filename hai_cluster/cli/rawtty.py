"""The client's terminal while `srun --pty` runs: raw (every key goes to the remote terminal as it
is typed: Ctrl-C, Ctrl-D and Ctrl-Z too, which the remote line discipline turns into signals and
ends of file), and put back as it was on every way out (the step's end, an error, a signal, an
exception; only SIGKILL leaves it raw, as it does any program's)."""
from __future__ import annotations

import atexit
import fcntl
import os
import struct
import termios
import tty


def window_size(fd: int) -> tuple[int, int] | None:
    """(rows, cols) of the terminal on fd, or None."""
    try:
        rows, cols, _, _ = struct.unpack("HHHH", fcntl.ioctl(fd, termios.TIOCGWINSZ, b"\0" * 8))
    except OSError:
        return None
    return (rows, cols) if rows and cols else None


class RawTerminal:
    def __init__(self, fd: int = 0) -> None:
        self.fd = fd
        self.saved = None

    def __enter__(self) -> "RawTerminal":
        if os.isatty(self.fd):
            self.saved = termios.tcgetattr(self.fd)
            atexit.register(self.restore)  # the last resort: an exit that skips the finally
            tty.setraw(self.fd, termios.TCSANOW)
        return self

    def restore(self) -> None:
        if self.saved is not None:
            try:
                termios.tcsetattr(self.fd, termios.TCSADRAIN, self.saved)
            except termios.error:
                pass
            self.saved = None

    def __exit__(self, *exc) -> None:
        self.restore()
