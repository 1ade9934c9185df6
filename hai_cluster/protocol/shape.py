"""The shape of a frame's msgpack payload, checked as its bytes arrive and before anything decodes
them: one map (the message), nested at most `max_depth` deep, no array or map over `max_items`,
no ext types, and nothing announced that the frame has no room for. Pure; no I/O.

Why before the decoder: msgpack's C decoder allocates an array or map for the length its header
announces, before the items come: 5 KB of nested "array of 65,535 items" headers made it take
67 MB (4 GB over the 64 connections one uid may hold). Every item needs a byte at least, so here
the items announced and not yet begun may never exceed the bytes the frame has left; what is
decoded then stays proportional to the bytes a peer sent (some tens of bytes of Python objects
per byte at worst), and those bytes are what the daemons budget (transport/rpc.py).
"""
from __future__ import annotations

from .framing import ProtocolError
from .messages import _Record

# Type byte -> (kind, bytes of its length field or fixed-size body).
_ONE, _FIXED, _FIXSTR, _STR, _FIXARRAY, _ARRAY, _FIXMAP, _MAP, _EXT, _NEVER = range(10)
_KIND: list[tuple[int, int]] = [(_ONE, 0)] * 256
for _b in range(0x80, 0x90):
    _KIND[_b] = (_FIXMAP, 0)
for _b in range(0x90, 0xa0):
    _KIND[_b] = (_FIXARRAY, 0)
for _b in range(0xa0, 0xc0):
    _KIND[_b] = (_FIXSTR, 0)
for _b, _k in {0xc1: (_NEVER, 0), 0xc4: (_STR, 1), 0xc5: (_STR, 2), 0xc6: (_STR, 4), 0xca: (_FIXED, 4),
               0xcb: (_FIXED, 8), 0xcc: (_FIXED, 1), 0xcd: (_FIXED, 2), 0xce: (_FIXED, 4), 0xcf: (_FIXED, 8),
               0xd0: (_FIXED, 1), 0xd1: (_FIXED, 2), 0xd2: (_FIXED, 4), 0xd3: (_FIXED, 8), 0xd9: (_STR, 1),
               0xda: (_STR, 2), 0xdb: (_STR, 4), 0xdc: (_ARRAY, 2), 0xdd: (_ARRAY, 4), 0xde: (_MAP, 2),
               0xdf: (_MAP, 4)}.items():
    _KIND[_b] = _k
for _b in (0xc7, 0xc8, 0xc9, 0xd4, 0xd5, 0xd6, 0xd7, 0xd8):
    _KIND[_b] = (_EXT, 0)
_WHAT = {_ONE: "a scalar", _FIXED: "a number", _FIXSTR: "a string", _STR: "a string or bytes",
         _FIXARRAY: "an array", _ARRAY: "an array", _EXT: "an ext value", _NEVER: "byte 0xc1"}


class Limits(_Record):
    """What one frame may carry: its payload size, items per array or map (a map's entries),
    nesting depth (the message map itself is depth 1), arrays and maps in all (what costs the
    decoder most: an allocation each, and the garbage collector's attention), and items in all
    (what this walk costs: a map of 800,000 tiny entries took 1.5 s of it and 0.7 s of msgpack)."""
    __slots__ = ("max_frame_bytes", "max_items", "max_depth", "max_containers", "max_total_items")


class Shape:
    """Walks one frame's payload (`length` bytes) chunk by chunk; raises ProtocolError as soon as
    the bytes seen break a rule."""

    def __init__(self, length: int, limits: Limits) -> None:
        self._left = length  # bytes of the payload not fed yet
        self._limits = limits
        self._cut = b""  # a length field split by the end of the last chunk
        self._skip = 0  # bytes of a string or number body still to pass over
        self._open = [1]  # items still to come per open container, innermost last; [0] is the frame
        self._owed = 1  # sum(self._open): items announced and not yet begun
        self._containers = limits.max_containers  # arrays and maps the frame may still hold
        self._items = limits.max_total_items  # items (a map's keys and values) the frame may still announce

    def feed(self, chunk: bytes) -> None:
        self._left -= len(chunk)
        data = self._cut + chunk if self._cut else chunk
        self._cut = b""
        if self._open == [1] and data and _KIND[data[0]][0] not in (_FIXMAP, _MAP):
            raise ProtocolError(f"frame holds {_WHAT[_KIND[data[0]][0]]}, expected a map")
        end, pos = len(data), min(self._skip, len(data))
        self._skip -= pos
        kinds, open_, owed, left = _KIND, self._open, self._owed, self._left
        max_items, max_depth = self._limits.max_items, self._limits.max_depth
        try:
            while pos < end:  # one item per turn; the plainest kinds first: this loop is per byte at worst
                if not open_:
                    raise ProtocolError(f"{end - pos + left} bytes after the message in the frame")
                code = data[pos]
                kind, size = kinds[code]
                pos += 1
                if kind == _ONE:
                    open_[-1] -= 1
                    owed -= 1
                    while open_ and not open_[-1]:
                        open_.pop()
                    continue
                n = skip = 0
                if kind == _FIXARRAY:
                    n = code & 0x0f
                elif kind == _FIXMAP:
                    n = (code & 0x0f) * 2
                elif kind == _FIXSTR:
                    skip = code & 0x1f
                elif kind == _FIXED:
                    skip = size
                elif kind == _EXT:
                    raise ProtocolError(f"msgpack ext type 0x{code:02x} is not part of the protocol")
                elif kind == _NEVER:
                    raise ProtocolError("byte 0xc1 is never valid msgpack")
                else:  # a length field follows
                    if pos + size > end:
                        self._cut = data[pos - 1:]
                        return
                    length = int.from_bytes(data[pos:pos + size], "big")
                    pos += size
                    if kind == _STR:
                        skip = length
                    else:
                        n = length * 2 if kind == _MAP else length
                if kind >= _FIXARRAY:  # a container, one level below the open ones
                    if kind >= _FIXMAP and n > 2 * max_items:
                        raise ProtocolError(f"a map of {n // 2} entries exceeds the limit of {max_items}")
                    if kind < _FIXMAP and n > max_items:
                        raise ProtocolError(f"an array of {n} items exceeds the limit of {max_items}")
                    if len(open_) > max_depth:
                        raise ProtocolError(f"message nested deeper than {max_depth} levels")
                    self._containers -= 1
                    if self._containers < 0:
                        raise ProtocolError(f"message holds more than {self._limits.max_containers} arrays and maps")
                    self._items -= n
                    if self._items < 0:  # at the header: before the items are walked
                        raise ProtocolError(f"message holds more than {self._limits.max_total_items} items")
                open_[-1] -= 1  # this item began: it takes a place in its container
                owed += n - 1
                room = end - pos + left - skip  # bytes left in the frame after this item's own
                if room < 0:
                    raise ProtocolError(f"a value of {skip} bytes does not fit in what is left of the frame")
                if owed > room:
                    raise ProtocolError(f"{owed} items announced, more than the {room} bytes left in the frame")
                if n:
                    open_.append(n)
                else:
                    while open_ and not open_[-1]:
                        open_.pop()
                if skip:
                    step = min(skip, end - pos)
                    pos += step
                    self._skip = skip - step
        finally:
            self._owed = owed

    def finish(self) -> None:
        """The frame's last byte has been fed: the message must be complete."""
        if self._open or self._cut or self._skip:
            raise ProtocolError("frame ends inside its message")
