"""The SSH transport: asyncssh to the node's sshd, then a direct-streamlocal channel to the agent.

One SSH connection carries one stream and lives exactly as long as it: `Stream.close()` closes
both. Host keys are always checked against the configured known_hosts file; there is no way to
turn that off. asyncssh is imported here, inside the functions, so that importing the transport
package (as the CLI does) never loads it.

The reader and writer handed out are thin wrappers over asyncssh's bytes streams
(`encoding=None`) that turn asyncssh's own exceptions (which are not OSErrors) into
ConnectionResetError, so that RpcConnection treats a dropped SSH link like any dropped socket.
"""
from __future__ import annotations

import asyncio
from typing import Any

from ..config import NodeConfig, SshConfig
from .streams import Stream, TransportError, wait_closed_quietly

CLOSE_TIMEOUT = 5.0  # seconds to wait for the SSH connection to finish closing


class _SshReader:
    def __init__(self, reader: Any, where: str) -> None:
        self._reader = reader
        self._where = where

    async def read(self, n: int = -1) -> bytes:
        try:
            return await self._reader.read(n)
        except OSError:
            raise
        except Exception as exc:  # asyncssh.Error and friends: the link is gone
            raise ConnectionResetError(f"ssh link to {self._where} lost: {exc}") from exc


class _SshWriter:
    def __init__(self, writer: Any, where: str) -> None:
        self._writer = writer
        self._where = where

    def write(self, data: bytes) -> None:
        try:
            self._writer.write(data)
        except OSError:
            raise
        except Exception as exc:
            raise ConnectionResetError(f"ssh link to {self._where} lost: {exc}") from exc

    async def drain(self) -> None:
        try:
            await self._writer.drain()
        except OSError:
            raise
        except Exception as exc:
            raise ConnectionResetError(f"ssh link to {self._where} lost: {exc}") from exc

    def close(self) -> None:
        try:
            self._writer.close()
        except Exception:
            pass

    def is_closing(self) -> bool:
        return self._writer.is_closing()

    async def wait_closed(self) -> None:
        await wait_closed_quietly(self._writer)


def _host_key_cause(known_hosts: Any, path: str, node: NodeConfig, exc: Exception) -> str:
    where = f"{node.address}:{node.port}"
    try:
        keys = known_hosts.match(node.address, node.address, node.port)[0]
    except Exception:
        keys = None
    if keys:
        detail = f"the host key does not match the key listed in {path} (possible man-in-the-middle, or the host was reinstalled)"
    elif keys is not None:
        detail = f"{path} has no host key for {where}"
    else:
        detail = f"checked against {path}"
    return f"host key verification failed for {where}: {detail} ({exc})"


async def open_ssh_stream(node: NodeConfig, ssh: SshConfig) -> Stream:
    import asyncssh

    where = f"{ssh.user}@{node.address}:{node.port}"
    if not ssh.known_hosts:
        raise TransportError(node.name, "no known_hosts file configured; host key checking cannot be disabled")
    try:
        known_hosts = asyncssh.read_known_hosts(ssh.known_hosts)
    except OSError as exc:
        raise TransportError(node.name, f"cannot read known_hosts file {ssh.known_hosts}: {exc.strerror or exc}") from exc
    except Exception as exc:
        raise TransportError(node.name, f"invalid known_hosts file {ssh.known_hosts}: {exc}") from exc
    try:
        client_key = asyncssh.read_private_key(ssh.key)
    except OSError as exc:
        raise TransportError(node.name, f"cannot read client key {ssh.key}: {exc.strerror or exc}") from exc
    except Exception as exc:
        raise TransportError(node.name, f"cannot load client key {ssh.key}: {exc}") from exc

    timeout = ssh.connect_timeout
    conn = None
    stage = f"connecting to {where}"
    try:
        async with asyncio.timeout(timeout):
            conn = await asyncssh.connect(
                node.address, node.port, username=ssh.user,
                client_keys=[client_key], known_hosts=known_hosts,
                config=[],  # never read ~/.ssh/config: the controller's config is the only input
                agent_path=None, password_auth=False, kbdint_auth=False,
                gss_auth=False, host_based_auth=False,
            )
            stage = f"opening agent socket {node.agent_socket} through {where}"
            reader, writer = await conn.open_unix_connection(node.agent_socket, encoding=None)  # bytes
    except BaseException as exc:
        if conn is not None:
            conn.abort()
        if isinstance(exc, TimeoutError):
            raise TransportError(node.name, f"timed out after {timeout:g} s {stage}") from exc
        if isinstance(exc, asyncssh.HostKeyNotVerifiable):
            raise TransportError(node.name, _host_key_cause(known_hosts, ssh.known_hosts, node, exc)) from exc
        if isinstance(exc, asyncssh.PermissionDenied):
            raise TransportError(node.name, f"authentication failed for {where} with key {ssh.key} "
                                            f"(is its public key in the node's authorized_keys?)") from exc
        if isinstance(exc, asyncssh.ChannelOpenError):
            raise TransportError(node.name, _channel_cause(asyncssh, node, where, exc)) from exc
        if isinstance(exc, ConnectionRefusedError):
            raise TransportError(node.name, f"connection refused by {node.address}:{node.port} (is sshd running?)") from exc
        if isinstance(exc, OSError):
            raise TransportError(node.name, f"cannot reach {node.address}:{node.port}: {exc.strerror or exc}") from exc
        if isinstance(exc, asyncssh.Error):
            raise TransportError(node.name, f"ssh failed {stage}: {exc}") from exc
        raise

    async def on_close() -> None:
        writer.close()
        conn.close()
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT):
                await conn.wait_closed()
        except TimeoutError:
            conn.abort()

    return Stream(_SshReader(reader, where), _SshWriter(writer, where), node=node.name, kind="ssh",
                  on_close=on_close, connection=conn)


def _channel_cause(asyncssh: Any, node: NodeConfig, where: str, exc: Any) -> str:
    path = node.agent_socket
    if exc.code == asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED:
        return (f"{where} refused to forward to {path}: {exc.reason} "
                f"(sshd needs AllowStreamLocalForwarding yes)")
    if exc.code == asyncssh.OPEN_CONNECT_FAILED:
        return (f"cannot connect to agent socket {path} on {where}: {exc.reason} "
                f"(no such socket, or no agent listening on it)")
    return f"cannot open channel to {path} on {where}: {exc.reason}"


__all__ = ["open_ssh_stream", "TransportError"]
