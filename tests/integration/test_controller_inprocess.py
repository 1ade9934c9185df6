"""The controller in one process: its real loop, applier, dispatch, node link and API table, with
the agent played over the in-memory transport (transport/memory.py) by a table that checks every
start_run with the agent's own RunSpec.from_wire, and a SQLite store in a temporary file."""
from __future__ import annotations

import asyncio
import os
import pwd
import time

import pytest

from hai_cluster.config import ControllerConfig, NodeConfig
from hai_cluster.controller import nodes as node_links
from hai_cluster.controller.access import ADMIN, Caller
from hai_cluster.controller.api import build_api
from hai_cluster.controller.service import Controller
from hai_cluster.core.model import JobSpec
from hai_cluster.protocol.runspec import RunSpec, RunStatus
from hai_cluster.transport.memory import memory_pair
from hai_cluster.transport.rpc import RequestError, RpcConnection, RpcTable
from hai_cluster.transport.streams import Stream

pytestmark = pytest.mark.timeout(60)


class FakeAgent:
    """What hai-agent answers, minus running anything: runs are recorded and ended on request."""

    def __init__(self, name: str, gpus: int = 2, cpus: int = 8) -> None:
        self.name, self.gpus, self.cpus = name, gpus, cpus
        self.started: list[RunSpec] = []
        self.runs: dict[tuple[int, int], RunStatus] = {}
        self.conn: RpcConnection | None = None
        self.table = RpcTable()
        for method in ("hello", "ping", "start_run", "terminate_run", "signal_run", "list_runs", "forget_run"):
            self.table.add(method, getattr(self, method))

    async def hello(self, body, ctx):
        return {"node": self.name, "hostname": self.name, "protocol": "1", "cpus": self.cpus, "mem_mb": 16000,
                "gpu_backend": "simulated", "runs": [r.to_wire() for r in self.runs.values()], "health": None,
                "gpus": [{"index": i, "uuid": f"GPU-{self.name}-{i}", "name": "sim", "memory_mb": 81920}
                         for i in range(self.gpus)]}

    async def ping(self, body, ctx):
        return {}

    async def start_run(self, body, ctx):
        spec = RunSpec.from_wire(body["spec"])  # the agent's own check of the contract
        self.started.append(spec)
        status = self.runs.setdefault(spec.key, RunStatus.for_spec(spec, pid=4242, start_time=time.time()))
        return {"status": status.to_wire()}

    async def end(self, job_id: int, attempt: int, exit_code: int | None = 0, reason: str | None = None) -> None:
        status = self.runs[(job_id, attempt)]
        status.state, status.end_time, status.exit_code, status.reason = "ended", time.time(), exit_code, reason
        await self.conn.push("run_exited", status.to_wire())

    async def terminate_run(self, body, ctx):
        if (body["job_id"], body["attempt"]) in self.runs:
            await self.end(body["job_id"], body["attempt"], None, body["reason"])
        return {"found": True}

    async def signal_run(self, body, ctx):
        return {"delivered": True}

    async def list_runs(self, body, ctx):
        return {"runs": [r.to_wire() for r in self.runs.values()]}

    async def forget_run(self, body, ctx):
        self.runs.pop((body["job_id"], body["attempt"]), None)
        return {}


async def wait_until(check, what: str, timeout: float = 15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = await check()
        if value:
            return value
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def controller(tmp_path, monkeypatch):
    """(Controller, its API table, the fake agent of node n1), with the loop started."""
    agent = FakeAgent("n1")

    async def open_stream(node, ssh):  # the link's transport: an in-memory pipe to the fake agent
        (ra, wa), (rb, wb) = memory_pair()
        agent.conn = RpcConnection(ra, wa, table=agent.table, name="fake agent")
        asyncio.get_running_loop().create_task(agent.conn.run())
        return Stream(rb, wb, node=node.name, kind="memory")

    monkeypatch.setattr(node_links, "open_stream", open_stream)
    cfg = ControllerConfig(database=f"sqlite:///{tmp_path}/hai.db", state_dir=str(tmp_path), tick_seconds=0.1,
                           min_pass_interval=0.0, ping_interval=1.0,
                           nodes=(NodeConfig(name="n1", address="127.0.0.1", transport="local"),))
    return cfg, agent


def run(cfg, scenario):
    async def main():
        ctl = Controller(cfg)
        await ctl.start()
        try:
            await wait_until(lambda: ctl.db(lambda: {n["name"]: n for n in ctl.repo.nodes()}["n1"]["responding"]),
                             "node n1 to respond")
            await scenario(ctl, build_api(ctl))
        finally:
            await ctl.stop()
    asyncio.run(main())


def root_caller() -> Caller:
    return Caller(uid=0, gid=0, pid=os.getpid(), user=pwd.getpwuid(0).pw_name, role=ADMIN)


def test_a_submitted_job_is_started_on_the_agent_and_completes(controller, tmp_path):
    cfg, agent = controller

    async def scenario(ctl, api):
        caller = root_caller()
        reply = await api.dispatch("submit", {"argv": ["--gpus-per-node=1", "-c", "2", "--wrap", "echo hi"],
                                              "cwd": str(tmp_path), "env": {"PATH": "/usr/bin"}}, caller)
        job_id = reply["job_id"]
        await wait_until(lambda: asyncio.sleep(0, agent.started), "start_run at the agent")
        # one run (a start may be sent twice: re-sending what is unconfirmed is the protocol)
        (spec,) = {s.key: s for s in agent.started}.values()
        assert (spec.job_id, spec.gpus, spec.cpus, spec.user) == (job_id, (0,), 2, caller.user)
        assert spec.environment["SLURM_JOB_ID"] == str(job_id)
        await agent.end(job_id, 0, exit_code=0)
        job = await wait_until(lambda: ctl.db(lambda: (j := ctl.repo.job(job_id))["state"] == "COMPLETED" and j),
                               "the job to complete")
        assert job["exit_code"] == 0
        listed = await api.dispatch("jobs", {"ids": [job_id], "all": True}, caller)
        assert [j["state"] for j in listed["jobs"]] == ["COMPLETED"]

    run(cfg, scenario)


def test_a_malformed_run_report_is_dropped_and_the_controller_goes_on(controller, tmp_path, caplog):
    """Agent reports are parsed at the controller's edge (RunStatus.from_wire): a bad one is
    logged and dropped, and the next good report of the same run is recorded."""
    cfg, agent = controller

    async def scenario(ctl, api):
        spec = JobSpec(script="#!/bin/sh\ntrue\n", workdir=str(tmp_path), gpus_per_node=1)
        job_id = await ctl.db(ctl.repo.submit, spec, user="root", uid=0, gid=0, partition="gpu", now=time.time())
        await wait_until(lambda: asyncio.sleep(0, agent.started), "start_run at the agent")
        good = agent.runs[(job_id, 0)].to_wire()
        for bad in ({**good, "state": "ended", "exit_code": "zero"}, {**good, "rank": None}, ["not", "a", "map"]):
            await agent.conn.push("run_exited", bad)
        await wait_until(lambda: asyncio.sleep(0, caplog.text.count("run_exited report is malformed") == 3),
                         "three malformed reports logged")
        assert (await ctl.db(ctl.repo.job, job_id))["state"] == "RUNNING"
        await agent.end(job_id, 0, exit_code=0)
        await wait_until(lambda: ctl.db(lambda: ctl.repo.job(job_id)["state"] == "COMPLETED"), "the job to complete")

    run(cfg, scenario)


def test_a_store_error_in_a_loop_is_logged_once_a_minute(controller, caplog, monkeypatch):
    """Eighth audit: a request the store refused (SQLite's LIKE limit), sent in a loop, logged an
    outage and its end for each request: 12,000 lines in 10 s. Each request still gets its error.
    Issue 22: with the store's disk full, writes fail and reads succeed in turn; the outage is
    over only once the store has answered for STORE_QUIET seconds without a failure."""
    from sqlalchemy.exc import OperationalError
    from hai_cluster.controller import service
    from hai_cluster.controller.errors import StoreUnavailable
    cfg, _agent = controller
    monkeypatch.setattr(service, "STORE_QUIET", 1.0)

    def refused():
        raise OperationalError("INSERT", {}, Exception("database or disk is full"))

    async def scenario(ctl, api):
        for _ in range(200):
            with pytest.raises(StoreUnavailable):
                await ctl.db(refused)
            assert await ctl.db(lambda: 1) == 1
        assert caplog.text.count("the store is unavailable (database or disk is full)") == 1
        assert caplog.text.count("the store is back") == 0 and ctl.store_down
        await asyncio.sleep(1.1)
        assert await ctl.db(lambda: 1) == 1 and await ctl.db(lambda: 2) == 2
        assert caplog.text.count("the store is back") == 1 and not ctl.store_down

    run(cfg, scenario)


def test_a_listing_filter_of_too_many_users_is_refused_by_name(controller):
    """Each user, name or partition of a filter is walked on its own (store/listing.py): at most 64."""
    cfg, _agent = controller

    async def scenario(ctl, api):
        caller = root_caller()
        for method in ("jobs", "acct", "cancel", "priorities"):
            with pytest.raises(RequestError, match="field 'users' has too many entries for a filter"):
                await api.dispatch(method, {"users": [f"u{i}" for i in range(65)]}, caller)
        assert (await api.dispatch("jobs", {"users": [f"u{i}" for i in range(64)]}, caller))["jobs"] == []

    run(cfg, scenario)


def test_sprio_pages_list_the_waiting_jobs_in_the_policys_order(controller, tmp_path):
    cfg, agent = controller

    async def scenario(ctl, api):
        caller = root_caller()
        async def submit(*extra):
            return (await api.dispatch("submit", {"argv": [*extra, "--gpus-per-node=2", "--wrap", "true"],
                                                  "cwd": str(tmp_path)}, caller))["job_id"]
        ids = [await submit()]
        await wait_until(lambda: asyncio.sleep(0, agent.started), "the first to start")
        ids += [await submit(), await submit("--priority=high"), await submit("--hold")]
        first = await api.dispatch("priorities", {"limit": 1}, caller)
        assert ([j["job_id"] for j in first["jobs"]], first["more"], first["next"]) == ([ids[1]], True, ids[1])
        rest = await api.dispatch("priorities", {"limit": 1, "after": first["next"]}, caller)
        assert [j["job_id"] for j in rest["jobs"]] == [ids[2]] and not rest["more"]  # not the held one
        # the high-class job is served first though submitted later
        assert (first["jobs"][0]["priority"], rest["jobs"][0]["priority"]) == (1, 2)
        assert first["policy"] == "mlfq" and first["weights"]["qos"] > 0
        picked = await api.dispatch("priorities", {"ids": [ids[2]], "users": ["nobody"]}, caller)
        assert picked["jobs"] == []

    run(cfg, scenario)


def test_the_applier_refuses_a_start_whose_cpus_were_taken_after_the_snapshot(controller, tmp_path):
    """The tick's own path: the policy saw 8 free CPUs; before the applier ran, another start took
    6 of them; the job asking 4 stays pending and starts once they are back."""
    cfg, agent = controller

    async def scenario(ctl, api):
        spec = JobSpec(script="#!/bin/sh\ntrue\n", workdir=str(tmp_path), cpus_per_task=4)
        wants = await ctl.db(ctl.repo.submit, spec, user="root", uid=0, gid=0, partition="gpu", now=time.time())
        hog = await ctl.db(ctl.repo.submit, JobSpec(script="#!/bin/sh\ntrue\n", workdir=str(tmp_path),
                                                    cpus_per_task=6, hold=True),
                           user="root", uid=0, gid=0, partition="gpu", now=time.time())
        real_start_runs, refused = ctl.repo.start_runs, []

        def start_runs(starts, now, events=None):  # between the pass's snapshot and its apply: the hog starts
            if any(s.job_id == wants for s in starts) and not refused:
                from hai_cluster.core.model import Placement
                with ctl.repo.engine.begin() as c:
                    c.exec_driver_sql("UPDATE jobs SET hold = 0 WHERE id = ?", (hog,))
                assert real_start_runs([(hog, Placement(("n1",), ((),)))], now)[0]
                out = real_start_runs(starts, now, events)
                refused.extend(r for r in out if not r)
                return out
            return real_start_runs(starts, now, events)

        ctl.repo.start_runs = start_runs
        ctl.wake()
        await wait_until(lambda: asyncio.sleep(0, refused), "the refused start")
        assert refused[0].reason == "n1 has 2 free CPUs"
        assert (await ctl.db(ctl.repo.job, wants))["state"] == "PENDING"
        await wait_until(lambda: asyncio.sleep(0, [s for s in agent.started if s.job_id == hog]), "the hog's run")
        await agent.end(hog, 0)
        await wait_until(lambda: asyncio.sleep(0, [s for s in agent.started if s.job_id == wants]),
                         "the job to start once the CPUs are back")

    run(cfg, scenario)


def test_a_run_that_cannot_be_built_ends_and_frees_its_gpus(controller, tmp_path, monkeypatch):
    """Sixth audit: a run spec that raised while built was re-sent forever, the job holding its
    GPUs even after an admin's cancel. Now the run ends as launch_failed."""
    cfg, agent = controller
    from hai_cluster.controller import dispatcher

    def broken(*args, **kw):
        raise ValueError("Exceeds the limit (4300 digits) for integer string conversion")

    monkeypatch.setattr(dispatcher, "rank_spec", broken)

    async def scenario(ctl, api):
        spec = JobSpec(script="#!/bin/sh\ntrue\n", workdir=str(tmp_path), gpus_per_node=2, requeue=False)
        job_id = await ctl.db(ctl.repo.submit, spec, user="root", uid=0, gid=0, partition="gpu", now=time.time())
        await wait_until(lambda: ctl.db(lambda: ctl.repo.job(job_id)["state"] == "FAILED"), "the job to fail")
        runs = await ctl.db(ctl.repo.runs, job_ids=[job_id])
        assert "the controller could not build the run" in runs[-1]["reason"] and agent.started == []
        nodes = {n.name: n for n in await ctl.db(ctl.repo.load_nodes)}
        assert nodes["n1"].used_gpus == frozenset()

    run(cfg, scenario)


def test_the_api_table_refuses_bad_input_and_changes_nothing(controller, tmp_path):
    cfg, agent = controller

    async def scenario(ctl, api):
        caller = root_caller()
        for method, body, message in (
                ("cancel", {}, "No job identification provided"),
                ("cancel", {"ids": "7"}, "field 'ids' has the wrong type"),
                ("cancel", {"ids": list(range(10_001))}, "too many entries"),
                ("show_job", {"job_id": 99}, "Invalid job id specified: 99"),
                ("submit", {"argv": ["--gpus-per-node=9", "--wrap", "true"], "cwd": str(tmp_path)},
                 "Requested node configuration is not available"),
                ("no_such_method", {}, "not allowed"),
                # integers past what the store holds: refused, not an internal error with a
                # traceback in the log for each (fifth audit)
                ("jobs", {"ids": [2**64 - 1]}, "must be a list of job ids"),
                ("jobs", {"after": 2**63}, "field 'after' is out of range"),
                ("show_job", {"job_id": 2**63}, "field 'job_id' is out of range"),
                ("acct", {"since": 2**64 - 1}, "field 'since' is out of range"),
                ("cancel", {"tasks": [[1, 2**63]]}, "must be a list of \\[array job id, task id\\] pairs"),
                ("priorities", {"ids": "7"}, "field 'ids' has the wrong type"),
                ("priorities", {"tasks": [[1]]}, "must be a list of \\[array job id, task id\\] pairs"),
                ("priorities", {"partitions": ["gpu\x1b[2J"]}, "partitions"),
                ("priorities", {"limit": 0}, "limit must be positive"),
                ("submit", {"argv": ["--array=0-3%99999999999999999999", "--wrap", "true"], "cwd": str(tmp_path)},
                 "invalid task limit"),
                ("submit", {"argv": ["--dependency=afterok:9223372036854775808", "--wrap", "true"],
                            "cwd": str(tmp_path)}, "too large")):
            with pytest.raises(RequestError, match=message):
                await api.dispatch(method, body, caller)
        assert (await api.dispatch("jobs", {"all": True}, caller))["jobs"] == []
        assert agent.started == []

    run(cfg, scenario)


def test_a_requeue_takes_a_token_of_the_submission_rate(controller, tmp_path):
    """Seventh audit: requeue had no rate, and each made a run (and its rows, events, spool
    directory): a loop made 110,000 runs a day per job. It costs a submission's token now."""
    from dataclasses import replace

    from hai_cluster.controller.access import USER
    cfg, agent = controller
    cfg = replace(cfg, access=replace(cfg.access, submit_rate=0.001, submit_burst=2))
    user = Caller(uid=1000, gid=1000, pid=1, user="u", role=USER)

    async def scenario(ctl, api):
        job_id = await ctl.db(ctl.repo.submit, JobSpec(script="#!/bin/sh\ntrue\n", workdir=str(tmp_path)),
                              user="u", uid=1000, gid=1000, partition="gpu", now=time.time())
        for n in range(2):
            await wait_until(lambda: ctl.db(lambda: ctl.repo.job(job_id)["state"] == "RUNNING"), "the job to run")
            await api.dispatch("requeue", {"job_id": job_id}, user)
            await wait_until(lambda: ctl.db(lambda: ctl.repo.job(job_id)["restart_count"] == n + 1), "the requeue")
        await wait_until(lambda: ctl.db(lambda: ctl.repo.job(job_id)["state"] == "RUNNING"), "the job to run again")
        with pytest.raises(RequestError, match="submitting too fast"):
            await api.dispatch("requeue", {"job_id": job_id}, user)
        assert (await ctl.db(ctl.repo.job, job_id))["restart_count"] == 2

    run(cfg, scenario)


def test_holds_releases_and_updates_take_a_token_of_the_submission_rate(controller, tmp_path):
    """Eleventh audit: hold/release in a loop wrote 188 job versions and event rows a second,
    16 million a day, from one user. Each costs a submission's token now, as a requeue does."""
    from dataclasses import replace

    from hai_cluster.controller.access import USER
    cfg, agent = controller
    cfg = replace(cfg, access=replace(cfg.access, submit_rate=0.001, submit_burst=3))
    user = Caller(uid=1000, gid=1000, pid=1, user="u", role=USER)

    async def scenario(ctl, api):
        job_id = await ctl.db(ctl.repo.submit, JobSpec(script="#!/bin/sh\ntrue\n", workdir=str(tmp_path), hold=True),
                              user="u", uid=1000, gid=1000, partition="gpu", now=time.time())
        await api.dispatch("release", {"job_id": job_id}, user)
        await api.dispatch("hold", {"job_id": job_id}, user)
        await api.dispatch("update_job", {"job_id": job_id, "fields": {"TimeLimit": "10"}}, user)
        for call, body in (("release", {}), ("update_job", {"fields": {"TimeLimit": "5"}})):
            with pytest.raises(RequestError, match="submitting too fast"):
                await api.dispatch(call, {"job_id": job_id, **body}, user)
        job = await ctl.db(ctl.repo.job, job_id)
        assert (job["hold"], job["time_limit"]) == (True, 600)

    run(cfg, scenario)
