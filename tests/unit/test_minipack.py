"""minipack (hsubmit's codec) against msgpack's C extension: the same bytes out, the same objects
back, and garbage refused as a ProtocolError by the frame decoder."""
import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hai_cluster.protocol import minipack
from hai_cluster.protocol.framing import HEADER, FrameDecoder, ProtocolError

scalars = (st.none() | st.booleans() | st.integers(min_value=-(1 << 63), max_value=(1 << 64) - 1)
           | st.floats(allow_nan=False) | st.text() | st.binary())
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=20)
                      | st.dictionaries(st.text() | st.integers(-1000, 1000), inner, max_size=20), max_leaves=60)


@settings(max_examples=300, deadline=None)
@given(values)
def test_packs_as_msgpack_does_and_reads_it_back(obj):
    theirs = msgpack.packb(obj, use_bin_type=True)
    assert minipack.packb(obj) == theirs
    assert minipack.unpackb(theirs) == msgpack.unpackb(theirs, raw=False, strict_map_key=False)


@pytest.mark.parametrize("n", [0, 15, 16, 255, 256, 65535, 65536])
def test_length_boundaries(n):
    for obj in ("x" * n, b"y" * n, [1] * n, {i: None for i in range(n)}):
        theirs = msgpack.packb(obj, use_bin_type=True)
        assert minipack.packb(obj) == theirs and minipack.unpackb(theirs) == obj


def test_float32_and_tuples_read_as_msgpack_reads_them():
    data = msgpack.packb({"f": 1.5, "t": (1, 2)}, use_single_float=True)
    assert minipack.unpackb(data) == {"f": 1.5, "t": [1, 2]}


@pytest.mark.parametrize("data, message", [
    (b"\xc1", "unsupported msgpack type byte 0xc1"),  # never used
    (b"\xd4\x01\x02", "unsupported msgpack type byte 0xd4"),  # fixext: the protocol has none
    (b"\xa5abc", "truncated"),
    (b"\xdd\xff\xff\xff\xff", "truncated"),  # four billion items announced, none sent
    (b"\x01\x02", "1 bytes after the object"),
])
def test_garbage_is_refused(data, message):
    with pytest.raises(ValueError, match=message):
        minipack.unpackb(data)


def test_frame_decoder_with_minipack_turns_garbage_into_protocol_errors():
    for payload in (b"\xc1", b"\xa2\xff\xfe", b"\x81\x91\x01\x02", b"\x91" * 100_000):
        with pytest.raises(ProtocolError):  # bad UTF-8, an array as a map key, nesting too deep
            FrameDecoder(minipack.unpackb).feed(HEADER.pack(len(payload)) + payload)
    assert FrameDecoder(minipack.unpackb).feed(HEADER.pack(1) + b"\x80") == [{}]


def test_unsupported_types_are_refused_when_packing():
    with pytest.raises(TypeError):
        minipack.packb({"x": object()})
    with pytest.raises(OverflowError):
        minipack.packb(1 << 64)
