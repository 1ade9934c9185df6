"""A count of the transactions that wrote to the store through one engine: what a listing read at
generation g still holds while the count is g (controller/listing_cache.py keeps replies so).

The controller owns every write to the job table, and every one goes through its engine: a
statement that may write marks its connection, and the commit of a marked connection counts.
Transactions that only read (the scheduler's pass commits one each tick: set_reasons when no
reason changed) do not count, or no listing would outlive a tick. A write made by another process
(a person with sqlite3) is not seen: such writes are not supported while a controller runs."""
from __future__ import annotations

import itertools
import threading

from sqlalchemy import Engine, event

_DIRTY = "hai_wrote"  # in a connection's info: a statement that may write ran in its transaction
_READS = ("SELECT", "WITH", "PRAGMA")  # text statements that read (a compiled one says what it is)


class WriteGeneration:
    def __init__(self, engine) -> None:
        """engine: the repository's, an Engine or a FencedEngine (store/lease.py) over one. The
        listeners go on the Engine itself: on the wrapper, SQLAlchemy accepted them and marked the
        wrapper, not the engine, as having listeners, and no connection ever called them."""
        self.engine = engine
        self._target: Engine = engine if isinstance(engine, Engine) else engine.sa_engine
        self._count = itertools.count(1)  # next() is atomic under the GIL; writers are pool threads
        self._value = 0
        self._lock = threading.Lock()
        event.listen(self._target, "after_cursor_execute", self._executed)
        event.listen(self._target, "commit", self._committed)
        event.listen(self._target, "rollback", self._ended)

    @property
    def value(self) -> int:
        return self._value

    def bump(self) -> None:
        with self._lock:
            self._value = next(self._count)

    def _executed(self, conn, _cursor, statement, _params, context, _many) -> None:
        # A compiled INSERT/UPDATE/DELETE says so (a CTE's too); any other statement is taken for a
        # write unless it starts as a read does (the store sends no text DML behind a WITH).
        if context is not None and context.compiled is not None and (
                context.isinsert or context.isupdate or context.isdelete or context.isddl):
            conn.info[_DIRTY] = True
        elif not statement.lstrip()[:6].upper().startswith(_READS):
            conn.info[_DIRTY] = True

    def _committed(self, conn) -> None:
        if conn.info.pop(_DIRTY, False):
            self.bump()

    def _ended(self, conn) -> None:
        # A rollback undid what the transaction wrote; bump all the same (cheap, and a listing
        # read inside the transaction before it failed is never kept past it).
        if conn.info.pop(_DIRTY, False):
            self.bump()

    def close(self) -> None:
        event.remove(self._target, "after_cursor_execute", self._executed)
        event.remove(self._target, "commit", self._committed)
        event.remove(self._target, "rollback", self._ended)
