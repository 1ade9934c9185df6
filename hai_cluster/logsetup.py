"""The daemons' log lines: one record is one line, whatever strings from users it holds.

A message that quoted a user's string raw (a name with a newline, an escape sequence) could
forge a record of its own in the log an operator reads (eleventh audit). The formatter writes
every non-printable character of the message as its escape; a traceback that follows is code's.
"""
from __future__ import annotations

import logging
import sys

from .core.usertext import printable


class OneLineFormatter(logging.Formatter):
    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = printable(record.message)
        return super().formatMessage(record)


def configure(level: int | str, fmt: str) -> None:
    """logging.basicConfig to stderr with OneLineFormatter; a no-op if logging is set up already."""
    root = logging.getLogger()
    if root.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(OneLineFormatter(fmt))
    root.addHandler(handler)
    root.setLevel(level)
