"""Checks of a request body's fields, shared by the API handlers (api.py, membership.py): each
wrong field is a RequestError that names it, and lists are bounded (every entry costs a lookup)."""
from __future__ import annotations

from typing import Any

from ..core.usertext import MAX_NAME, TextError, checked
from ..store.listing import MAX_FILTER_VALUES
from ..transport.rpc import RequestError

MAX_LIST = 10_000  # entries of one list in a request (ids, tasks, users, ...): every id costs a lookup
INT_RANGE = (-(2**63), 2**63 - 1)  # what the store's INTEGER columns hold (msgpack carries up to 2^64 - 1)


def expect(body: Any, key: str, typ: type | tuple, *, required: bool = False, default: Any = None) -> Any:
    if not isinstance(body, dict):
        raise RequestError("request body must be a map")
    if key not in body or body[key] is None:
        if required:
            raise RequestError(f"missing field {key!r}")
        return default
    value = body[key]
    if not isinstance(value, typ) or isinstance(value, bool) and typ is int:
        raise RequestError(f"field {key!r} has the wrong type")
    if isinstance(value, int) and not isinstance(value, bool) and not INT_RANGE[0] <= value <= INT_RANGE[1]:
        raise RequestError(f"field {key!r} is out of range")
    return value


def list_field(body: Any, key: str) -> list | None:
    values = expect(body, key, list)
    if values is not None and len(values) > MAX_LIST:
        raise RequestError(f"field {key!r} has too many entries ({len(values)}; at most {MAX_LIST} per request)")
    return values


def int_list(body: Any, key: str) -> list[int] | None:
    values = list_field(body, key)
    if values is not None and not all(_an_int(v) for v in values):
        raise RequestError(f"field {key!r} must be a list of job ids")
    return values


def _an_int(v: Any) -> bool:
    """An integer the store can hold (not a bool, which is an int in Python)."""
    return isinstance(v, int) and not isinstance(v, bool) and INT_RANGE[0] <= v <= INT_RANGE[1]


def task_list(body: Any) -> list[tuple[int, int]] | None:
    """'tasks': [[array job id, task id], ...] (hcancel 12_4, hqueue -j 12_[1-3])."""
    values = list_field(body, "tasks")
    if values is not None and not all(
            isinstance(v, list) and len(v) == 2 and all(_an_int(x) for x in v) for v in values):
        raise RequestError("field 'tasks' must be a list of [array job id, task id] pairs")
    return [tuple(v) for v in values] if values is not None else None


def str_list(body: Any, key: str) -> list[str] | None:
    values = list_field(body, key)
    if values is not None and not all(isinstance(v, str) for v in values):
        raise RequestError(f"field {key!r} must be a list of strings")
    return values


def filter_list(body: Any, key: str) -> list[str] | None:
    """Users, names or partitions a listing is filtered by: each is walked on its own
    (store/listing.py), so a listing takes at most MAX_FILTER_VALUES of them."""
    values = str_list(body, key)
    if values is not None and len(set(values)) > MAX_FILTER_VALUES:
        raise RequestError(f"field {key!r} has too many entries for a filter ({len(set(values))}; "
                           f"at most {MAX_FILTER_VALUES} in one listing)")
    for v in values or ():  # a user, job or partition name: one short line (it may reach a log)
        one_line(f"an entry of {key!r}", v)
    return values


def one_line(what: str, text: str, max_len: int = MAX_NAME) -> str:
    """A name from a request: no NUL or control character, at most max_len characters."""
    try:
        return checked(what, text, max_len=max_len)
    except TextError as exc:
        raise RequestError(str(exc)) from None
