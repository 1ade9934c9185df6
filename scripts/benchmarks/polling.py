"""Waiting in the benchmarks: one poll loop for every script that waits for a daemon or a job."""
from __future__ import annotations

import time


def wait_until(pred, timeout: float, what: str = "a condition", interval: float = 0.02):
    """pred()'s first true value, asked every `interval` s; RuntimeError after `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(interval)
    raise RuntimeError(f"timed out waiting for {what}")
