"""Message envelopes: requests, responses and pushed events, each tagged with the protocol version.

    request  {"v": 1, "k": "req", "id": int, "m": method, "b": body}
    response {"v": 1, "k": "res", "id": int, "ok": bool, "b": body, "e": error-or-None}
    event    {"v": 1, "k": "evt", "m": name, "b": body}

`parse_message` checks every field; anything malformed is a ProtocolError.
"""
from __future__ import annotations

from ..core.usertext import excerpt
from .framing import ProtocolError

PROTOCOL_VERSION = 1
# Versions this build can talk to. An old peer outside this set is refused with a clear error.
COMPATIBLE_VERSIONS = frozenset({1})


class _Record:
    """A small immutable record, as @dataclass(frozen=True) would make it. Not a dataclass: every
    CLI command imports this module, and dataclasses pulls in inspect and typing (about a quarter
    of hsubmit's start)."""
    __slots__: tuple[str, ...] = ()

    def __init__(self, *args, **kwargs) -> None:
        names = self.__slots__
        if len(args) > len(names):
            raise TypeError(f"{type(self).__name__} takes {len(names)} arguments")
        values = dict(zip(names, args))
        for name, value in kwargs.items():
            if name not in names or name in values:
                raise TypeError(f"{type(self).__name__}: unexpected or repeated argument {name!r}")
            values[name] = value
        if len(values) != len(names):
            raise TypeError(f"{type(self).__name__} needs {', '.join(names)}")
        for name in names:
            object.__setattr__(self, name, values[name])

    def __setattr__(self, name: str, value) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def _values(self) -> tuple:
        return tuple(getattr(self, n) for n in self.__slots__)

    def __eq__(self, other) -> bool:
        return type(other) is type(self) and self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{n}={getattr(self, n)!r}' for n in self.__slots__)})"


class Request(_Record):
    __slots__ = ("id", "method", "body")


class Response(_Record):
    __slots__ = ("id", "ok", "body", "error")


class Event(_Record):
    __slots__ = ("name", "body")


Message = Request | Response | Event


def request(id: int, method: str, body: object = None) -> dict:
    return {"v": PROTOCOL_VERSION, "k": "req", "id": id, "m": method, "b": body}


def response(id: int, body: object = None) -> dict:
    return {"v": PROTOCOL_VERSION, "k": "res", "id": id, "ok": True, "b": body, "e": None}


def error_response(id: int, error: str) -> dict:
    return {"v": PROTOCOL_VERSION, "k": "res", "id": id, "ok": False, "b": None, "e": error}


def event(name: str, body: object = None) -> dict:
    return {"v": PROTOCOL_VERSION, "k": "evt", "m": name, "b": body}


def _field(msg: dict, key: str, typ: type | tuple[type, ...]) -> object:
    if key not in msg:
        raise ProtocolError(f"message lacks field {key!r}")
    value = msg[key]
    if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
        raise ProtocolError(f"message field {key!r} has the wrong type")
    return value


def parse_message(msg: dict) -> Message:
    version = msg.get("v")
    if version not in COMPATIBLE_VERSIONS:
        raise ProtocolError(
            f"protocol version {excerpt(version)} is not supported (this side speaks {sorted(COMPATIBLE_VERSIONS)})")
    kind = msg.get("k")
    if kind == "req":
        return Request(_field(msg, "id", int), _field(msg, "m", str), msg.get("b"))
    if kind == "res":
        ok = _field(msg, "ok", bool)
        error = msg.get("e")
        if not ok and not isinstance(error, str):
            raise ProtocolError("error response without an error text")
        return Response(_field(msg, "id", int), ok, msg.get("b"), error)
    if kind == "evt":
        return Event(_field(msg, "m", str), msg.get("b"))
    raise ProtocolError(f"unknown message kind {excerpt(kind)}")
