"""pytest plugin: the suite run in parallel by pytest-xdist (scripts/test: `-n N --dist loadfile`).

- One file, one worker (xdist's loadfile): a module's fixtures (a cluster started once for the
  file) are made once, on one worker, and its tests run in their order, as in a serial run (some
  tests build on the one before). Not `--dist loadgroup`: with pytest 9, xdist 3.8 cannot add the
  group to a test's id (pytest keeps it in `_id` now, xdist writes `_nodeid`), so every test is
  sent on its own, a file's tests land on several workers, each starting the module's cluster,
  and a test meant to follow another runs without it.
- `@pytest.mark.serial`: the test runs while no other test of this run does (a test that measures
  latencies, or loads the machine on purpose). Each test holds a shared lock for its whole
  protocol (setup, call, teardown) and a serial one an exclusive lock; a second "turnstile" lock
  keeps a waiting serial test from being starved by a stream of shared holders. The wait happens
  outside pytest-timeout's per-test clock. Without workers (`-n 0`, HAI_TEST_WORKERS=0) nothing of
  this applies.

Every other shared resource is made safe per process, where it is made: network namespaces take
a free slot (netns.py), PostgreSQL servers and sshds pick spare ports (and retry a lost race),
clusters live in fresh mkdtemp directories, and the test users are made under a lock (users.py).
"""
from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from contextlib import contextmanager

import pytest

ENV = "HAI_TEST_SERIAL_DIR"  # the run's lock directory, made by the xdist controller for its workers


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput") or not _distributed(config):
        return
    # The controller, before it starts the workers (they inherit its environment).
    config._hai_serial_dir = tempfile.mkdtemp(prefix="hai-serial-")  # type: ignore[attr-defined]
    os.environ[ENV] = config._hai_serial_dir  # type: ignore[attr-defined]


def pytest_unconfigure(config: pytest.Config) -> None:
    d = getattr(config, "_hai_serial_dir", None)
    if d:
        shutil.rmtree(d, ignore_errors=True)
        os.environ.pop(ENV, None)


def _distributed(config: pytest.Config) -> bool:
    return getattr(config.option, "dist", "no") != "no" and bool(getattr(config.option, "tx", None))


@pytest.hookimpl(hookwrapper=True, tryfirst=True)  # outermost: the wait is not the test's time
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    d = os.environ.get(ENV) if hasattr(item.config, "workerinput") else None
    if not d:
        yield
        return
    with _turn(d, exclusive=item.get_closest_marker("serial") is not None):
        yield


@contextmanager
def _turn(directory: str, exclusive: bool):
    turnstile = _open(os.path.join(directory, "turnstile"))
    main = _open(os.path.join(directory, "tests"))
    try:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        if exclusive:  # keep the turnstile: no new test starts until this one is done
            fcntl.flock(main, fcntl.LOCK_EX)
        else:
            fcntl.flock(main, fcntl.LOCK_SH)
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        yield
    finally:
        os.close(main)
        os.close(turnstile)


def _open(path: str) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
