"""The Unix-socket side both daemons share: binding safely, knowing who connected, closing down."""
from __future__ import annotations

import asyncio
import os
import socket
import stat
import struct

_UCRED = struct.Struct("3i")


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


async def close_server(server: asyncio.AbstractServer, connections, path: str) -> None:
    """Stop accepting, close every open connection, remove the socket file."""
    server.close()
    for conn in list(connections):
        await conn.close()
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
