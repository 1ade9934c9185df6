"""The agent's RPC surface: hello and the GPU inventory, refusals of bad requests, a peer that
sends garbage, and the socket itself."""
from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import sys

import pytest

from hai_cluster.agent import spool
from hai_cluster.protocol.codec import encode_frame
from hai_cluster.transport.rpc import RpcError

from .agent_helpers import Client, Sandbox, client, run

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def test_socket_is_root_only(agent):
    st = os.stat(agent.box.socket)
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == 0


def test_hello_reports_node_and_simulated_gpus(agent):
    async def body():
        async with client(agent) as c:
            return await c.call("hello", {"controller": "ctl-1"}), await c.call("ping", {})

    hello, ping = run(body())
    assert hello["node"] == "testnode" and hello["protocol"] == 1 and hello["hostname"]
    assert hello["cpus"] == os.cpu_count() and hello["mem_mb"] > 0
    assert hello["gpu_backend"] == "simulated"
    assert hello["gpus"] == [{"index": i, "uuid": f"GPU-sim-testnode-{i}", "name": "Simulated H100 80GB",
                              "memory_mb": 81920, "shareable": False, "isolation": "none", "links": [], "mig": []}
                             for i in range(4)]
    assert isinstance(hello["runs"], list)
    assert isinstance(ping["time"], float)


REFUSALS = [
    ("no_such_method", {}, "method 'no_such_method' is not allowed"),
    ("hello", {}, "hello body lacks field(s): controller"),
    ("hello", {"controller": 5}, "hello.controller must be a string"),
    ("hello", [1, 2], "hello body must be a map"),
    ("ping", {"x": 1}, "ping body has unknown field(s): x"),
    ("list_runs", "all", "list_runs body must be a map"),
    ("terminate_run", {"job_id": 1, "attempt": 0, "reason": "because"}, "reason must be one of"),
    ("terminate_run", {"job_id": "1", "attempt": 0, "reason": "cancel"}, "job_id must be a non-negative integer"),
    ("terminate_run", {"job_id": 1, "attempt": 0}, "lacks field(s): reason"),
    ("signal_run", {"job_id": 1, "attempt": 0, "signal": 4096}, "signal number"),
    ("signal_run", {"job_id": 1, "attempt": 0, "signal": True}, "signal number"),
    ("forget_run", {"job_id": -1, "attempt": 0}, "job_id must be a non-negative integer"),
    ("start_run", {}, "start_run body lacks field(s): spec"),
    ("start_run", {"spec": None}, "spec must be a map"),
]


@pytest.mark.parametrize("method,body,message", REFUSALS, ids=[f"{m}-{i}" for i, (m, _, _) in enumerate(REFUSALS)])
def test_bad_requests_are_refused_with_a_reason(agent, method, body, message):
    async def body_():
        async with client(agent) as c:
            with pytest.raises(RpcError) as err:
                await c.call(method, body)
            await c.call("ping")  # the connection survives a refused request
            return str(err.value)

    assert message in run(body_())


def _spec_cases(box: Sandbox) -> list[tuple[dict, str]]:
    base = box.spec("#!/bin/sh\ntrue\n", job_id=777)
    missing = dict(base)
    del missing["grace"]
    return [
        (dict(base, uid=0, gid=0, user="root"), "allow_root_jobs"),
        (dict(base, uid=59999), "uid 59999 does not exist on node testnode"),
        (dict(base, user="root"), "is user 'haitest' on node testnode, not 'root'"),
        (missing, "spec lacks field(s): grace"),
        (dict(base, extra=1), "spec has unknown field(s): extra"),
        (dict(base, job_id="7"), "spec.job_id must be a non-negative integer"),
        (dict(base, workdir="relative/dir"), "spec.workdir must be an absolute path"),
        (dict(base, script="echo no shebang"), "starting with #!"),
        (dict(base, script_args=["ok", 3]), "spec.script_args must be a list of strings"),
        (dict(base, environment={"A": 1}), "spec.environment must be a map of strings to strings"),
        (dict(base, environment={"A=B": "c"}), "invalid variable name"),
        (dict(base, stdout="/tmp/x\0y"), "contains a NUL character"),
        (dict(base, time_limit=0), "spec.time_limit must be a positive integer"),
        (dict(base, signal=0), "spec.signal must be a signal number"),
        (dict(base, grace=-1), "spec.grace must be a non-negative integer"),
    ]


def test_bad_specs_are_refused_and_start_nothing(agent):
    cases = _spec_cases(agent.box)

    async def body():
        async with client(agent) as c:
            errors = []
            for spec, _ in cases:
                with pytest.raises(RpcError) as err:
                    await c.call("start_run", {"spec": spec})
                errors.append(str(err.value))
            return errors, (await c.call("list_runs"))["runs"]

    errors, runs = run(body())
    for (_, expected), got in zip(cases, errors):
        assert expected in got
    assert 777 not in [r["job_id"] for r in runs]
    assert not (spool.runs_dir(agent.box.spool) / "777.0").exists()


@pytest.mark.parametrize("garbage", [
    b"\x00\x00\x00\x05hello",
    b"\xff\xff\xff\xff",
    encode_frame({"v": 99, "k": "req", "id": 1, "m": "ping", "b": None}),
], ids=["payload-not-a-msgpack-map", "length-over-limit", "unsupported-version"])
def test_garbage_closes_that_connection_only(agent, garbage):
    async def body():
        good = await Client.connect(agent.box.socket)
        try:
            reader, writer = await asyncio.open_unix_connection(str(agent.box.socket))
            writer.write(garbage)
            await writer.drain()
            rest = await asyncio.wait_for(reader.read(), 20)  # EOF: the agent hung up
            writer.close()
            pong = await good.call("ping")
            async with client(agent) as fresh:
                pong2 = await fresh.call("ping")
            return rest, pong, pong2
        finally:
            await good.close()

    rest, pong, pong2 = run(body())
    assert rest == b"" and "time" in pong and "time" in pong2


def test_second_agent_on_the_same_socket_is_refused(agent):
    out = subprocess.run([sys.executable, "-m", "hai_cluster.agent.daemon", "--config", str(agent.config)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "another agent is already serving" in out.stderr
    run(_ping(agent))  # the first one is untouched


async def _ping(agent):
    async with client(agent) as c:
        await c.call("ping")


def test_bad_config_is_refused(tmp_path):
    cfg = tmp_path / "agent.toml"
    cfg.write_text('[agent]\nname = "x"\nlaunch_timeout = -1\n')
    out = subprocess.run([sys.executable, "-m", "hai_cluster.agent.daemon", "--config", str(cfg)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "agent.launch_timeout must be positive" in out.stderr
