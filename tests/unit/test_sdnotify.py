"""The sd_notify client: addresses ('@' = abstract), the watchdog period, no-op without systemd,
the environment cleaned for child processes, and the heartbeat's pings and status lines."""
from __future__ import annotations

import asyncio
import os
import socket
import uuid

import pytest

from hai_cluster.sdnotify import Notifier, socket_address, watchdog_interval


class Listener:
    """A datagram socket standing in for systemd's notify socket."""

    def __init__(self, address: str | bytes) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(address)
        self.sock.settimeout(5)

    def receive(self) -> str:
        return self.sock.recv(4096).decode()

    def close(self) -> None:
        self.sock.close()


def test_addresses():
    assert socket_address("/run/systemd/notify") == "/run/systemd/notify"
    assert socket_address("@hai/abstract") == b"\0hai/abstract"
    assert socket_address("") is None
    assert socket_address("vsock:2:1234") is None


@pytest.mark.parametrize("env, pid, expected", [
    ({}, 10, None),
    ({"WATCHDOG_USEC": "0"}, 10, None),
    ({"WATCHDOG_USEC": "junk"}, 10, None),
    ({"WATCHDOG_USEC": "30000000"}, 10, 15.0),
    ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "10"}, 10, 15.0),
    ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "11"}, 10, None),  # meant for our parent
])
def test_watchdog_interval(env, pid, expected):
    assert watchdog_interval(env, pid) == expected


def test_without_notify_socket_everything_is_a_no_op():
    n = Notifier.from_environment({})
    assert not n.enabled
    assert n.ready("x") is False and n.status("x") is False and n.ping() is False and n.stopping() is False
    asyncio.run(asyncio.wait_for(n.heartbeat(), 1))  # returns at once


def test_from_environment_removes_the_variables():
    env = {"NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "1000000", "WATCHDOG_PID": str(os.getpid()), "HOME": "/root"}
    n = Notifier.from_environment(env)
    assert n.address == b"\0x" and n.watchdog == 0.5
    assert env == {"HOME": "/root"}
    kept = {"NOTIFY_SOCKET": "@x"}
    Notifier.from_environment(kept, unset=False)
    assert kept == {"NOTIFY_SOCKET": "@x"}


@pytest.mark.parametrize("kind", ["path", "abstract"])
def test_messages_arrive(tmp_path, kind):
    if kind == "path":
        address = str(tmp_path / "notify")
        env_value = address
    else:
        name = f"hai-test-{uuid.uuid4().hex}"
        address = b"\0" + name.encode()
        env_value = "@" + name
    listener = Listener(address)
    try:
        n = Notifier.from_environment({"NOTIFY_SOCKET": env_value})
        assert n.ready("serving")
        assert listener.receive() == "READY=1\nSTATUS=serving"
        assert n.status("a\nb")
        assert listener.receive() == "STATUS=a b"  # one line, whatever the caller passed
        assert n.ping()
        assert listener.receive() == "WATCHDOG=1"
        assert n.stopping()
        assert listener.receive() == "STOPPING=1"
        n.close()
    finally:
        listener.close()


def test_a_vanished_socket_is_not_an_error(tmp_path):
    n = Notifier(str(tmp_path / "nobody-listens"))
    assert n.ready() is False


def test_heartbeat_pings_and_reports_status(tmp_path):
    address = str(tmp_path / "notify")
    listener = Listener(address)
    calls = []

    async def status() -> str:
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("a failing status line is skipped, not fatal")
        return f"status {len(calls)}"

    async def main() -> list[str]:
        n = Notifier(address, watchdog=0.01)
        task = asyncio.create_task(n.heartbeat(status, status_every=0.01))
        got: list[str] = []
        loop = asyncio.get_running_loop()
        while not ({"WATCHDOG=1", "STATUS=status 1", "STATUS=status 3"} <= set(got)):
            got.append(await loop.run_in_executor(None, listener.receive))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return got

    try:
        got = asyncio.run(asyncio.wait_for(main(), 30))
    finally:
        listener.close()
    assert "STATUS=status 2" not in got
