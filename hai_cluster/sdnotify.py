"""The sd_notify protocol, without libsystemd: tell systemd (Type=notify units) how a daemon is doing.

systemd passes $NOTIFY_SOCKET (a path, or '@name' for an abstract socket); a daemon sends it
datagrams of newline-separated KEY=VALUE lines: READY=1 once it serves, STATUS=... for
`systemctl status`, WATCHDOG=1 at least every $WATCHDOG_USEC microseconds when the unit has
WatchdogSec=, STOPPING=1 when it begins to shut down. Without $NOTIFY_SOCKET (run by hand, in
tests, under another supervisor) every call is a no-op.

`Notifier.from_environment()` removes these variables from os.environ, as sd_notify's
`unset_environment` does, so that the processes a daemon starts (an agent's shepherds and jobs)
do not inherit them.

Socket activation (sd_listen_fds): a .socket unit's listening sockets arrive as fds 3, 4, ...
with $LISTEN_FDS (their count) and $LISTEN_PID (this process); `listened_socket()` takes the one
a daemon expects and removes those variables too. The controller gets its users' socket so
(hai-controller.socket): systemd, as root, creates it in /run/hai, and the controller runs as
its own unprivileged user.
"""
from __future__ import annotations

import asyncio
import logging
import os
import socket
from typing import Awaitable, Callable, Mapping, MutableMapping

from . import timeouts

log = logging.getLogger(__name__)

ENV_VARS = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")
LISTEN_VARS = ("LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES")
LISTEN_FDS_START = 3


class ListenError(Exception):
    """Sockets systemd passed that are not the one the daemon was configured for."""


def listened_socket(path: str, env: MutableMapping[str, str] | None = None) -> socket.socket | None:
    """The listening Unix stream socket bound to `path` that systemd passed (socket activation), or
    None when none was passed (started by hand, in tests: the daemon binds its socket itself).
    Passed sockets are for this process only: $LISTEN_* are removed, whoever they were for."""
    env = os.environ if env is None else env
    count, pid = env.get("LISTEN_FDS", ""), env.get("LISTEN_PID", "")
    for name in LISTEN_VARS:
        env.pop(name, None)
    if not count or pid != str(os.getpid()):
        return None
    if not count.isdigit() or int(count) != 1:
        raise ListenError(f"systemd passed {count} sockets (LISTEN_FDS); expected one, the socket {path}: "
                          f"the .socket unit must have one ListenStream=")
    fd = LISTEN_FDS_START
    try:
        sock = socket.socket(fileno=fd)
    except OSError as exc:
        raise ListenError(f"systemd's socket (fd {fd}) is unusable: {exc.strerror or exc}") from None
    os.set_inheritable(fd, False)  # nothing the daemon starts gets it
    bound = sock.getsockname() if sock.family == socket.AF_UNIX else None
    listening = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
    if sock.type != socket.SOCK_STREAM or not listening or bound != path:
        what = f"{sock.family.name} {sock.type.name} {'listening on ' if listening else 'bound to '}{bound!r}"
        sock.detach()
        raise ListenError(f"systemd passed a socket that is not a listening Unix stream socket at {path} ({what}): "
                          f"the .socket unit's ListenStream= and the config's socket must name the same path")
    sock.setblocking(False)
    return sock


def socket_address(value: str) -> str | bytes | None:
    """$NOTIFY_SOCKET as an address for sendto: a path, or b'\\0name' for '@name' (abstract)."""
    if not value:
        return None
    if value.startswith("@"):
        return b"\0" + value[1:].encode()
    if value.startswith("/"):
        return value
    return None  # e.g. vsock: addresses; not for us


def watchdog_interval(env: Mapping[str, str], pid: int | None = None) -> float | None:
    """Seconds between WATCHDOG=1 pings systemd asks for (half of WATCHDOG_USEC), or None."""
    usec = env.get("WATCHDOG_USEC", "")
    if not usec.isdigit() or int(usec) == 0:
        return None
    owner = env.get("WATCHDOG_PID", "")
    if owner and owner != str(pid if pid is not None else os.getpid()):
        return None  # meant for another process (we were started by the watched one)
    return int(usec) / 1e6 / 2


class Notifier:
    def __init__(self, address: str | bytes | None, watchdog: float | None = None) -> None:
        self.address = address
        self.watchdog = watchdog  # seconds between pings, None when systemd does not ask
        self._sock: socket.socket | None = None

    @classmethod
    def from_environment(cls, env: MutableMapping[str, str] | None = None, *, unset: bool = True) -> "Notifier":
        env = os.environ if env is None else env
        notifier = cls(socket_address(env.get("NOTIFY_SOCKET", "")), watchdog_interval(env))
        if unset:
            for name in ENV_VARS:
                env.pop(name, None)
        return notifier

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def send(self, *lines: str) -> bool:
        """Send one datagram of KEY=VALUE lines; False (and a debug log line) if it did not go."""
        if self.address is None:
            return False
        text = "\n".join(line.replace("\n", " ") for line in lines)
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.sendto(text.encode(), self.address)
            return True
        except OSError as exc:  # systemd gone or the socket never existed: nothing to tell
            log.debug("sd_notify %r failed: %s", text, exc)
            return False

    def ready(self, status: str | None = None) -> bool:
        return self.send("READY=1", *([f"STATUS={status}"] if status else []))

    def status(self, text: str) -> bool:
        return self.send(f"STATUS={text}")

    def ping(self) -> bool:
        return self.send("WATCHDOG=1")

    def stopping(self, status: str | None = None) -> bool:
        return self.send("STOPPING=1", *([f"STATUS={status}"] if status else []))

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    async def heartbeat(self, status: Callable[[], Awaitable[str]] | None = None,
                        status_every: float = 5.0) -> None:
        """Run until cancelled: WATCHDOG=1 every `watchdog` seconds (when systemd asks for it) and
        STATUS=<await status()> every `status_every` seconds. The pings come from the event loop,
        so a daemon whose loop is stuck stops pinging and systemd restarts it; a slow status()
        never delays them (they run in their own task)."""
        if not self.enabled:
            return
        loops = []
        if self.watchdog:
            loops.append(self._watchdog_loop(self.watchdog))
        if status is not None:
            loops.append(self._status_loop(status, status_every))
        if loops:
            await asyncio.gather(*loops)

    async def _watchdog_loop(self, every: float) -> None:
        while True:
            self.ping()
            await asyncio.sleep(every)

    async def _status_loop(self, status: Callable[[], Awaitable[str]], every: float) -> None:
        while True:
            try:
                self.status(await timeouts.wait_for(status(), timeout=max(every, 1.0)))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a status line must never take the daemon down
                log.debug("status line failed: %r", exc)
            await asyncio.sleep(every)
