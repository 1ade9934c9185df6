"""The daemons' frame codec: framing.py's frames with msgpack's C extension for the payload.

The decoder works on a frame as its bytes arrive: each chunk is checked (shape.py) and handed to a
resumable msgpack Unpacker at once, so a big frame costs a little per read instead of one long
stall when its last byte comes. (A thread would not help: the C decoder holds the GIL throughout.)
"""
from __future__ import annotations

import msgpack

from . import framing
from .framing import HEADER, MAX_FRAME_BYTES, ProtocolError  # noqa: F401  (this module's API)
from .shape import Limits, Shape

# Between the daemons (the agent socket and the controller's links to it): the frame limit.
LINK_LIMITS = Limits(max_frame_bytes=MAX_FRAME_BYTES, max_items=MAX_FRAME_BYTES, max_depth=32,
                     max_containers=MAX_FRAME_BYTES, max_total_items=2 * MAX_FRAME_BYTES)
# A client's request (the controller socket; the frame size is [access] max_request_bytes). Far
# above what a CLI sends: a few maps and lists, [array job, task] pairs up to max_array_size.
CLIENT_MAX_ITEMS = 1 << 20
CLIENT_MAX_CONTAINERS = 1 << 18
# Items in all (a map's keys and values count apart): a listing of 10,000 ids, 10,000 task pairs
# and an environment of a few thousand variables are far below; 800,000 tiny map entries cost
# the controller 2 s of CPU per frame (sixth audit).
CLIENT_MAX_TOTAL_ITEMS = 1 << 17


def client_limits(max_request_bytes: int) -> Limits:
    return Limits(max_frame_bytes=max_request_bytes, max_items=CLIENT_MAX_ITEMS, max_depth=32,
                  max_containers=CLIENT_MAX_CONTAINERS, max_total_items=CLIENT_MAX_TOTAL_ITEMS)


def packb(obj: object) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def unpackb(payload: bytes) -> object:
    return msgpack.unpackb(payload, raw=False, strict_map_key=False)


def encode_frame(message: dict) -> bytes:
    return framing.frame(packb(message))


class _Frame:
    """One frame whose header has come: its payload checked and decoded as it arrives."""

    def __init__(self, length: int, limits: Limits) -> None:
        self.left = length
        self._shape = Shape(length, limits)
        self._unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=max(length, 1),
                                          max_str_len=length, max_bin_len=length, max_ext_len=0,
                                          max_array_len=limits.max_items, max_map_len=limits.max_items)

    def feed(self, chunk: bytes) -> dict | None:
        """The message once the frame's last byte has come; None before."""
        self.left -= len(chunk)
        self._shape.feed(chunk)
        try:
            if chunk:
                self._unpacker.feed(chunk)
            if self.left:
                self._unpacker.unpack()  # decodes what came; OutOfData keeps its place
                raise ProtocolError("message ends before its frame")  # shape.py rules this out
            self._shape.finish()
            return self._unpacker.unpack()
        except msgpack.OutOfData:
            if not self.left:
                raise ProtocolError("frame ends inside its message") from None
            return None
        except ProtocolError:
            raise
        except Exception as exc:  # msgpack raises several unrelated types on garbage (bad UTF-8, ...)
            raise ProtocolError(f"undecodable frame: {exc.__class__.__name__}: {exc}") from None


class FrameDecoder:
    """Incremental decoder: feed() bytes as they arrive, get back the complete messages.

    With `gated`, the decoder stops at each frame's header: `waiting` is then that frame's length,
    and nothing of its payload is decoded until admit() (the caller's chance to budget the frame).
    """

    def __init__(self, limits: Limits = LINK_LIMITS, *, gated: bool = False) -> None:
        self._limits = limits
        self._gated = gated
        self._buf = bytearray()
        self._frame: _Frame | None = None
        self._received = 0  # bytes of the current frame fed so far, header included
        self.waiting: int | None = None

    def feed(self, data: bytes) -> list[dict]:
        self._buf += data
        return self._run()

    def admit(self) -> list[dict]:
        """Go on past the frame that `waiting` names."""
        self.waiting = None
        return self._run()

    def _run(self) -> list[dict]:
        out = []
        while self.waiting is None:
            if self._frame is None:
                if len(self._buf) < HEADER.size:
                    break
                (length,) = HEADER.unpack_from(self._buf)
                if length > self._limits.max_frame_bytes:
                    raise ProtocolError(f"frame length {length} exceeds the {self._limits.max_frame_bytes}-byte limit")
                if length == 0:
                    raise ProtocolError("empty frame")
                del self._buf[:HEADER.size]
                self._frame, self._received = _Frame(length, self._limits), HEADER.size
                if self._gated:
                    self.waiting = length
                    break
            chunk = bytes(self._buf[:self._frame.left])
            del self._buf[:len(chunk)]
            self._received += len(chunk)
            message = self._frame.feed(chunk)
            if message is None:
                break
            if not isinstance(message, dict):  # shape.py rules this out; a map is the envelope
                raise ProtocolError(f"frame is a {type(message).__name__}, expected a map")
            out.append(message)
            self._frame = None
        return out

    @property
    def pending_bytes(self) -> int:
        """Bytes of a frame not complete yet, buffered or already decoded."""
        return len(self._buf) + (self._received if self._frame is not None else 0)
