"""Open a stream to a node's agent by its configured transport (local socket or SSH). The SSH
module, and with it asyncssh, is imported only when a node uses it, so the CLI never pays for it."""
from __future__ import annotations

from ..config import NodeConfig, SshConfig
from .streams import Stream, TransportError


async def open_stream(node: NodeConfig, ssh: SshConfig) -> Stream:
    """Open a byte stream to `node.agent_socket`, locally or through SSH (direct-streamlocal)."""
    if node.transport == "local":
        from .local import open_local_stream
        return await open_local_stream(node, timeout=ssh.connect_timeout)
    if node.transport == "ssh":
        from .ssh import open_ssh_stream
        return await open_ssh_stream(node, ssh)
    raise TransportError(node.name, f"unknown transport {node.transport!r} (expected ssh or local)")
