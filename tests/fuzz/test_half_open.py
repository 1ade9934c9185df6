"""Half-open and forgotten connections on the daemons' sockets: a client that sends half a frame
and stalls is dropped (frame timeout) while other clients are served; a client that sends nothing
is dropped (idle timeout); a client that keeps polling (hstat) and the controller's link to the
agent (pings) are never dropped."""
from __future__ import annotations

import socket
import time

import pytest

from hai_cluster.cli.client import ControllerClient
from hai_cluster.protocol.codec import HEADER, encode_frame
from tests.e2e.harness import start_local_cluster

pytestmark = pytest.mark.timeout(300)

HANG_GUARD = 60  # seconds a test waits for the daemon to hang up before calling it a hang


@pytest.fixture(scope="module")
def cluster():
    c = start_local_cluster(node="h1", tick=0.5, gpus=1,
                            agent_toml="frame_timeout = 1.0\nidle_timeout = 2.0\nallow_root_jobs = true",
                            controller_toml="ping_interval = 0.3\n[access]\nclient_frame_timeout = 1.0\n"
                                            "client_idle_timeout = 2.0")
    yield c
    c.close()


def connect(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(HANG_GUARD)
    s.connect(path)
    return s


def hung_up(s: socket.socket) -> bool:
    """The daemon closed the connection (within the socket's HANG_GUARD timeout). What it pushed
    before is read past: an agent sends its telemetry batches to every connection, this one too."""
    try:
        while s.recv(65536):
            pass
        return True
    except ConnectionResetError:
        return True


def ping_frame() -> bytes:
    return encode_frame({"v": 1, "k": "req", "id": 1, "m": "ping", "b": {}})


def answered(path: str) -> bool:
    s = connect(path)
    try:
        s.sendall(ping_frame())
        return len(s.recv(65536)) > 0
    finally:
        s.close()


@pytest.mark.parametrize("which", ["controller", "agent"])
def test_half_a_frame_then_silence_is_dropped_while_others_are_served(cluster, which):
    path = cluster.socket if which == "controller" else str(cluster.workdir / "agent.sock")
    stalled = connect(path)
    frame = ping_frame()
    stalled.sendall(frame[:len(frame) // 2])
    started = time.monotonic()
    assert answered(path)  # another client is served meanwhile
    assert hung_up(stalled)
    assert time.monotonic() - started < HANG_GUARD
    stalled.close()
    # a header that announces a frame and nothing more is the same
    stalled = connect(path)
    stalled.sendall(HEADER.pack(1000))
    assert answered(path)
    assert hung_up(stalled)
    stalled.close()


@pytest.mark.parametrize("which", ["controller", "agent"])
def test_an_idle_client_is_dropped(cluster, which):
    path = cluster.socket if which == "controller" else str(cluster.workdir / "agent.sock")
    silent = connect(path)
    assert hung_up(silent)
    silent.close()


def test_polling_clients_and_the_agent_link_stay_connected(cluster):
    client = ControllerClient(cluster.socket, timeout=HANG_GUARD)
    try:
        for _ in range(12):  # 3.6 s of polls, each 0.3 s apart: longer than the 2 s idle timeout
            client.call("telemetry", {})
            time.sleep(0.3)
    finally:
        client.close()
    # the controller's link to the agent (pinged every 0.3 s) was never dropped as idle
    link = f"connection from pid {cluster.controller.proc.pid} uid 0"
    log = (cluster.workdir / "agent.log").read_text()
    assert link in log and f"{link} closed" not in log, log
    assert cluster.call("nodes", {})["nodes"][0]["responding"]
    job = cluster.submit("--wrap", "true", user="root")
    assert cluster.wait_state(job, "COMPLETED", "FAILED")["state"] == "COMPLETED"
