"""Strings from users, checked where they enter the controller (its API) and made safe where they
are printed (the CLI).

A NUL cuts a C string short (paths, execve arguments); control characters in a name that other
users see (hqueue, hacct) can rewrite their terminal or forge lines; an unbounded string is an
unbounded row. Pure: no I/O.
"""
from __future__ import annotations

MAX_PATH = 4096  # PATH_MAX
MAX_NAME = 200  # jobs.name
MAX_ARG = 128 * 1024  # one argument (the kernel's MAX_ARG_STRLEN)


class TextError(ValueError):
    pass


# str.translate drops them at C speed; no `re` (it pulls enum and collections into hsubmit's start)
_CONTROL = dict.fromkeys([*range(32), *range(127, 160)])


def has_control(text: str) -> bool:
    """C0 and C1 control characters and DEL (tab and newline included)."""
    return len(text.translate(_CONTROL)) != len(text)


def checked(what: str, text: str, *, max_len: int, line: bool = True) -> str:
    """`text` unchanged if it has no NUL, no control character (when it must be one line) and at
    most `max_len` characters; else TextError naming `what`."""
    if "\0" in text:
        raise TextError(f"{what} contains a NUL character")
    if line and has_control(text):
        raise TextError(f"{what} contains control characters ({printable(text)[:80]})")
    if len(text) > max_len:
        raise TextError(f"{what} is too long ({len(text)} characters; at most {max_len})")
    return text


def printable(text: str) -> str:
    """`text` with every character that is not printable (control, format and separator
    characters such as ESC, newline, U+202E) written as its Python escape: one visible line."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def excerpt(value: object, limit: int = 40) -> str:
    """A peer's value for an error text or a log line: printable, quoted, cut to `limit`
    characters (a whole 8 MiB string in an error was 8 MiB of log a request: eleventh audit)."""
    text = printable(value if isinstance(value, str) else repr(value))
    return repr(text[:limit]) + ("..." if len(text) > limit else "")
