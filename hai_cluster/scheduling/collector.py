"""The cyclic garbage collector, paused for one scheduling pass.

A pass over a large snapshot allocates a great many short-lived objects (copies of node views,
sort keys, actions) beside the snapshot's thousands of long-lived ones, and those allocations keep
triggering the collector, whose older generations walk the whole snapshot again each time: a tenth
of a pass at 1,000 nodes and 12,000 jobs (docs/BENCHMARKS.md). Reference counting frees the pass's
garbage as it goes (the pass makes no reference cycles: tests/unit/test_collector.py); the
collector runs again once the pass has ended. Nothing here changes a plan: the policy stays a pure
function of the snapshot.
"""
from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def collector_paused() -> Iterator[None]:
    """No cyclic collection inside the block; a collector the caller had turned off stays off."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
