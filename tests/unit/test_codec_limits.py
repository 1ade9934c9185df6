"""The frame decoder's limits (protocol/shape.py, protocol/codec.py): frame size, items per array
and map, nesting depth, arrays and maps in all, nothing announced beyond the frame's end, no ext
types; and that a frame is decoded as its bytes arrive, with memory proportional to them."""
from __future__ import annotations

import struct
import tracemalloc

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hai_cluster.protocol.codec import HEADER, LINK_LIMITS, FrameDecoder, ProtocolError, client_limits
from hai_cluster.protocol.shape import Limits

MiB = 1024 * 1024
ENVELOPE = {"v": 1, "k": "req", "id": 1, "m": "ping"}


def request_with_body(body_bytes: bytes) -> bytes:
    """A framed request whose body ("b") is the given raw msgpack bytes."""
    head = msgpack.packb(ENVELOPE)
    payload = bytes([head[0] + 1]) + head[1:] + msgpack.packb("b") + body_bytes  # one more map entry
    return HEADER.pack(len(payload)) + payload


def framed(obj) -> bytes:
    payload = msgpack.packb(obj, use_bin_type=True)
    return HEADER.pack(len(payload)) + payload


def feed_in_chunks(dec: FrameDecoder, data: bytes, chunk: int = 64 * 1024) -> list[dict]:
    out = []
    for i in range(0, len(data), chunk):
        out += dec.feed(data[i:i + chunk])
    return out


def nested(depth: int) -> object:
    obj: object = 1
    for _ in range(depth):
        obj = [obj]
    return obj


def test_depth_limit():
    lim = Limits(max_frame_bytes=MiB, max_items=100, max_depth=8, max_containers=100, max_total_items=MiB)
    ok = {**ENVELOPE, "b": nested(7)}  # the envelope is depth 1
    assert FrameDecoder(lim).feed(framed(ok)) == [ok]
    with pytest.raises(ProtocolError, match="nested deeper than 8 levels"):
        FrameDecoder(lim).feed(framed({**ENVELOPE, "b": nested(8)}))
    with pytest.raises(ProtocolError, match="nested deeper than 8 levels"):  # empty ones count too
        FrameDecoder(lim).feed(framed({**ENVELOPE, "b": [[[[[[[[]]]]]]]]}))


def test_deep_nesting_on_the_default_limits_is_a_protocol_error():
    """2,000 levels (past msgpack's own stack of 1,024) on either socket: a clear ProtocolError."""
    data = request_with_body(b"\x91" * 2000 + b"\xc0")
    for dec in (FrameDecoder(), FrameDecoder(client_limits(8 * MiB))):
        with pytest.raises(ProtocolError, match="nested deeper than 32 levels"):
            dec.feed(data)


def test_item_limits_refuse_the_header_before_the_items_come():
    lim = Limits(max_frame_bytes=MiB, max_items=6, max_depth=8, max_containers=100, max_total_items=MiB)  # the envelope has 5
    assert FrameDecoder(lim).feed(framed({**ENVELOPE, "b": [1, 2, 3, 4, 5, 6]}))
    with pytest.raises(ProtocolError, match="an array of 7 items exceeds the limit of 6"):
        FrameDecoder(lim).feed(framed({**ENVELOPE, "b": [1, 2, 3, 4, 5, 6, 7]}))
    with pytest.raises(ProtocolError, match="a map of 7 entries exceeds the limit of 6"):
        FrameDecoder(lim).feed(framed({**ENVELOPE, "b": {str(i): i for i in range(7)}}))
    # The client socket's limit, on an array32 header alone: refused without waiting for the items.
    data = request_with_body(b"\xdd" + struct.pack(">I", (1 << 20) + 1))
    with pytest.raises(ProtocolError, match="an array of 1048577 items exceeds the limit of 1048576"):
        FrameDecoder(client_limits(8 * MiB)).feed(data)


def test_announcing_more_than_the_frame_holds_is_refused_at_once_and_allocates_nothing():
    """A few KB of nested 'array of 65,535' headers once made msgpack allocate ~500 MB."""
    header = b"\xdc\xff\xff"
    body = header * 1000 + b"\xc0" * 2000
    tracemalloc.start()
    try:
        with pytest.raises(ProtocolError, match="items announced, more than the"):
            FrameDecoder().feed(request_with_body(body))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * MiB, f"decoding a {len(body)}-byte frame took {peak} bytes"
    with pytest.raises(ProtocolError, match="a value of 100 bytes does not fit"):
        FrameDecoder().feed(request_with_body(b"\xd9\x64" + b"x" * 10))


def test_container_limit_stops_a_frame_of_empty_arrays_early():
    """A max-size request made of empty arrays inside a real envelope: refused after the first
    chunks, long before its 8 MiB have come (and been turned into 8 million lists)."""
    per, size = 65535, 8 * MiB - 100
    count = size // (per + 3)
    body = b"\xdc" + struct.pack(">H", count) + (b"\xdc" + struct.pack(">H", per) + b"\x90" * per) * count
    data = request_with_body(body)
    dec = FrameDecoder(client_limits(8 * MiB))
    fed = 0
    with pytest.raises(ProtocolError, match="more than 131072 items"):
        for i in range(0, len(data), 64 * 1024):
            fed += 64 * 1024
            dec.feed(data[i:i + 64 * 1024])
    assert fed <= 512 * 1024
    # A bare array of empties is not even a message.
    with pytest.raises(ProtocolError, match="frame holds an array, expected a map"):
        FrameDecoder(client_limits(8 * MiB)).feed(HEADER.pack(size) + b"\xdd" + struct.pack(">I", size - 5) + b"\x90")


def test_frame_size_limit_and_largest_legitimate_request():
    lim = client_limits(8 * MiB)
    with pytest.raises(ProtocolError, match="frame length 8388609 exceeds the 8388608-byte limit"):
        FrameDecoder(lim).feed(HEADER.pack(8 * MiB + 1))
    # A submission at the submit limits (4 MiB script, 1 MiB environment) fits, in 64 KiB reads.
    env = {f"VAR{i}": "v" * 1000 for i in range(1000)}
    submit = {"v": 1, "k": "req", "id": 7, "m": "submit", "b": {"script": "#!/bin/sh\n" + "x" * (4 * MiB), "env": env}}
    assert feed_in_chunks(FrameDecoder(lim), framed(submit)) == [submit]


def test_truncated_and_overlong_messages_in_a_frame():
    payload = msgpack.packb({"a": [1, 2, 3]})
    with pytest.raises(ProtocolError):  # the frame ends inside its message
        FrameDecoder().feed(HEADER.pack(len(payload) - 1) + payload[:-1])
    with pytest.raises(ProtocolError, match="bytes after the message"):
        FrameDecoder().feed(HEADER.pack(len(payload) + 2) + payload + b"\xc0\xc0")
    with pytest.raises(ProtocolError, match="empty frame"):
        FrameDecoder().feed(HEADER.pack(0))
    dec = FrameDecoder()  # a truncated frame (more to come) just waits
    assert dec.feed(HEADER.pack(len(payload)) + payload[:3]) == [] and dec.pending_bytes == 7


@pytest.mark.parametrize("ext", [b"\xd4\x01\x02", b"\xd6\xff\x00\x00\x00\x01", b"\xc7\x01\x05x"])
def test_ext_types_are_refused(ext):
    with pytest.raises(ProtocolError, match="ext type"):
        FrameDecoder().feed(request_with_body(ext))


def test_a_frame_is_decoded_as_it_arrives():
    """Bad UTF-8 early in a 1 MiB frame is refused on the first read, not when the last byte comes."""
    body = b"\x92" + b"\xa2\xff\xfe" + msgpack.packb("x" * MiB)
    data = request_with_body(body)
    dec = FrameDecoder()
    with pytest.raises(ProtocolError, match="undecodable frame: UnicodeDecodeError"):
        dec.feed(data[:1024])


def test_gated_decoder_waits_for_admission_before_decoding():
    one, two = framed({**ENVELOPE, "id": 1}), framed({**ENVELOPE, "id": 2})
    dec = FrameDecoder(gated=True)
    assert dec.feed(one + two[:10]) == [] and dec.waiting == len(one) - 4
    assert dec.admit() == [{**ENVELOPE, "id": 1}] and dec.waiting == len(two) - 4
    assert dec.admit() == [] and dec.waiting is None and dec.pending_bytes == 10
    assert dec.feed(two[10:]) == [{**ENVELOPE, "id": 2}] and dec.pending_bytes == 0


leaf = st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats(allow_nan=False) | \
    st.text(max_size=40) | st.binary(max_size=300)
values = st.recursive(leaf, lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=8), inner,
                                                                                       max_size=6), max_leaves=30)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(bodies=st.lists(values, min_size=1, max_size=4), cuts=st.lists(st.integers(0, 4000), max_size=8))
def test_valid_messages_decode_the_same_however_they_are_cut(bodies, cuts):
    messages = [{**ENVELOPE, "id": i, "b": b} for i, b in enumerate(bodies)]
    data = b"".join(framed(m) for m in messages)
    points = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    for limits in (LINK_LIMITS, client_limits(MiB)):
        dec = FrameDecoder(limits)
        out = []
        for a, b in zip(points, points[1:]):
            out += dec.feed(data[a:b])
        assert out == messages and dec.pending_bytes == 0


@settings(max_examples=500, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.binary(max_size=400) | st.builds(lambda obj, junk: framed(obj) + junk, values, st.binary(max_size=20)),
       step=st.integers(1, 64))
def test_garbage_raises_only_protocol_errors(data, step):
    dec = FrameDecoder(client_limits(MiB))
    try:
        for i in range(0, len(data), step):
            dec.feed(data[i:i + step])
    except ProtocolError:
        pass


def test_a_client_frame_holds_a_bounded_number_of_items_in_all():
    """Sixth audit: a map of 800,000 tiny entries (7.2 MB, within every per-container limit) cost
    the controller 2 s of CPU per frame; the total is refused at the map's header."""
    data = request_with_body(b"\xdf" + struct.pack(">I", 800_000))
    with pytest.raises(ProtocolError, match="message holds more than 131072 items"):
        FrameDecoder(client_limits(8 * MiB)).feed(data)
    # what a client really sends is far below: 10,000 ids and 10,000 [array, task] pairs
    body = {"ids": list(range(10_000)), "tasks": [[1, i] for i in range(10_000)], "env": {f"V{i}": "x" for i in range(3000)}}
    assert FrameDecoder(client_limits(8 * MiB)).feed(framed({**ENVELOPE, "b": body}))
