"""A real terminal for end-to-end tests: a pseudo-terminal whose slave side is the controlling
terminal of the command (run as a test user, in a session of its own, as a login would), and
whose master side the test types into and reads, as a person at the keyboard would."""
from __future__ import annotations

import fcntl
import os
import re
import select
import struct
import subprocess
import termios
import time

from .harness import ensure_user


def _controlling_tty() -> None:
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class Terminal:
    def __init__(self, argv: list[str], *, user: str, env: dict[str, str], cwd: str, rows: int = 24,
                 cols: int = 80) -> None:
        pw = ensure_user(user)
        self.master, slave = os.openpty()
        self.resize(rows, cols)
        self.proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, user=pw.pw_uid, group=pw.pw_gid,
                                     extra_groups=[], env=env, cwd=cwd, start_new_session=True,
                                     preexec_fn=_controlling_tty)
        os.close(slave)
        self.seen = b""  # everything the terminal showed
        self.mark = 0  # where the next expect() starts looking

    def resize(self, rows: int, cols: int) -> None:
        """As a terminal emulator does when its window changes (the kernel sends SIGWINCH)."""
        fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def send(self, text: str | bytes) -> None:
        os.write(self.master, text.encode() if isinstance(text, str) else text)

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.master], [], [], timeout)
        if not ready:
            return False
        try:
            data = os.read(self.master, 65536)
        except OSError:  # EIO: nothing holds the slave side any more
            data = b""
        if not data:
            return False
        self.seen += data
        return True

    def expect(self, pattern: str, timeout: float = 30.0) -> re.Match:
        """Wait for `pattern` (a regex over the text shown since the last match) to appear."""
        deadline = time.monotonic() + timeout
        rx = re.compile(pattern.encode())
        while True:
            m = rx.search(self.seen, self.mark)
            if m:
                self.mark = m.end()
                return m
            left = deadline - time.monotonic()
            ended = not self._read(max(0.0, min(left, 0.5))) and self.proc.poll() is not None and not self._read(0.2)
            if left <= 0 or (ended and rx.search(self.seen, self.mark) is None):
                raise AssertionError(f"{pattern!r} not shown within {timeout:g} s; the terminal showed:\n"
                                     f"{self.seen[-3000:].decode(errors='replace')}")

    def wait(self, timeout: float = 30.0) -> int:
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            self._read(0.2)
        while self._read(0.1):
            pass
        return self.proc.wait(timeout=max(0.1, deadline - time.monotonic()))

    def attrs(self) -> list:
        """The terminal's settings now (the line discipline's: the same seen from either side)."""
        return termios.tcgetattr(self.master)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        os.close(self.master)
