"""One interface for reaching a node's agent socket: a byte stream, local or over SSH.

`connect.open_stream(node, ssh)` returns a `Stream` whose reader/writer pair is what
`RpcConnection` takes. Every failure to open one is a `TransportError` that names the node and the cause. The
SSH path imports asyncssh only when a node actually uses it, so the CLI never pays for it.
"""
from __future__ import annotations

from typing import Any, Awaitable, Callable


class TransportError(Exception):
    """A stream to a node could not be opened; the message names the node and the cause."""

    def __init__(self, node: str, cause: str) -> None:
        super().__init__(f"node {node}: {cause}")
        self.node = node
        self.cause = cause


class Stream:
    """A reader (`await read(n)`, b"" at end) and a writer (write/drain/close) to one agent socket.

    `close()` closes the stream and whatever carries it (the SSH connection for SSH nodes); it is
    safe to call more than once.
    """

    def __init__(self, reader: Any, writer: Any, *, node: str, kind: str,
                 on_close: Callable[[], Awaitable[None]] | None = None, connection: Any = None) -> None:
        self.reader = reader
        self.writer = writer
        self.node = node
        self.kind = kind  # "local" | "ssh"
        self.connection = connection  # the asyncssh connection carrying an ssh stream (diagnostics)
        self._on_close = on_close
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.writer.close()
        except Exception:
            pass
        if self._on_close is not None:
            await self._on_close()

    async def __aenter__(self) -> "Stream":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<Stream {self.kind} to {self.node} ({state})>"


async def wait_closed_quietly(writer: Any) -> None:
    """Await writer.wait_closed() when the writer has one, ignoring errors from a broken peer."""
    wait = getattr(writer, "wait_closed", None)
    if wait is None:
        return
    try:
        await wait()
    except Exception:  # noqa: BLE001 - a broken peer must not make closing fail
        pass
