"""The controller's squeue_text request (controller/api_listing_text.py) without a controller: what
it refuses, what it leaves to the Python squeue, what it renders, and when its text depends on the
clock. The text itself is compared with the Python squeue's in tests/integration/test_native_squeue.py."""
from __future__ import annotations

import pytest

from hai_cluster.cli import squeue
from hai_cluster.controller import api_listing_text as alt
from hai_cluster.controller.access import Caller
from hai_cluster.transport.rpc import RequestError

ROOT = Caller(uid=0, gid=0, pid=1, user="root")


@pytest.mark.parametrize("body,error", [
    (None, "request body must be a map"),
    ({}, "missing field 'argv'"),
    ({"argv": "-h"}, "field 'argv' has the wrong type"),
    ({"argv": ["-h", 3]}, "field 'argv' must be a list of strings"),
    ({"argv": ["-h"] * (alt.MAX_ARGV + 1)}, "field 'argv' is too long"),
    ({"argv": ["x" * (alt.MAX_ARGV_CHARS + 1)]}, "field 'argv' is too long"),
    ({"argv": [], "env": ["USER"]}, "field 'env' has the wrong type"),
    ({"argv": [], "env": {"PATH": "/bin"}}, "field 'env' names a variable squeue does not read: 'PATH'"),
    ({"argv": [], "env": {"USER": 5}}, "field 'env': USER must be a string"),
    ({"argv": [], "env": {"SQUEUE_FORMAT": "%i" * 3000}}, "field 'env': SQUEUE_FORMAT must be a string of at most"),
])
def test_bad_requests_are_refused_by_name(body, error):
    with pytest.raises(RequestError, match="^" + error.replace("(", r"\(").replace(")", r"\)")):
        alt.client_args(body, alt.ENV_NAMES, "squeue")


@pytest.mark.parametrize("argv", [
    ["--help"], ["-l"], ["--start"], ["-s"], ["--steps=12.0"], ["-M", "x"], ["-hl"], ["-o"], ["stray"],
    ["-o", "%i %S"], ["-o", "%V"], ["-O", "endtime"], ["-o", "%Q"], ["-O", "priority"], ["-o", "%Z"],
    ["-O", "nosuch"], ["-o", "%i", "-l"], ["-j", "abc"], ["-j", "1_[x]"], ["-j", "1_[0-9999999]"],
    ["-j", ",".join(f"{i}_[0-999]" for i in range(11))],
])
def test_forms_the_python_squeue_prints_are_left_to_it(argv):
    with pytest.raises(alt.Fallback):
        alt._query(argv, {}, ROOT)


def test_env_and_me_as_the_python_squeue_reads_them():
    q = alt._query(["--me", "-h"], {"LOGNAME": "first", "USER": "second"}, ROOT)
    assert q.body["users"] == ["first"] and q.noheader
    assert alt._query(["--me"], {"USER": ""}, ROOT).body["users"] == ["root"]  # the uid's name
    q = alt._query([], {"SQUEUE_FORMAT2": "jobid:8,name", "SQUEUE_USERS": "a,b", "SQUEUE_STATES": "all"}, ROOT)
    assert [c.field for c in q.columns] == ["i", "j"] and q.body["users"] == ["a", "b"] and q.body["all"]
    q = alt._query(["-o", "%i|%T"], {"SQUEUE_FORMAT": "%j"}, ROOT)  # -o wins
    assert [c.field for c in q.columns] == ["i", "T"]
    assert alt._query(["-j", "5_[1-3]"], {}, ROOT).body["tasks"] == [[5, 1], [5, 2], [5, 3]]


def test_a_text_depends_on_the_clock_only_through_a_started_job_or_live_fields():
    pending = {"start_time": None, "end_time": None}
    running = {"start_time": 100.0, "end_time": None}
    ended = {"start_time": 100.0, "end_time": 200.0}
    default = alt._query([], {}, ROOT)
    assert not alt._clock_dependent(default, [pending, ended])
    assert alt._clock_dependent(default, [pending, running])
    assert not alt._clock_dependent(alt._query(["-o", "%i %T"], {}, ROOT), [running])
    assert alt._clock_dependent(alt._query(["-o", "%L"], {}, ROOT), [running])
    assert alt._clock_dependent(alt._query(["-O", "jobid,gpuutil"], {}, ROOT), [pending])


def test_the_text_is_the_python_squeue_s():
    """lines() is the one render: here over rows with a hostile name, as both paths call it."""
    q = alt._query(["-h", "-o", "%i|%j|%t"], {}, ROOT)
    rows = [{"id": 3, "state": "PENDING", "reason": "JobHeldUser", "array_job_id": None, "array_task_id": None,
             "partition": "gpu", "account": None, "nodelist": None, "code": "PD", "name": "a\x1b[2Jb"}]
    shown = alt.shown_listing({"jobs": rows}, ("jobs",))["jobs"]
    assert alt._text(q, shown, 0.0) == squeue.text_of(squeue.lines(q, shown, 0.0)) == "3|a\\x1b[2Jb|PD\n"
