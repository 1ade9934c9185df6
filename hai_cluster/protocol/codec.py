"""The daemons' frame codec: framing.py's frames with msgpack's C extension for the payload."""
from __future__ import annotations

import msgpack

from . import framing
from .framing import HEADER, MAX_FRAME_BYTES, ProtocolError  # noqa: F401  (this module's API)


def packb(obj: object) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def unpackb(payload: bytes) -> object:
    return msgpack.unpackb(payload, raw=False, strict_map_key=False)


def encode_frame(message: dict) -> bytes:
    return framing.frame(packb(message))


class FrameDecoder(framing.FrameDecoder):
    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES):
        super().__init__(unpackb, max_frame_bytes)
