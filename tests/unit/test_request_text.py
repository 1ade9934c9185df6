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


def test_a_peers_value_in_a_protocol_error_is_cut_and_printable():
    from hai_cluster.protocol.framing import ProtocolError
    from hai_cluster.protocol.messages import parse_message
    for msg in ({"v": 1, "k": "A" * 7_900_000}, {"v": "B\n" * 1_000_000, "k": "req"}):
        with pytest.raises(ProtocolError) as exc:
            parse_message(msg)
        assert len(str(exc.value)) < 120 and "\n" not in str(exc.value)


def test_a_log_budget_logs_so_many_a_minute_and_counts_the_rest(caplog, monkeypatch):
    from hai_cluster import logsetup
    now = [1000.0]
    monkeypatch.setattr(logsetup.time, "monotonic", lambda: now[0])
    log = logging.getLogger("test.budget")
    budget = logsetup.LogBudget(log, 3, "denial(s)")
    assert [budget.allow() for _ in range(5)] == [True, True, True, False, False]
    now[0] += 61
    with caplog.at_level("WARNING", logger="test.budget"):
        assert budget.allow()
    assert [r.getMessage() for r in caplog.records] == ["2 more denial(s) in the last minute, not logged"]


def test_a_denial_logs_a_cut_of_what_was_asked(caplog, monkeypatch):
    from hai_cluster.controller import access
    caller = access.Caller(uid=1006, gid=1006, pid=1, user="a", role=access.USER)
    monkeypatch.setattr(access, "_denials", access.LogBudget(access.log, 2, "access denial(s)"))
    with caplog.at_level("WARNING", logger=access.log.name):
        for _ in range(5):
            err = access.deny(caller, "cancel of the jobs of " + "A" * 2_700_000)
    assert len(str(err)) > 2_700_000  # the caller is told all of it
    assert [len(r.getMessage()) < 400 for r in caplog.records] == [True, True]


def test_a_request_before_the_store_opens_is_told_to_try_again():
    """CI: a `nodes` request between taking the lease and opening the store failed with
    "'NoneType' object has no attribute 'nodes'" and a traceback in the controller's log."""
    import asyncio
    from types import SimpleNamespace

    from hai_cluster.config.controller import AccessConfig
    from hai_cluster.controller import api_jobs
    from hai_cluster.controller.access import USER, Caller
    from hai_cluster.controller.apicontext import ApiContext

    ctl = SimpleNamespace(repo=None, cfg=SimpleNamespace(access=AccessConfig()), db=None)
    ctx = ApiContext(ctl)
    with pytest.raises(RequestError, match="the controller is starting"):
        asyncio.run(api_jobs.nodes(ctx, {}, Caller(uid=1, gid=1, pid=1, user="a", role=USER)))
