"""The Unix-socket side both daemons share: binding safely, knowing who connected, closing down."""
from __future__ import annotations

import asyncio
import logging
import os
import socket
import stat
import struct
from typing import Awaitable, Callable

_UCRED = struct.Struct("3i")
log = logging.getLogger(__name__)


class SocketInUse(Exception):
    pass


def peer_credentials(writer: asyncio.StreamWriter) -> tuple[int, int, int]:
    """(pid, uid, gid) of the connecting process, as the kernel reports it; (-1, -1, -1) if unknown."""
    sock = writer.get_extra_info("socket")
    try:
        return _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    except (OSError, AttributeError):
        return -1, -1, -1


# Connections the kernel queues before they are accepted (it caps this at net.core.somaxconn).
# With 100, one user connecting and closing in a loop filled the queue and everyone else's
# connect() failed with EAGAIN (fifth audit).
LISTEN_BACKLOG = 4096


def bind_socket(path: str, mode: int, what: str) -> socket.socket:
    """A listening socket at `path` with `mode`. A stale socket is removed; a live one is not."""
    os.makedirs(os.path.dirname(path) or ".", mode=0o755, exist_ok=True)
    if os.path.lexists(path):
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise SocketInUse(f"{path} exists and is not a socket")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
        except OSError:
            os.unlink(path)  # nobody listens: left over from a daemon that died
        else:
            raise SocketInUse(f"another {what} is already serving {path}")
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)  # no window in which the socket exists with a looser mode
    try:
        sock.bind(path)
    finally:
        os.umask(old)
    os.chmod(path, mode)
    sock.listen(LISTEN_BACKLOG)
    sock.setblocking(False)
    return sock


class GatedServer:
    """Serves a listening Unix socket, accepting in batches itself: a connection whose peer uid
    `refused(uid)` says no to is closed at once, with no transport, task or log line of its own,
    and the others are served by `handler(reader, writer)` as asyncio.start_unix_server would. One
    user's connect loop then costs an accept and a close per connection, so the accept queue
    stays short for everyone else (with asyncio's server each cost a transport and a task, and
    another user's connect waited seconds behind a loop of 5,800 a second)."""

    BATCH = 512  # connections accepted per wake-up before other work gets its turn

    def __init__(self, sock: socket.socket, handler: Callable[[asyncio.StreamReader, asyncio.StreamWriter],
                                                           Awaitable[None]],
                 refused: Callable[[int], bool]) -> None:
        self.sock, self.handler, self.refused = sock, handler, refused
        self._tasks: set[asyncio.Task] = set()
        self._loop = asyncio.get_running_loop()
        sock.setblocking(False)
        self._loop.add_reader(sock.fileno(), self._accept)

    def _accept(self) -> None:
        for _ in range(self.BATCH):
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE and the like: say so, try again at the next wake-up
                log.warning("accept on %s failed: %s", self.sock.getsockname(), exc)
                return
            try:
                uid = _UCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))[1]
            except OSError:
                uid = -1
            if self.refused(uid):
                conn.close()
                continue
            task = self._loop.create_task(self._serve(conn))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _serve(self, conn: socket.socket) -> None:
        try:
            reader, writer = await asyncio.open_unix_connection(sock=conn)
        except OSError:
            conn.close()
            return
        await self.handler(reader, writer)

    def close(self) -> None:
        self._loop.remove_reader(self.sock.fileno())
        self.sock.close()


async def close_server(server, connections, path: str | None) -> None:
    """Stop accepting, close every open connection, remove the socket file (path None: the caller
    removes it, or keeps it)."""
    server.close()
    for conn in list(connections):
        await conn.close()
    if path is None:
        return
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
