"""The daemons' log lines: one record is one line, whatever strings from users it holds.

A message that quoted a user's string raw (a name with a newline, an escape sequence) could
forge a record of its own in the log an operator reads (eleventh audit). The formatter writes
every non-printable character of the message as its escape; a traceback that follows is code's.
"""
from __future__ import annotations

import logging
import sys
import time

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


class LogBudget:
    """At most `per_minute` records of one kind a minute, the rest counted and said once: a
    request that makes a daemon log, sent in a loop, must not fill its disk (fifth and eleventh
    audits: tracebacks, denials, protocol errors)."""

    def __init__(self, logger: logging.Logger, per_minute: int, what: str) -> None:
        self.logger, self.per_minute, self.what = logger, per_minute, what
        self.window, self.logged, self.skipped = float("-inf"), 0, 0

    def allow(self) -> bool:
        """Whether this record may be logged (call it just before logging)."""
        now = time.monotonic()
        if now - self.window >= 60:
            if self.skipped:
                self.logger.warning("%d more %s in the last minute, not logged", self.skipped, self.what)
            self.window, self.logged, self.skipped = now, 0, 0
        if self.logged < self.per_minute:
            self.logged += 1
            return True
        self.skipped += 1
        return False
