"""The daemons' log lines: one record is one line, whatever strings from users it holds.

A message that quoted a user's string raw (a name with a newline, an escape sequence) could
forge a record of its own in the log an operator reads (eleventh audit). The formatter writes
every non-printable character of the message as its escape; a traceback that follows is code's.

Under journald (systemd sets JOURNAL_STREAM to the device and inode of the stream it reads),
each line starts with its syslog priority (`<4>` for a warning), so `journalctl -p warning`
finds them, and carries no time of its own (the journal stamps every line).
"""
from __future__ import annotations

import logging
import os
import sys
import time

from .core.usertext import printable


class OneLineFormatter(logging.Formatter):
    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = printable(record.message)
        return super().formatMessage(record)


# sd-daemon(3)'s prefixes: the syslog priority of each level
SYSLOG_PRIORITY = {logging.CRITICAL: 2, logging.ERROR: 3, logging.WARNING: 4, logging.INFO: 6, logging.DEBUG: 7}


class JournalFormatter(OneLineFormatter):
    def format(self, record: logging.LogRecord) -> str:
        prefix = f"<{SYSLOG_PRIORITY.get(record.levelno, 6 if record.levelno < logging.WARNING else 3)}>"
        return "\n".join(prefix + line for line in super().format(record).split("\n"))  # a traceback's too


def under_journal(stream) -> bool:
    """Whether `stream` is the one journald reads (JOURNAL_STREAM=DEVICE:INODE names it)."""
    dev, sep, ino = os.environ.get("JOURNAL_STREAM", "").partition(":")
    try:
        st = os.fstat(stream.fileno())
        return bool(sep) and (st.st_dev, st.st_ino) == (int(dev), int(ino))
    except (OSError, ValueError, AttributeError):
        return False


def configure(level: int | str, fmt: str, stream=None) -> None:
    """logging.basicConfig to stderr with OneLineFormatter (JournalFormatter, without the time,
    where journald reads stderr); a no-op if logging is set up already."""
    root = logging.getLogger()
    if root.handlers:
        return
    stream = stream or sys.stderr
    handler = logging.StreamHandler(stream)
    if under_journal(stream):
        handler.setFormatter(JournalFormatter(fmt.replace("%(asctime)s ", "")))
    else:
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
