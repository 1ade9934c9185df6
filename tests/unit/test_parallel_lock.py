"""The lock that lets a `serial` test run alone under pytest-xdist (tests/infra/parallel.py): it
waits for the tests running, and tests that come after it wait for it, however many keep coming."""
from __future__ import annotations

import fcntl
import os
import threading
import time

from tests.infra.parallel import _turn


def _held(path: str) -> bool:
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def _wait(predicate, what: str) -> None:
    deadline = time.monotonic() + 30
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_a_serial_test_waits_for_the_running_ones_and_the_next_ones_wait_for_it(tmp_path):
    d, order = str(tmp_path), []

    def run(name: str, exclusive: bool) -> threading.Thread:
        def body():
            with _turn(d, exclusive=exclusive):
                order.append(f"{name} in")
                time.sleep(0.05)
                order.append(f"{name} out")
        t = threading.Thread(target=body)
        t.start()
        return t

    running = _turn(d, exclusive=False)
    running.__enter__()  # a test under way
    other = run("other", exclusive=False)  # tests beside it run at once
    _wait(lambda: "other out" in order, "a second test beside the first")
    serial = run("serial", exclusive=True)
    _wait(lambda: _held(os.path.join(d, "turnstile")), "the serial test to queue")
    later = run("later", exclusive=False)  # came after the serial one: must not pass it
    time.sleep(0.2)
    assert order == ["other in", "other out"]  # the serial test waits for the running one
    running.__exit__(None, None, None)
    for t in (serial, later):
        t.join(30)
    assert order[2:] == ["serial in", "serial out", "later in", "later out"]
