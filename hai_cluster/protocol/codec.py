"""Length-prefixed msgpack frames. Pure: bytes in, messages out; no I/O here.

A frame is a 4-byte big-endian payload length followed by one msgpack map. Anything else
(a non-map payload, a length over the limit, bytes that do not decode) is a ProtocolError, after
which the connection must be closed: a stream that lost framing cannot be resynchronised.
"""
from __future__ import annotations

import struct

import msgpack

HEADER = struct.Struct(">I")
MAX_FRAME_BYTES = 16 * 1024 * 1024


class ProtocolError(Exception):
    """The peer sent something that is not a valid frame or message."""


def encode_frame(message: dict) -> bytes:
    payload = msgpack.packb(message, use_bin_type=True)
    if len(payload) > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame of {len(payload)} bytes exceeds the {MAX_FRAME_BYTES}-byte limit")
    return HEADER.pack(len(payload)) + payload


def decode_payload(payload: bytes) -> dict:
    try:
        message = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise ProtocolError(f"undecodable frame: {exc.__class__.__name__}") from None
    if not isinstance(message, dict):
        raise ProtocolError(f"frame is a {type(message).__name__}, expected a map")
    return message


class FrameDecoder:
    """Incremental decoder: feed() bytes as they arrive, get back the complete messages."""

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES):
        self._buf = bytearray()
        self._max = max_frame_bytes

    def feed(self, data: bytes) -> list[dict]:
        self._buf += data
        out = []
        while len(self._buf) >= HEADER.size:
            (length,) = HEADER.unpack_from(self._buf)
            if length > self._max:
                raise ProtocolError(f"frame length {length} exceeds the {self._max}-byte limit")
            end = HEADER.size + length
            if len(self._buf) < end:
                break
            payload = bytes(self._buf[HEADER.size:end])
            del self._buf[:end]
            out.append(decode_payload(payload))
        return out

    @property
    def pending_bytes(self) -> int:
        return len(self._buf)
