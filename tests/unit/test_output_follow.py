"""The node's side of `sattach JOB.batch` (agent/follow.py) with a real `tail` and a real process
standing for the job: the file from the byte asked for, its growth, the end once the job's
process is gone (with the last bytes first), the controller's "busy" holding the reader back,
and a follower that is gone stopping it. And sattach's exit code for a job's end."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from types import SimpleNamespace

from hai_cluster.agent.follow import OutputFollows
from hai_cluster.cli import follow_batch
from hai_cluster.protocol.runspec import RunStatus, SpecError
from hai_cluster.transport.rpc import RequestError


class Controller:
    """The agent's link to the controller: takes output_data, "busy" for the first `busy` calls."""

    def __init__(self, busy: int = 0, deliver: bool = True) -> None:
        self.busy, self.deliver = busy, deliver
        self.got: list[dict] = []
        self.closed = False

    async def call(self, method, body, timeout):
        assert method == "output_data"
        if self.busy:
            self.busy -= 1
            return {"delivered": False, "busy": True}
        self.got.append(body)
        return {"delivered": self.deliver}


def agent_with(path: str, pid: int, controller: Controller):
    spec = SimpleNamespace(stdout=path, user="nobody", uid=os.getuid(), gid=os.getgid())
    run = SimpleNamespace(spec=spec, status=RunStatus(job_id=7, attempt=0, rank=0, pid=pid), dir="/nonexistent")
    agent = SimpleNamespace(runs={(7, 0): run}, cfg=SimpleNamespace(name="n1"), controller=controller)
    return OutputFollows(agent)


def test_tail_from_an_offset_to_the_jobs_end_held_back_while_busy(tmp_path):
    async def main():
        path = tmp_path / "out"
        path.write_bytes(b"skip\nline 1\n")
        job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        ctl = Controller(busy=3)
        follows = agent_with(str(path), job.pid, ctl)
        try:
            reply = await follows.start({"job_id": 7, "attempt": 0, "follow_id": 99, "offset": 5})
            assert reply == {"path": str(path), "node": "n1"}
            for _ in range(100):
                if b"".join(b["data"] for b in ctl.got) == b"line 1\n":
                    break
                await asyncio.sleep(0.1)
            with open(path, "ab") as f:
                f.write(b"line 2\n")
            await asyncio.sleep(1.5)
            with open(path, "ab") as f:
                f.write(b"last\n")
            job.kill()
            job.wait()
            for _ in range(100):
                if ctl.got and ctl.got[-1]["eof"]:
                    break
                await asyncio.sleep(0.1)
        finally:
            if job.poll() is None:
                job.kill()
                job.wait()
        assert ctl.busy == 0  # the first chunk was offered again until taken
        assert b"".join(b["data"] for b in ctl.got) == b"line 1\nline 2\nlast\n"
        assert ctl.got[-1]["eof"] and "error" not in ctl.got[-1]
        assert follows.procs == {}
    asyncio.run(main())


def test_a_follower_that_is_gone_stops_the_tail(tmp_path):
    async def main():
        path = tmp_path / "out"
        path.write_bytes(b"x\n")
        job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        ctl = Controller(deliver=False)
        follows = agent_with(str(path), job.pid, ctl)
        try:
            await follows.start({"job_id": 7, "attempt": 0, "follow_id": 1, "offset": 0})
            proc = follows.procs[1]
            await asyncio.wait_for(proc.wait(), 30)  # killed once the controller says nobody follows
            assert follows.procs == {} and job.poll() is None
        finally:
            job.kill()
            job.wait()
    asyncio.run(main())


def test_an_unreadable_file_is_said():
    async def main():
        job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        ctl = Controller()
        follows = agent_with("/nonexistent/out", job.pid, ctl)
        try:
            await follows.start({"job_id": 7, "attempt": 0, "follow_id": 2, "offset": 0})
            for _ in range(100):
                if ctl.got:
                    break
                await asyncio.sleep(0.1)
        finally:
            job.kill()
            job.wait()
        assert ctl.got[-1]["eof"] and "No such file or directory" in ctl.got[-1]["error"], ctl.got
    asyncio.run(main())


def test_exit_code_of_a_followed_jobs_end(capsys):
    assert follow_batch._report(3, {"state": "COMPLETED", "exit_code": 0, "signal": None}) == 0
    assert capsys.readouterr().err == ""
    assert follow_batch._report(3, {"state": "FAILED", "exit_code": 5, "signal": None}) == 5
    assert capsys.readouterr().err == "sattach: error: batch job 3 ended FAILED, exit code 5:0\n"
    assert follow_batch._report(3, {"state": "CANCELLED", "exit_code": 0, "signal": 15}) == 143
    assert follow_batch._report(3, {"state": "TIMEOUT", "exit_code": None, "signal": None}) == 1


def test_a_running_jobs_node_that_is_not_connected_is_waited_for(monkeypatch, capsys):
    """After a controller restart a follower may ask before the job's agent is back: the answer
    says so and the follower asks again (it does not give up on a job that is still running)."""
    from hai_cluster.controller import follow as ctl_follow
    from hai_cluster.controller.access import Caller
    from hai_cluster.controller.nodes import NodeUnavailable
    from hai_cluster.transport.rpc import RpcError

    class Link:
        async def call(self, method, body, timeout):
            raise NodeUnavailable("node n2 is not responding")

    async def db(fn, *args, **kw):
        return fn(*args, **kw)

    job = SimpleNamespace(id=7, uid=1000, state="RUNNING", spec=SimpleNamespace(interactive=False))
    repo = SimpleNamespace(job_record=lambda job_id: job,
                           live_ranks=lambda job_id: [SimpleNamespace(rank=0, node="n2", attempt=0)])
    follows = ctl_follow.OutputFollows(SimpleNamespace(db=db, repo=repo, links={"n2": Link()}))
    link = SimpleNamespace(conn=SimpleNamespace(write_timeout=1.0), follow=None)
    caller = Caller(uid=1000, gid=1000, pid=1, user="u", link=link)
    reply = asyncio.run(follows.follow({"job_id": 7, "offset": 0}, caller))
    assert reply == {"state": "RUNNING", "waiting": "node n2 is not responding"}
    assert follows.by_id == {} and link.follow is None  # nothing is left registered

    class Ctl:  # sattach's side: the node is waited for, then the job's end is heard of
        handlers: list = []
        calls = 0

        async def call(self, method, body, timeout):
            Ctl.calls += 1
            if Ctl.calls == 1:
                return reply
            raise RpcError("Could not get job step info: Job/step already completing or completed")

    monkeypatch.setattr(follow_batch, "PENDING_POLL", 0.01)
    code = asyncio.run(follow_batch.follow(Ctl(), SimpleNamespace(job_id=7, quiet=False)))
    assert (code, Ctl.calls) == (1, 2)
    assert capsys.readouterr().err == ("sattach: node n2 is not responding: waiting for it\n"
                                       "sattach: error: Could not get job step info: Job/step already "
                                       "completing or completed\n")


def test_the_rest_of_an_ended_runs_file_is_read_to_its_end(tmp_path):
    """A follower that was away while the job ended: the file from its byte to the end, then eof;
    the agent no longer needs the run (it may have forgotten it)."""
    async def main():
        path = tmp_path / "out"
        path.write_bytes(b"seen\nrest 1\nrest 2\n")
        ctl = Controller()
        follows = agent_with("/unused", 1, ctl)
        follows.agent.runs.clear()
        reply = await follows.rest({"job_id": 7, "follow_id": 3, "offset": 5, "path": str(path), "user": "nobody",
                                    "uid": os.getuid(), "gid": os.getgid()})
        assert reply == {"path": str(path), "node": "n1"}
        for _ in range(100):
            if ctl.got and ctl.got[-1]["eof"]:
                break
            await asyncio.sleep(0.1)
        assert b"".join(b["data"] for b in ctl.got) == b"rest 1\nrest 2\n"
        assert ctl.got[-1]["eof"] and "error" not in ctl.got[-1] and follows.procs == {}
        for bad, why in (({"path": "relative"}, "absolute"), ({"user": ""}, "user name"), ({"uid": -1}, "uid")):
            body = {"job_id": 7, "follow_id": 4, "offset": 0, "path": str(path), "user": "u", "uid": 1, "gid": 1,
                    **bad}
            try:
                await follows.rest(body)
            except (RequestError, SpecError) as exc:
                assert why in str(exc)
            else:
                raise AssertionError(f"accepted {bad}")
        assert follows.procs == {}
    asyncio.run(main())


def _controller_follows(job, link):
    from hai_cluster.controller import follow as ctl_follow

    async def db(fn, *args, **kw):
        return fn(*args, **kw)
    repo = SimpleNamespace(job_record=lambda job_id: job, live_ranks=lambda job_id: [])
    return ctl_follow.OutputFollows(SimpleNamespace(db=db, repo=repo, links={"n2": link}))


def test_a_job_that_ended_while_its_follower_was_away_is_read_to_its_end():
    """The controller's side: a follower asking from byte N > 0 for a job that has ended gets its
    last run's --output file from N (output_rest on the run's first node, as the run named the
    file); asking from 0 is sattach on an ended job: refused as Slurm does."""
    from hai_cluster.controller.access import Caller
    from hai_cluster.store.records import JobRecord

    calls = []

    class Link:
        async def call(self, method, body, timeout):
            calls.append((method, body))
            return {"path": body["path"], "node": "n2"}

    spec = SimpleNamespace(interactive=False, stdout="out-%j-%N-%u.txt", workdir="/home/u/w")
    job = SimpleNamespace(id=7, name="train", user="u", uid=1000, gid=100, state="FAILED", spec=spec,
                          nodelist="n2,n3", restart_count=1, array_job_id=None, array_task_id=None)
    job.nodelist_names = JobRecord.nodelist_names.fget(job)
    follows = _controller_follows(job, Link())
    link = SimpleNamespace(conn=SimpleNamespace(write_timeout=1.0), follow=None)
    caller = Caller(uid=1000, gid=100, pid=1, user="u", link=link)
    reply = asyncio.run(follows.follow({"job_id": 7, "offset": 12}, caller))
    assert reply == {"state": "FAILED", "node": "n2", "path": "/home/u/w/out-7-n2-u.txt"}
    [(method, body)] = calls
    assert method == "output_rest" and body == {"job_id": 7, "offset": 12, "path": "/home/u/w/out-7-n2-u.txt",
                                                "user": "u", "uid": 1000, "gid": 100,
                                                "follow_id": link.follow.follow_id}
    fresh = SimpleNamespace(conn=SimpleNamespace(write_timeout=1.0), follow=None)
    try:
        asyncio.run(follows.follow({"job_id": 7, "offset": 0}, Caller(uid=1000, gid=100, pid=1, user="u",
                                                                        link=fresh)))
    except RequestError as exc:
        assert str(exc) == "Could not get job step info: Job/step already completing or completed"
    else:
        raise AssertionError("an ended job was followed from its beginning")
    assert len(calls) == 1 and fresh.follow is None


def test_an_ended_jobs_rest_on_a_node_that_is_gone_is_refused_not_waited_for():
    """A job that ended (say NODE_FAIL) while its follower was away, its node not back: the
    follower is told, instead of asking again for ever."""
    from hai_cluster.controller.access import Caller
    from hai_cluster.controller.nodes import NodeUnavailable
    from hai_cluster.store.records import JobRecord

    class Link:
        async def call(self, method, body, timeout):
            raise NodeUnavailable("node n2 is not responding")

    spec = SimpleNamespace(interactive=False, stdout=None, workdir="/home/u")
    job = SimpleNamespace(id=7, name="train", user="u", uid=1000, gid=100, state="NODE_FAIL", spec=spec,
                          nodelist="n2", restart_count=0, array_job_id=None, array_task_id=None)
    job.nodelist_names = JobRecord.nodelist_names.fget(job)
    follows = _controller_follows(job, Link())
    link = SimpleNamespace(conn=SimpleNamespace(write_timeout=1.0), follow=None)
    try:
        asyncio.run(follows.follow({"job_id": 7, "offset": 5}, Caller(uid=1000, gid=100, pid=1, user="u", link=link)))
    except RequestError as exc:
        assert str(exc) == "the output of job 7 cannot be followed: node n2 is not responding"
    else:
        raise AssertionError("an ended job's gone node was waited for")
    assert follows.by_id == {} and link.follow is None
