"""Transports against real things: an RpcConnection server in a node's network namespace, reached
through its Unix socket directly (local) and through the node's real sshd (ssh, direct-streamlocal)."""
from __future__ import annotations

import asyncio
import contextlib
import os
import select
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hai_cluster.config import NodeConfig
from hai_cluster.transport.rpc import ConnectionLost, RpcConnection
from hai_cluster.transport.connect import open_stream
from hai_cluster.transport.streams import TransportError
from tests.infra.sshd import keygen

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
MiB = 1024 * 1024

SERVER = r"""
import asyncio, socket, sys
from hai_cluster.transport.rpc import RpcConnection, RpcTable

table = RpcTable()

@table.expose("ping")
async def ping(body, ctx):
    return {"pong": True, "hostname": socket.gethostname()}

@table.expose("echo")
async def echo(body, ctx):
    return body

@table.expose("sleep")
async def sleep(body, ctx):
    print("sleeping", flush=True)
    await asyncio.sleep(body)
    return "woke"

async def main(path):
    async def handle(reader, writer):
        await RpcConnection(reader, writer, table=table, name="client").run()
    server = await asyncio.start_unix_server(handle, path)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()

asyncio.run(main(sys.argv[1]))
"""


class ServerProcess:
    """The RPC server above, running in a node's namespace; reads its stdout lines with deadlines."""

    def __init__(self, proc: subprocess.Popen, path: str) -> None:
        self.proc, self.path, self._buf = proc, path, b""

    def wait_line(self, want: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while True:
            lines = self._buf.split(b"\n")
            if want.encode() in lines[:-1]:
                self._buf = b"\n".join(lines[lines.index(want.encode()) + 1:])
                return
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"server did not print {want!r} within {timeout:g} s "
                                     f"(exit code {self.proc.poll()})")
            ready, _, _ = select.select([fd], [], [], min(left, 0.5))
            if ready:
                chunk = os.read(fd, 4096)
                if not chunk:
                    raise AssertionError(f"server exited ({self.proc.wait()}) before printing {want!r}")
                self._buf += chunk

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)
        self.proc.stdout.close()


@pytest.fixture
def start_server(short_tmp):
    """start_server(ssh_node) -> ServerProcess serving ping/echo/sleep on a socket in short_tmp."""
    started: list[ServerProcess] = []

    def start(node) -> ServerProcess:
        path = str(short_tmp / f"{node.name}.sock")
        env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
        proc = node.popen([sys.executable, "-c", SERVER, path], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
                          env=env, cwd=str(REPO))
        server = ServerProcess(proc, path)
        started.append(server)
        server.wait_line("ready")
        return server

    yield start
    for s in started:
        s.stop()


def run(coro, timeout: float = 180.0):
    async def bounded():
        async with asyncio.timeout(timeout):
            return await coro
    return asyncio.run(bounded())


@contextlib.asynccontextmanager
async def rpc_client(node: NodeConfig, ssh):
    stream = await open_stream(node, ssh)
    conn = RpcConnection(stream.reader, stream.writer, name=node.name)
    reader = asyncio.create_task(conn.run())
    try:
        yield conn, stream
    finally:
        await conn.close()
        await stream.close()
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader


def local_config(node, path: str) -> NodeConfig:
    return NodeConfig(name=node.name, address=node.address, transport="local", agent_socket=path)


def configs(transport: str, node, path: str):
    if transport == "local":
        return local_config(node, path), node.ssh_config()
    return node.node_config(path), node.ssh_config()


async def expect_transport_error(node: NodeConfig, ssh) -> TransportError:
    with pytest.raises(TransportError) as info:
        stream = await open_stream(node, ssh)
        await stream.close()
    assert info.value.node == node.name
    assert node.name in str(info.value)
    return info.value


# -- working paths ---------------------------------------------------------------------------


def test_local_transport_round_trip(ssh_nodes, start_server):
    node = ssh_nodes[0]
    server = start_server(node)

    async def go():
        async with rpc_client(*configs("local", node, server.path)) as (conn, stream):
            assert stream.kind == "local"
            pong = await conn.call("ping")
            assert pong == {"pong": True, "hostname": node.name}  # runs in the node's UTS namespace
            assert await conn.call("echo", {"a": [1, 2, 3], "b": b"\x00\xff"}) == {"a": [1, 2, 3], "b": b"\x00\xff"}
    run(go())


def test_ssh_transport_round_trip_to_every_node(ssh_nodes, start_server):
    servers = [start_server(n) for n in ssh_nodes]

    async def go():
        for node, server in zip(ssh_nodes, servers):
            async with rpc_client(*configs("ssh", node, server.path)) as (conn, stream):
                assert stream.kind == "ssh"
                assert await conn.call("ping") == {"pong": True, "hostname": node.name}
                assert await conn.call("echo", "hello") == "hello"
                # many requests in flight at once on one channel
                bodies = [f"m{i}" for i in range(50)]
                assert await asyncio.gather(*(conn.call("echo", b) for b in bodies)) == bodies
    run(go())


@pytest.mark.parametrize("transport", ["local", "ssh"])
def test_one_mebibyte_round_trip(transport, ssh_nodes, start_server):
    node = ssh_nodes[1]
    server = start_server(node)
    payload = os.urandom(MiB)

    async def go():
        async with rpc_client(*configs(transport, node, server.path)) as (conn, _):
            assert await conn.call("echo", payload, timeout=120) == payload
            assert await conn.call("ping") == {"pong": True, "hostname": node.name}
    run(go())


def test_ssh_stream_close_closes_the_ssh_connection(ssh_nodes, start_server):
    node = ssh_nodes[0]
    server = start_server(node)

    async def go():
        stream = await open_stream(*configs("ssh", node, server.path))
        conn = stream.connection
        assert not conn.is_closed()
        await stream.close()
        await stream.close()  # idempotent
        assert conn.is_closed()
    run(go())


# -- failures ----------------------------------------------------------------------------------


def test_wrong_host_key_is_refused(ssh_nodes, start_server, tmp_path):
    node = ssh_nodes[0]
    server = start_server(node)
    impostor = keygen(tmp_path / "impostor")
    algo, blob = Path(f"{impostor}.pub").read_text().split()[:2]
    known = tmp_path / "known_hosts"
    known.write_text(f"{node.address} {algo} {blob}\n")

    async def go():
        exc = await expect_transport_error(node.node_config(server.path), node.ssh_config(known_hosts=str(known)))
        assert "host key" in str(exc)
        assert "does not match" in str(exc)
    run(go())


def test_host_missing_from_known_hosts_is_refused(ssh_nodes, start_server, tmp_path):
    node = ssh_nodes[0]
    server = start_server(node)
    known = tmp_path / "known_hosts"
    known.write_text("")

    async def go():
        exc = await expect_transport_error(node.node_config(server.path), node.ssh_config(known_hosts=str(known)))
        assert "host key" in str(exc)
        assert "has no host key" in str(exc)
    run(go())


def test_empty_known_hosts_setting_is_refused(ssh_nodes):
    node = ssh_nodes[0]

    async def go():
        exc = await expect_transport_error(node.node_config("/nonexistent.sock"), node.ssh_config(known_hosts=""))
        assert "host key checking cannot be disabled" in str(exc)
    run(go())


def test_unknown_client_key_is_refused(ssh_nodes, start_server, tmp_path):
    node = ssh_nodes[0]
    server = start_server(node)
    stranger = keygen(tmp_path / "stranger")

    async def go():
        exc = await expect_transport_error(node.node_config(server.path), node.ssh_config(key=str(stranger)))
        assert "authentication failed" in str(exc)
    run(go())


@pytest.mark.parametrize("transport", ["local", "ssh"])
def test_missing_socket_gives_a_clear_error(transport, ssh_nodes, short_tmp):
    node = ssh_nodes[0]
    path = str(short_tmp / "nobody-home.sock")

    async def go():
        exc = await expect_transport_error(*configs(transport, node, path))
        assert path in str(exc)
        assert ("no such socket" in str(exc)) if transport == "local" else ("cannot connect to agent socket" in str(exc))
    run(go())


def test_stale_local_socket_is_reported_as_refused(ssh_nodes, short_tmp):
    node = ssh_nodes[0]
    path = str(short_tmp / "stale.sock")
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)  # bound but never listening: what a crashed agent leaves behind
    try:
        async def go():
            exc = await expect_transport_error(*configs("local", node, path))
            assert "refused" in str(exc)
        run(go())
    finally:
        s.close()


def test_nothing_listening_on_the_ssh_port_is_refused(ssh_nodes):
    node = ssh_nodes[1]
    cfg = NodeConfig(name=node.name, address=node.address, port=2222, agent_socket="/x.sock")

    async def go():
        exc = await expect_transport_error(cfg, node.ssh_config())
        assert "connection refused" in str(exc)
    run(go())


def test_silent_peer_times_out(ssh_nodes):
    node = ssh_nodes[0]
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()  # accepts TCP (kernel backlog) but never says a word
    cfg = NodeConfig(name=node.name, address="127.0.0.1", port=silent.getsockname()[1], agent_socket="/x.sock")
    try:
        async def go():
            exc = await expect_transport_error(cfg, node.ssh_config(connect_timeout=1.0))
            assert "timed out" in str(exc)
        run(go())
    finally:
        silent.close()


@pytest.mark.parametrize("transport", ["local", "ssh"])
def test_server_stopped_mid_call_raises_connection_lost(transport, ssh_nodes, start_server):
    node = ssh_nodes[1]
    server = start_server(node)

    async def go():
        async with rpc_client(*configs(transport, node, server.path)) as (conn, _):
            pending = asyncio.create_task(conn.call("sleep", 600, timeout=120))
            await asyncio.to_thread(server.wait_line, "sleeping")
            server.proc.kill()
            with pytest.raises(ConnectionLost):
                await pending
            assert conn.closed
    run(go())


def test_transport_package_does_not_import_asyncssh():
    code = ("import sys, hai_cluster.transport.streams, hai_cluster.transport.local, hai_cluster.transport.ssh; "
            "sys.exit(1 if 'asyncssh' in sys.modules else 0)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=str(REPO), timeout=120)
    assert proc.returncode == 0, "importing the transports must not import asyncssh"


def _children(pid: int) -> list[int]:
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                kids.append(int(entry))
    return kids


def test_ssh_link_dropped_mid_call_raises_connection_lost(ssh_nodes, start_server):
    """Killing the node's per-connection sshd drops the SSH link itself (not just the channel):
    asyncssh reports that with its own exception types, which the transport turns into a plain
    connection error, so RpcConnection fails the pending call with ConnectionLost and run() ends."""
    node = ssh_nodes[0]
    server = start_server(node)

    async def go():
        async with rpc_client(*configs("ssh", node, server.path)) as (conn, _):
            pending = asyncio.create_task(conn.call("sleep", 600, timeout=120))
            await asyncio.to_thread(server.wait_line, "sleeping")
            sessions = _children(node.sshd.proc.pid)  # sshd forks one process per connection
            assert sessions, "no per-connection sshd process found"
            for pid in sessions:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 9)
            with pytest.raises(ConnectionLost):
                await pending
            await conn.wait_closed()
            assert conn.close_reason.startswith("connection error: ssh link"), conn.close_reason
    run(go())
    assert node.sshd.running  # the listening sshd is untouched; later tests still connect
