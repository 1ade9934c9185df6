"""The controller's step table against a real store: a step whose launch never comes (srun's
agent died between the layout and the launch) is forgotten and its record ended."""
import asyncio
import os

from hai_cluster.controller import steps as hub_module
from hai_cluster.controller.steps import StepHub
from hai_cluster.core.model import JobSpec, Placement
from hai_cluster.core.steps import StepRequest
from hai_cluster.protocol.steps import request_to_wire
from hai_cluster.store.engine import make_engine, upgrade
from hai_cluster.store.repository import Repository


class Events:
    def __init__(self):
        self.kinds = []

    def record(self, kind, *args, **kw):
        self.kinds.append(kind)


class Controller:
    """What StepHub reads of the controller: the store (on a thread, as the real one), the
    events, node addresses and links, and spawn."""

    def __init__(self, repo):
        self.repo, self.events, self.addresses, self.links, self.tasks = repo, Events(), {}, {}, []

    async def db(self, fn, *args, **kw):
        return await asyncio.get_running_loop().run_in_executor(None, lambda: fn(*args, **kw))

    def spawn(self, coro):
        self.tasks.append(asyncio.ensure_future(coro))


def test_a_step_never_launched_is_forgotten_and_its_record_ended(tmp_path, monkeypatch):
    monkeypatch.setattr(hub_module, "LAUNCH_WAIT", 0.2)
    engine = make_engine(f"sqlite:///{tmp_path}/hai.db")
    upgrade(engine)
    repo = Repository(engine)
    repo.register_nodes([("a", "10.0.0.1", ["gpu"]), ("b", "10.0.0.2", ["gpu"])], now=0.0)
    for name in ("a", "b"):
        repo.update_inventory(name, {"cpus": 8, "mem_mb": 1000, "gpu_backend": "simulated", "gpus": []}, now=1.0)
        repo.set_responding(name, True, now=1.0)
    uid = os.getuid()
    j = repo.submit(JobSpec(script="#!/bin/sh\ntrue\n", workdir="/tmp", nodes=2), user="u", uid=uid, gid=uid,
                    partition="gpu", now=2)
    assert repo.start_run(j, Placement(("a", "b"), ((), ())), now=3)
    for node in ("a", "b"):
        repo.mark_rank_running(j, 0, node)
    ctl = Controller(repo)
    hub = StepHub(ctl)

    async def scenario():
        reply = await hub.create({"job_id": j, "attempt": 0, "uid": uid, "request": request_to_wire(StepRequest(ntasks=2)), "argv": ["hostname"],
                                  "cwd": "/tmp", "env": {}}, "a")
        assert reply["layout"]["step_id"] == 0 and (j, 0) in hub.live
        assert [s["step_id"] for s in repo.steps.open_of([j])] == [0]
        await asyncio.sleep(0.5)
        await asyncio.gather(*ctl.tasks)

    asyncio.run(scenario())
    assert hub.live == {} and repo.steps.open_of([j]) == []
    run_id = repo.runs(job_ids=[j])[0]["id"]
    assert [s["state"] for s in repo.steps.of_runs([run_id])] == ["CANCELLED"]
    engine.dispose()
