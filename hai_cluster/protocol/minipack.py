"""A small pure-Python msgpack, for the one process that starts per submission (hsubmit).

msgpack's C extension costs ~4 ms to import (its package pulls in datetime and collections),
as much as everything else hsubmit imports; its speed only matters for big replies. This covers
what the protocol carries: nil, booleans, integers up to 64 bits, floats, str, bin, arrays and
maps; packing writes what `msgpack.packb(obj, use_bin_type=True)` writes, byte for byte
(tests/unit/test_minipack.py checks both ways against the C extension). Ext types are refused.
"""
from __future__ import annotations

import struct

_U8, _U16, _U32, _U64 = (struct.Struct(f">{c}") for c in "BHIQ")
_I8, _I16, _I32, _I64 = (struct.Struct(f">{c}") for c in "bhiq")
_F32, _F64 = struct.Struct(">f"), struct.Struct(">d")


def packb(obj: object) -> bytes:
    out: list[bytes] = []
    _pack(obj, out)
    return b"".join(out)


def _pack(obj: object, out: list[bytes]) -> None:
    if obj is None:
        out.append(b"\xc0")
    elif obj is True or obj is False:
        out.append(b"\xc3" if obj else b"\xc2")
    elif isinstance(obj, int):
        out.append(_int(obj))
    elif isinstance(obj, float):
        out.append(b"\xcb" + _F64.pack(obj))
    elif isinstance(obj, str):
        data = obj.encode("utf-8")
        out.append(_head(len(data), 0xa0, 32, b"\xd9", b"\xda", b"\xdb"))
        out.append(data)
    elif isinstance(obj, (bytes, bytearray, memoryview)):
        data = bytes(obj)
        out.append(_head(len(data), None, 0, b"\xc4", b"\xc5", b"\xc6"))
        out.append(data)
    elif isinstance(obj, (list, tuple)):
        out.append(_head(len(obj), 0x90, 16, None, b"\xdc", b"\xdd"))
        for item in obj:
            _pack(item, out)
    elif isinstance(obj, dict):
        out.append(_head(len(obj), 0x80, 16, None, b"\xde", b"\xdf"))
        for key, value in obj.items():
            _pack(key, out)
            _pack(value, out)
    else:
        raise TypeError(f"can not serialize {type(obj).__name__!r} object")


def _int(n: int) -> bytes:
    if 0 <= n < 0x80 or -32 <= n < 0:
        return _I8.pack(n) if n < 0 else _U8.pack(n)
    if n > 0:
        for code, fmt, top in ((b"\xcc", _U8, 1 << 8), (b"\xcd", _U16, 1 << 16), (b"\xce", _U32, 1 << 32),
                               (b"\xcf", _U64, 1 << 64)):
            if n < top:
                return code + fmt.pack(n)
    else:
        for code, fmt, bottom in ((b"\xd0", _I8, -(1 << 7)), (b"\xd1", _I16, -(1 << 15)),
                                  (b"\xd2", _I32, -(1 << 31)), (b"\xd3", _I64, -(1 << 63))):
            if n >= bottom:
                return code + fmt.pack(n)
    raise OverflowError(f"integer {n} does not fit in 64 bits")


def _head(length: int, fix: int | None, fix_limit: int, code8: bytes | None, code16: bytes, code32: bytes) -> bytes:
    if fix is not None and length < fix_limit:
        return _U8.pack(fix | length)
    if code8 is not None and length < 1 << 8:
        return code8 + _U8.pack(length)
    if length < 1 << 16:
        return code16 + _U16.pack(length)
    if length < 1 << 32:
        return code32 + _U32.pack(length)
    raise ValueError(f"{length} items or bytes is too many for msgpack")


def unpackb(data: bytes) -> object:
    """One object that must fill `data`; ValueError on anything else (truncation, ext types,
    trailing bytes, invalid UTF-8), TypeError for a map key that cannot be one (an array)."""
    obj, end = _unpack(memoryview(data), 0)
    if end != len(data):
        raise ValueError(f"{len(data) - end} bytes after the object")
    return obj


# Fixed-size formats: code -> (struct, or a constant when the struct is None)
_SCALARS = {0xcc: _U8, 0xcd: _U16, 0xce: _U32, 0xcf: _U64, 0xd0: _I8, 0xd1: _I16, 0xd2: _I32, 0xd3: _I64,
            0xca: _F32, 0xcb: _F64}
_LENGTHS = {0xd9: (_U8, "str"), 0xda: (_U16, "str"), 0xdb: (_U32, "str"), 0xc4: (_U8, "bin"),
            0xc5: (_U16, "bin"), 0xc6: (_U32, "bin"), 0xdc: (_U16, "array"), 0xdd: (_U32, "array"),
            0xde: (_U16, "map"), 0xdf: (_U32, "map")}


def _take(buf: memoryview, pos: int, n: int) -> tuple[memoryview, int]:
    if pos + n > len(buf):
        raise ValueError("truncated data")
    return buf[pos:pos + n], pos + n


def _unpack(buf: memoryview, pos: int) -> tuple[object, int]:
    raw, pos = _take(buf, pos, 1)
    code = raw[0]
    if code < 0x80:
        return code, pos
    if code >= 0xe0:
        return code - 0x100, pos
    if code == 0xc0:
        return None, pos
    if code in (0xc2, 0xc3):
        return code == 0xc3, pos
    if code in _SCALARS:
        fmt = _SCALARS[code]
        raw, pos = _take(buf, pos, fmt.size)
        return fmt.unpack(raw)[0], pos
    if 0xa0 <= code <= 0xbf:
        kind, length = "str", code & 0x1f
    elif 0x90 <= code <= 0x9f:
        kind, length = "array", code & 0x0f
    elif 0x80 <= code <= 0x8f:
        kind, length = "map", code & 0x0f
    elif code in _LENGTHS:
        fmt, kind = _LENGTHS[code]
        raw, pos = _take(buf, pos, fmt.size)
        length = fmt.unpack(raw)[0]
    else:
        raise ValueError(f"unsupported msgpack type byte 0x{code:02x}")
    if kind == "str":
        raw, pos = _take(buf, pos, length)
        return str(raw, "utf-8"), pos
    if kind == "bin":
        raw, pos = _take(buf, pos, length)
        return bytes(raw), pos
    if length > len(buf) - pos:  # every item takes a byte at least: refuse a forged count at once
        raise ValueError("truncated data")
    if kind == "array":
        items = []
        for _ in range(length):
            item, pos = _unpack(buf, pos)
            items.append(item)
        return items, pos
    mapping = {}
    for _ in range(length):
        key, pos = _unpack(buf, pos)
        mapping[key], pos = _unpack(buf, pos)
    return mapping, pos
