"""An in-memory stream pair for unit tests: two (reader, writer) ends joined back to back."""
from __future__ import annotations

import asyncio


class _PipeWriter:
    """The subset of asyncio.StreamWriter that RpcConnection uses, feeding the other end's reader."""

    def __init__(self, peer: asyncio.StreamReader) -> None:
        self._peer = peer
        self._closed = False

    def write(self, data: bytes) -> None:
        if self._closed:
            raise ConnectionResetError("in-memory pipe closed")
        self._peer.feed_data(data)

    async def drain(self) -> None:
        await asyncio.sleep(0)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._peer.feed_eof()

    def is_closing(self) -> bool:
        return self._closed


def memory_pair():
    """Return ((reader_a, writer_a), (reader_b, writer_b)); what a writes, b reads, and back."""
    ra, rb = asyncio.StreamReader(), asyncio.StreamReader()
    return (ra, _PipeWriter(rb)), (rb, _PipeWriter(ra))
