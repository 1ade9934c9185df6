"""User strings in requests stay one line: refused at the API where they are names, escaped in
every daemon log line (eleventh audit: a forged `hai.access: denied uid=0` record)."""
import io
import logging

import pytest

from hai_cluster.controller.requests import filter_list
from hai_cluster.logsetup import OneLineFormatter
from hai_cluster.transport.rpc import RequestError


@pytest.mark.parametrize("value, message", [
    ("haiaudit2\n2026-12-02 15:39:00,000 WARNING hai.access: denied uid=0", "contains control characters"),
    ("a\x1b[2Jb", "contains control characters"),
    ("x" * 201, "is too long"),
    ("nul\0", "contains a NUL character"),
])
def test_a_filter_value_that_is_not_one_short_line_is_refused(value, message):
    with pytest.raises(RequestError, match=message):
        filter_list({"users": ["alice", value]}, "users")
    assert filter_list({"names": ["train-7b", "ümlaut"]}, "names") == ["train-7b", "ümlaut"]


def test_a_log_record_is_one_line_whatever_its_arguments_hold():
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(OneLineFormatter("%(levelname)s %(name)s: %(message)s"))
    log = logging.getLogger("test.onelined")
    log.addHandler(handler)
    log.propagate = False
    try:
        log.warning("denied: %s", "x\n2026-12-02 WARNING hai.access: denied uid=0\x1b[31m")
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("failed %s", "a\nb")
    finally:
        log.removeHandler(handler)
    lines = out.getvalue().splitlines()
    assert lines[0] == r"WARNING test.onelined: denied: x\n2026-12-02 WARNING hai.access: denied uid=0\x1b[31m"
    assert lines[1] == r"ERROR test.onelined: failed a\nb"
    assert lines[2] == "Traceback (most recent call last):" and lines[-1] == "ValueError: boom"
