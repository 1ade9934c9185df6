"""The local transport: the agent's Unix socket on this machine (single-host setups, tests)."""
from __future__ import annotations

import asyncio
import errno
import os

from ..config import NodeConfig
from .streams import Stream, TransportError, wait_closed_quietly


def describe_socket_error(path: str, exc: OSError) -> str:
    """A human cause for a failed connect() to a Unix socket."""
    if isinstance(exc, FileNotFoundError):
        return f"no such socket {path} (is the agent running?)"
    if isinstance(exc, ConnectionRefusedError):
        return f"connection refused on socket {path} (stale socket: nothing is listening)"
    if isinstance(exc, PermissionError):
        return f"permission denied on socket {path}"
    if exc.errno == errno.ENOTSOCK or exc.errno == errno.ECONNREFUSED:
        return f"{path} is not a listening socket"
    return f"cannot connect to socket {path}: {exc.strerror or exc}"


async def open_local_stream(node: NodeConfig, *, timeout: float | None = 10.0) -> Stream:
    path = node.agent_socket
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_unix_connection(path)
    except TimeoutError as exc:
        raise TransportError(node.name, f"timed out after {timeout:g} s connecting to socket {path}") from exc
    except OSError as exc:
        cause = describe_socket_error(path, exc)
        if isinstance(exc, PermissionError) and os.geteuid() != 0:
            # The agent's socket is root's (0600), the controller's user (hai) is not root.
            cause += (f" (the agent's socket is root's and this controller is not root: reach the agent on this "
                      f"host over SSH instead, transport = \"ssh\" and address = \"127.0.0.1\", as any node)")
        raise TransportError(node.name, cause) from exc

    async def on_close() -> None:
        await wait_closed_quietly(writer)

    return Stream(reader, writer, node=node.name, kind="local", on_close=on_close)
