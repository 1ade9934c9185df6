"""Hostile bytes on the daemons' sockets: random garbage, well-framed maps with random fields,
real requests with random bodies, and real requests with bytes flipped. After every input the
daemon still serves a well-behaved client; nothing it stores changes unless a request was valid."""
from __future__ import annotations

import socket

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hai_cluster.cli.client import ControllerClient
from hai_cluster.protocol.codec import HEADER, encode_frame
from tests.e2e.harness import Cluster, start_local_cluster

CONTROLLER_METHODS = ["submit", "jobs", "show_job", "cancel", "nodes", "acct", "requeue", "preempt", "hold",
                      "release", "update_node", "update_limits", "accounts", "shares", "ping", "nope"]
AGENT_METHODS = ["hello", "start_run", "terminate_run", "signal_run", "list_runs", "forget_run", "ping", "nope"]


@pytest.fixture(scope="module")
def daemons():
    c = start_local_cluster(node="f1", tick=0.5)
    yield c, str(c.workdir / "agent.sock")
    c.close()


def send(path: str, data: bytes) -> None:
    """Send, then read whatever comes back until the daemon answers or closes (bounded)."""
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(3)
    try:
        s.connect(path)
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)  # a half-open peer: the daemon must not wait for more forever
        while s.recv(65536):
            pass
    except socket.timeout:
        pytest.fail(f"the daemon neither answered nor closed within 3 s after {data[:60]!r}")
    except OSError:
        pass  # reset by the daemon: fine
    finally:
        s.close()


leaf = st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats() | st.text(max_size=30) | \
    st.binary(max_size=30)
values = st.recursive(leaf, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner,
                                                                                       max_size=4), max_leaves=12)


def framed(obj) -> bytes:
    payload = msgpack.packb(obj, use_bin_type=True)
    return HEADER.pack(len(payload)) + payload


def requests(methods):
    return st.builds(lambda m, b, i, v: framed({"v": v, "k": "req", "id": i, "m": m, "b": b}),
                     st.sampled_from(methods), values, st.integers(-5, 2**40), st.sampled_from([1, 1, 1, 0, 2]))


def inputs(methods):
    return st.one_of(
        st.binary(max_size=300),
        st.builds(framed, values),
        requests(methods),
        st.tuples(requests(methods), st.integers(0, 10**6), st.integers(1, 255)).map(
            lambda t: bytes(b ^ t[2] if i == t[1] % len(t[0]) else b for i, b in enumerate(t[0]))),
        st.builds(lambda n: HEADER.pack(n), st.integers(0, 2**32 - 1)),
        st.builds(hostile_shape, st.lists(st.sampled_from(HOSTILE_HEADS), max_size=80), st.binary(max_size=200)),
    )


# Headers that announce much (arrays and maps of 65,535 or 2^32-1, a 4 GiB string), nest deep, or
# are ext types: what protocol/shape.py refuses before msgpack allocates for them.
HOSTILE_HEADS = [b"\xdc\xff\xff", b"\xdd\xff\xff\xff\xff", b"\xde\xff\xff", b"\xdf\x00\x10\x00\x00", b"\x91", b"\x81\xa1k",
                 b"\x90", b"\xdb\xff\xff\xff\xff", b"\xd4\x01\x01", b"\xc7\x05\x01", b"\xc1"]


def hostile_shape(heads: list[bytes], tail: bytes) -> bytes:
    payload = b"\x85\xa1v\x01\xa1k\xa3req\xa2id\x01\xa1m\xa4ping\xa1b" + b"".join(heads) + tail
    return HEADER.pack(len(payload)) + payload


def still_serving(cluster: Cluster) -> None:
    client = ControllerClient(cluster.socket, timeout=10)
    try:
        assert client.call("ping", {})["uid"] == 0
    finally:
        client.close()


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=inputs(CONTROLLER_METHODS))
def test_controller_socket(daemons, data):
    cluster, _ = daemons
    send(cluster.socket, data)
    assert cluster.controller.proc.poll() is None
    still_serving(cluster)


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=inputs(AGENT_METHODS))
def test_agent_socket(daemons, data):
    cluster, agent_sock = daemons
    send(agent_sock, data)
    assert cluster.agents["f1"].proc.poll() is None
    send(agent_sock, encode_frame({"v": 1, "k": "req", "id": 1, "m": "ping", "b": {}}))


def test_daemons_still_work_after_the_fuzzing(daemons):
    cluster, _ = daemons
    job = cluster.submit("--wrap", "true", user="root")
    assert cluster.wait_state(job, "COMPLETED", "FAILED")["state"] in ("COMPLETED", "FAILED")
    assert cluster.controller.proc.poll() is None and cluster.agents["f1"].proc.poll() is None
