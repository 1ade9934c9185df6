"""The controller's sacct_text request (controller/api_sacct_text.py) without a controller: what it
refuses, what it leaves to the Python sacct (forms, errors, another time zone), and whose jobs it
asks for. The text itself is compared with the Python sacct's in tests/integration/test_native_sacct.py."""
from __future__ import annotations

import os
import time

import pytest

from hai_cluster.controller import api_listing_text
from hai_cluster.controller import api_sacct_text as ast
from hai_cluster.controller.access import Caller
from hai_cluster.core.timefmt import parse_datetime
from hai_cluster.transport.rpc import RequestError

ROOT = Caller(uid=0, gid=0, pid=1, user="root")
USER = Caller(uid=65534, gid=65534, pid=1, user="nobody")  # a uid with a passwd entry


def ours(now: float | None = None) -> dict:
    """A request body from a client in this process's zone."""
    now = time.time() if now is None else now
    t = int(now)
    return {"argv": [], "env": {"TZ": os.environ["TZ"]} if "TZ" in os.environ else {}, "now": now,
            "midnight": parse_datetime("midnight", now), "offsets": [[t, time.localtime(t).tm_gmtoff]]}


@pytest.mark.parametrize("change,error", [
    ({"argv": None}, "missing field 'argv'"),
    ({"argv": "-X"}, "field 'argv' has the wrong type"),
    ({"argv": ["-X", 3]}, "field 'argv' must be a list of strings"),
    ({"argv": ["-X"] * (api_listing_text.MAX_ARGV + 1)}, "field 'argv' is too long"),
    ({"argv": ["x" * (api_listing_text.MAX_ARGV_CHARS + 1)]}, "field 'argv' is too long"),
    ({"env": ["USER"]}, "field 'env' has the wrong type"),
    ({"env": {"PATH": "/bin"}}, "field 'env' names a variable sacct does not read: 'PATH'"),
    ({"env": {"USER": 5}}, "field 'env': USER must be a string"),
    ({"env": {"SACCT_FORMAT": "JobID," * 1000}}, "field 'env': SACCT_FORMAT must be a string of at most"),
    ({"now": None}, "missing field 'now' or 'midnight'"),
    ({"now": 5}, "field 'now' has the wrong type"),
    ({"midnight": "today"}, "field 'midnight' has the wrong type"),
    ({"now": float("inf")}, "field 'now' or 'midnight' is not a time"),
    ({"now": float("nan")}, "field 'now' or 'midnight' is not a time"),
    ({"now": 9e11}, "field 'now' or 'midnight' is not a time"),  # year 30,000: datetime would raise
    ({"now": -1.0}, "field 'now' or 'midnight' is not a time"),
    ({"offsets": []}, "field 'offsets' must be 1 to"),
    ({"offsets": [[1, 2]] * (ast.MAX_OFFSETS + 1)}, "field 'offsets' must be 1 to"),
    ({"offsets": [[1, 2, 3]]}, "field 'offsets' must be 1 to"),
    ({"offsets": [[1, 2.5]]}, "field 'offsets' must be 1 to"),
    ({"offsets": [[1 << 50, 0]]}, "field 'offsets' must be 1 to"),
])
def test_bad_requests_are_refused_by_name(change, error):
    body = {k: v for k, v in {**ours(), **change}.items() if v is not None}
    with pytest.raises(RequestError, match="^" + error.replace("(", r"\(").replace(")", r"\)")):
        ast._request(body)


def test_a_body_that_is_no_map_is_refused():
    with pytest.raises(RequestError, match="request body must be a map"):
        ast._request([1, 2])


@pytest.mark.parametrize("argv", [
    ["--help"], ["-e"], ["-M", "x"], ["-Xn"], ["stray"], ["-o"], ["-o", "JobID,Bogus"], ["-o", "JobID%x"],
    ["-s", "BOGUS"], ["-S", "whenever"], ["-j", "abc"], ["-j", "1_[x]"],
])
def test_forms_the_python_sacct_prints_are_left_to_it(argv):
    body = {**ours(), "argv": argv}
    argv, env, clock = ast._request(body)
    with pytest.raises(ast.Fallback):
        ast._query(argv, env, clock, USER)


@pytest.mark.parametrize("change", [
    {"env": {"TZ": "Somewhere/Else"}},  # a TZ other than ours (this process has none, or another)
    {"midnight": 0},
    {"offsets": [[0, 12345]]},
])
def test_another_time_zone_is_left_to_the_python_sacct(change):
    if "env" in change and os.environ.get("TZ") == "Somewhere/Else":
        pytest.skip("this process runs in that zone")
    _argv, _env, clock = ast._request({**ours(), **change})
    with pytest.raises(ast.Fallback):
        ast._same_zone(clock)


def test_our_zone_is_rendered_and_whose_jobs_follows_the_caller():
    _argv, env, clock = ast._request(ours())
    ast._same_zone(clock)  # no Fallback
    mine = ast._query(["-X", "-P"], env, clock, USER)
    assert mine.start == clock.midnight and mine.body["since"] == clock.midnight
    assert mine.body["users"] == ["nobody"]  # no variables: the caller's uid's name
    # not root: the name getpass.getuser() would give (the variables first), else the uid's
    assert ast._query([], {"LOGNAME": "alice", "USER": "bob"}, clock, USER).body["users"] == ["alice"]
    assert ast._query([], {}, clock, ROOT).body.get("users") is None  # root: everyone's
    assert ast._query(["-a"], {"USER": "bob"}, clock, USER).body.get("users") is None
    assert ast._query(["--me"], {"USER": "bob"}, clock, ROOT).body["users"] == ["bob"]
    assert ast._query(["-j", "12"], {"USER": "bob"}, clock, USER).start is None  # -j: no default window
    with pytest.raises(ast.Fallback, match="no user name"):
        ast._query([], {}, clock, Caller(uid=2_000_000_000, gid=0, pid=1, user="?"))
