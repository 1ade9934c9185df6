"""Message envelopes: requests, responses and pushed events, each tagged with the protocol version.

    request  {"v": 1, "k": "req", "id": int, "m": method, "b": body}
    response {"v": 1, "k": "res", "id": int, "ok": bool, "b": body, "e": error-or-None}
    event    {"v": 1, "k": "evt", "m": name, "b": body}

`parse_message` checks every field; anything malformed is a ProtocolError.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

from .codec import ProtocolError

PROTOCOL_VERSION = 1
# Versions this build can talk to. An old peer outside this set is refused with a clear error.
COMPATIBLE_VERSIONS = frozenset({1})


@dataclass(frozen=True)
class Request:
    id: int
    method: str
    body: Any


@dataclass(frozen=True)
class Response:
    id: int
    ok: bool
    body: Any
    error: str | None


@dataclass(frozen=True)
class Event:
    name: str
    body: Any


Message = Union[Request, Response, Event]


def request(id: int, method: str, body: Any = None) -> dict:
    return {"v": PROTOCOL_VERSION, "k": "req", "id": id, "m": method, "b": body}


def response(id: int, body: Any = None) -> dict:
    return {"v": PROTOCOL_VERSION, "k": "res", "id": id, "ok": True, "b": body, "e": None}


def error_response(id: int, error: str) -> dict:
    return {"v": PROTOCOL_VERSION, "k": "res", "id": id, "ok": False, "b": None, "e": error}


def event(name: str, body: Any = None) -> dict:
    return {"v": PROTOCOL_VERSION, "k": "evt", "m": name, "b": body}


def _field(msg: dict, key: str, typ: type | tuple[type, ...]) -> Any:
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
            f"protocol version {version!r} is not supported (this side speaks {sorted(COMPATIBLE_VERSIONS)})")
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
    raise ProtocolError(f"unknown message kind {kind!r}")
