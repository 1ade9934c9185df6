"""RpcConnection.offer: an event pushed only as fast as the peer reads. A peer that stops reading
(an interactive srun whose terminal stalled) holds at most `max_buffered` bytes of the sender's
memory; what finds no room is refused (False) without being written, and is taken again once
the peer reads."""
from __future__ import annotations

import asyncio
import socket

from hai_cluster.transport.rpc import RpcConnection

CHUNK = b"x" * (256 << 10)


def test_a_peer_that_stops_reading_holds_a_bounded_buffer_and_offers_are_refused_not_queued():
    async def main():
        ours, theirs = socket.socketpair()
        for s in (ours, theirs):  # small kernel buffers: the sender's own buffer fills soon
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 << 10)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
        reader, writer = await asyncio.open_unix_connection(sock=ours)
        conn = RpcConnection(reader, writer, name="client")
        conn.write_timeout = None
        limit = 1 << 20
        taken = refused = 0
        for _ in range(40):  # 10 MiB offered to a peer that reads nothing
            if await conn.offer("output", {"data": CHUNK}, 0.05, limit):
                taken += 1
            else:
                refused += 1
        buffered = writer.transport.get_write_buffer_size()
        assert refused > 0 and buffered <= limit + len(CHUNK) + 1024, (taken, refused, buffered)
        assert taken * len(CHUNK) < limit + 2 * len(CHUNK) + (1 << 20)  # what went out: the bound and the kernel's
        # the peer reads again: room comes back, and the next offer is taken
        theirs.setblocking(False)
        loop = asyncio.get_running_loop()
        got = 0
        while got < taken * len(CHUNK) // 2:
            got += len(await loop.sock_recv(theirs, 1 << 20))
        assert await conn.offer("output", {"data": CHUNK}, 5.0, limit)
        writer.close()
        theirs.close()
    asyncio.run(main())
