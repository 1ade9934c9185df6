"""Length-prefixed frames, whatever encodes their payload. Pure: bytes in, messages out; no I/O.

A frame is a 4-byte big-endian payload length followed by one msgpack map. Anything else
(a non-map payload, a length over the limit, bytes that do not decode) is a ProtocolError, after
which the connection must be closed: a stream that lost framing cannot be resynchronised.
The payload codec is the caller's: the daemons use msgpack's C extension (codec.py); hsubmit,
a process per submission, uses the small pure-Python one (minipack.py), which imports in a
fraction of the time.
"""
from __future__ import annotations

import struct

HEADER = struct.Struct(">I")
MAX_FRAME_BYTES = 16 * 1024 * 1024


class ProtocolError(Exception):
    """The peer sent something that is not a valid frame or message."""


def frame(payload: bytes) -> bytes:
    if len(payload) > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame of {len(payload)} bytes exceeds the {MAX_FRAME_BYTES}-byte limit")
    return HEADER.pack(len(payload)) + payload


class FrameDecoder:
    """Incremental decoder: feed() bytes as they arrive, get back the complete messages.
    `unpack` turns one payload into an object, raising anything on garbage."""

    def __init__(self, unpack, max_frame_bytes: int = MAX_FRAME_BYTES):
        self._unpack = unpack
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
            out.append(self._message(payload))
        return out

    def _message(self, payload: bytes) -> dict:
        try:
            message = self._unpack(payload)
        except Exception as exc:  # codecs raise several unrelated types on garbage
            raise ProtocolError(f"undecodable frame: {exc.__class__.__name__}") from None
        if not isinstance(message, dict):
            raise ProtocolError(f"frame is a {type(message).__name__}, expected a map")
        return message

    @property
    def pending_bytes(self) -> int:
        return len(self._buf)
