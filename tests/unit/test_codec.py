import msgpack
import pytest

from hai_cluster.protocol import messages
from hai_cluster.protocol.codec import HEADER, FrameDecoder, ProtocolError, client_limits, encode_frame


def test_round_trip_in_pieces():
    frames = encode_frame({"a": 1}) + encode_frame({"b": [1, 2, "x"]})
    dec = FrameDecoder()
    out = []
    for i in range(len(frames)):  # one byte at a time: partial headers and payloads
        out += dec.feed(frames[i:i + 1])
    assert out == [{"a": 1}, {"b": [1, 2, "x"]}]
    assert dec.pending_bytes == 0


def test_truncated_frame_waits_for_more():
    frame = encode_frame({"k": "v" * 100})
    dec = FrameDecoder()
    assert dec.feed(frame[:-5]) == []
    assert dec.pending_bytes == len(frame) - 5
    assert dec.feed(frame[-5:]) == [{"k": "v" * 100}]


def test_oversized_length_is_refused_before_reading_the_payload():
    dec = FrameDecoder(client_limits(1024))
    with pytest.raises(ProtocolError, match="exceeds"):
        dec.feed(HEADER.pack(1025))


def test_garbage_payload_is_a_protocol_error():
    payload = b"\xc1\xc1\xc1"  # 0xc1 is never valid msgpack
    with pytest.raises(ProtocolError, match="0xc1"):
        FrameDecoder().feed(HEADER.pack(len(payload)) + payload)


def test_non_map_payload_is_refused():
    payload = msgpack.packb([1, 2, 3])
    with pytest.raises(ProtocolError, match="expected a map"):
        FrameDecoder().feed(HEADER.pack(len(payload)) + payload)


def test_http_request_on_the_socket_is_refused():
    with pytest.raises(ProtocolError):
        FrameDecoder().feed(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")


def test_encode_refuses_oversized_message(monkeypatch):
    import hai_cluster.protocol.codec as codec
    import hai_cluster.protocol.framing as framing
    monkeypatch.setattr(framing, "MAX_FRAME_BYTES", 10)
    with pytest.raises(ProtocolError):
        codec.encode_frame({"x": "y" * 100})


def test_messages_parse_and_validate():
    assert messages.parse_message(messages.request(3, "ping", {})) == messages.Request(3, "ping", {})
    assert messages.parse_message(messages.response(3, {"ok": 1})).ok
    err = messages.parse_message(messages.error_response(3, "nope"))
    assert not err.ok and err.error == "nope"
    assert messages.parse_message(messages.event("run_exited", {"a": 1})).name == "run_exited"


@pytest.mark.parametrize("bad, text", [
    ({"v": 99, "k": "req", "id": 1, "m": "x"}, "version"),
    ({"k": "req", "id": 1, "m": "x"}, "version"),
    ({"v": 1, "k": "what"}, "kind"),
    ({"v": 1, "k": "req", "id": "1", "m": "x"}, "'id'"),
    ({"v": 1, "k": "req", "id": True, "m": "x"}, "'id'"),
    ({"v": 1, "k": "req", "id": 1}, "'m'"),
    ({"v": 1, "k": "res", "id": 1, "ok": False}, "error"),
])
def test_malformed_messages(bad, text):
    with pytest.raises(ProtocolError, match=text):
        messages.parse_message(bad)


def test_message_records_are_immutable_values():
    r = messages.Response(id=4, ok=True, body={"a": 1}, error=None)
    assert r == messages.Response(4, True, {"a": 1}, None) != messages.Response(4, True, {"a": 2}, None)
    assert r != messages.Request(4, "x", None) and repr(r) == "Response(id=4, ok=True, body={'a': 1}, error=None)"
    with pytest.raises(AttributeError):
        r.ok = False
    with pytest.raises(TypeError):
        messages.Event("only-a-name")
    assert hash(messages.Event("e", 1)) == hash(messages.Event("e", 1))
