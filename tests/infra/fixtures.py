"""pytest plugin: real infrastructure for integration tests (load with
`pytest_plugins = ["tests.infra.fixtures"]`).

Fixtures
- `test_network` (session): a TestNetwork with 2 node namespaces (see netns.py).
- `ssh_nodes` (session): list of SshNode, one sshd per node namespace, all sharing one client
  key and one known_hosts file.
- `postgres_server` (session): a PrivatePostgres.
- `postgres_url` (function): a fresh, empty database on that server, dropped after the test.
- `short_tmp` (function): a short directory under /tmp for Unix sockets (sun_path is 108 bytes).

They need root and system binaries. When something is missing the test fails (it is never
skipped) with a message that says to run scripts/test, which installs everything.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from . import netns, postgres, sshd

HINT = "run the tests with scripts/test, which installs what is missing and runs pytest as root"


def require_root(what: str) -> None:
    if os.geteuid() != 0:
        pytest.fail(f"{what} needs root; {HINT}", pytrace=False)


def require_binaries(what: str, binaries: list[str] | tuple[str, ...]) -> None:
    missing = [b for b in binaries if shutil.which(b) is None]
    if missing:
        pytest.fail(f"{what} needs {', '.join(missing)}, not found; {HINT}", pytrace=False)


@dataclass
class SshNode:
    """One node reachable over SSH: its sshd runs in the node's namespace."""

    name: str  # node name = hostname inside the namespace
    address: str
    port: int
    key: Path  # client private key (its .pub is in every node's authorized_keys)
    known_hosts: Path  # has every node's host key
    netns: str
    sshd: sshd.SshdHandle
    network: netns.TestNetwork
    user: str = "root"

    def popen(self, argv: list[str], **kw) -> subprocess.Popen:
        """Start a process in this node's namespace with this node's hostname (stopped at session end)."""
        return self.network.popen(self.name, argv, **kw)

    def run(self, argv: list[str], **kw) -> subprocess.CompletedProcess:
        return self.network.run(self.name, argv, **kw)

    def node_config(self, agent_socket: str, **kw):
        from hai_cluster.config import NodeConfig
        return NodeConfig(name=self.name, address=self.address, port=self.port, transport="ssh",
                          agent_socket=agent_socket, **kw)

    def ssh_config(self, connect_timeout: float = 30.0, **kw):
        from hai_cluster.config import SshConfig
        kw.setdefault("key", str(self.key))
        kw.setdefault("known_hosts", str(self.known_hosts))
        return SshConfig(user=self.user, connect_timeout=connect_timeout, **kw)


@pytest.fixture(scope="session")
def test_network():
    require_root("test_network")
    require_binaries("test_network", netns.REQUIRED_BINARIES)
    try:
        net = netns.TestNetwork(2).__enter__()
    except netns.NetworkSetupError as exc:
        pytest.fail(f"cannot set up the test network: {exc}", pytrace=False)
    try:
        yield net
    finally:
        net.close()


@pytest.fixture(scope="session")
def ssh_nodes(test_network, tmp_path_factory):
    require_binaries("ssh_nodes", sshd.REQUIRED_BINARIES)
    base = tmp_path_factory.mktemp("ssh")
    key = sshd.keygen(base / "id_ed25519", comment="hai-test-controller")
    known_hosts = base / "known_hosts"
    known_hosts.write_text("")
    handles: list[sshd.SshdHandle] = []
    try:
        for n in test_network.nodes:
            h = sshd.start_sshd(test_network, n.name, base / n.name)
            handles.append(h)
            h.authorize(Path(f"{key}.pub"))
            h.write_known_hosts(known_hosts)
    except sshd.SshdError as exc:
        for h in handles:
            h.stop()
        pytest.fail(f"cannot start sshd: {exc}", pytrace=False)
    try:
        yield [SshNode(name=n.name, address=h.address, port=h.port, key=key, known_hosts=known_hosts,
                       netns=n.netns, sshd=h, network=test_network)
               for n, h in zip(test_network.nodes, handles)]
    finally:
        for h in handles:
            h.stop()


@pytest.fixture(scope="session")
def postgres_server():
    if postgres.find_bindir() is None:
        pytest.fail(f"PostgreSQL server binaries (initdb, pg_ctl, postgres) not found; {HINT}", pytrace=False)
    if os.geteuid() == 0:
        require_binaries("postgres_server", ["runuser"])
    try:
        server = postgres.PrivatePostgres(database=None)
        server.start()
    except postgres.PostgresError as exc:
        pytest.fail(f"cannot start a private PostgreSQL server: {exc}", pytrace=False)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def postgres_url(postgres_server):
    """SQLAlchemy URL (postgresql+psycopg://...) of a fresh, empty database, dropped afterwards."""
    name = f"t_{uuid.uuid4().hex[:16]}"
    url = postgres_server.create_database(name)
    try:
        yield url
    finally:
        postgres_server.drop_database(name)


@pytest.fixture
def short_tmp():
    """A short private directory under /tmp (Unix socket paths must stay under 108 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="hai-t-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
