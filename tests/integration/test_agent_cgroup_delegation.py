"""The agent's cgroups inside its own, delegated cgroup (systemd's Delegate=yes; issue 22): with
`cgroup_parent = "self"` ("auto" under systemd) the agent moves itself into <unit>/agent, the runs
go to <unit>/jobs/<node>-<hash>/<job>.<attempt> in every hierarchy it uses, and nothing is created
below the root. A restarted agent that starts outside that cgroup (systemd before v254 cannot put
a service's new main process back into a cgroup that has become an inner node) finds it again from
its spool and moves back in, and still ends the runs it left running. The unit's cgroup is made
here as systemd would make it on this hybrid host: in the unified hierarchy and in each v1 one."""
from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hai_cluster.agent import cgroups

from .agent_helpers import AgentProcess, Sandbox, client, need_root, read_when, run, wait_for
from .test_agent_isolation import LOOP, alive, key, run_cgroup

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def hierarchies() -> dict[str, str]:
    """name -> mount point: "v2" and each v1 controller the agent uses, as mounted here."""
    with open("/proc/self/mounts") as f:
        v2, v1 = cgroups.parse_mounts(f.read())
    return {**({"v2": v2} if v2 else {}), **v1}


def cgroup_of(pid: int, hierarchy: str) -> str:
    """The process's cgroup path in one hierarchy ("v2" or a v1 controller), without the leading /."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        if (hierarchy == "v2" and ctrls == "") or hierarchy in ctrls.split(","):
            return path.strip("/")
    raise AssertionError(f"process {pid} has no {hierarchy} cgroup")


@pytest.fixture
def unit():
    """A service cgroup as systemd's Delegate=yes gives one: the same path in every hierarchy."""
    need_root()
    name = f"haitest-{secrets.token_hex(4)}.service"
    mounts = hierarchies()
    if "v2" not in mounts:
        pytest.skip("no cgroup v2 here")
    for mount in mounts.values():
        os.mkdir(os.path.join(mount, name))
    yield name, mounts
    for mount in mounts.values():  # whatever a failure left: its processes, then the directories
        top = os.path.join(mount, name)
        for d, _, _ in sorted(os.walk(top), reverse=True):
            try:
                for pid in Path(d, "cgroup.procs").read_text().split():
                    os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass
        for d, _, _ in sorted(os.walk(top), key=lambda w: -w[0].count("/")):
            for _ in range(50):
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)


class AgentInUnit(AgentProcess):
    """hai-agent started inside `unit` in every hierarchy, as systemd starts a service."""

    def __init__(self, box: Sandbox, unit: str | None, mounts: dict[str, str], **kw) -> None:
        super().__init__(box, **kw)
        self.unit, self.mounts = unit, mounts

    def start(self) -> "AgentInUnit":
        procs = [os.path.join(m, self.unit, "cgroup.procs") for m in self.mounts.values()] if self.unit else []

        def join() -> None:
            for path in procs:
                with open(path, "w") as f:
                    f.write("0")

        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "hai_cluster.agent.daemon", "--config", str(self.config)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, preexec_fn=join)
        wait_for(self._ready, 30, f"the agent to serve (log: {self.log})")
        return self


def test_runs_live_below_the_agents_delegated_cgroup_and_a_restart_moves_back_in(unit):
    name, mounts = unit
    box = Sandbox()
    toml = '[isolation]\ncgroup_parent = "self"\n'
    agent = AgentInUnit(box, name, mounts, name="delegnode", agent_toml=toml).start()
    level = cgroups.agent_cgroup("delegnode", str(box.spool))
    try:
        assert cgroup_of(agent.proc.pid, "v2") == f"{name}/agent"  # out of the inner node
        spec = box.spec("#!/bin/sh\necho $$ > pid-$HAI_JOB_ID\n" + LOOP, mem_mb=128)

        async def start():
            async with client(agent) as c:
                await c.call("start_run", {"spec": spec})
                return int(await read_when(box.work / f"pid-{spec['job_id']}", "\n"))

        job_pid = run(start())
        want = f"{name}/jobs/{level}/{spec['job_id']}.{spec['attempt']}"
        used = run_cgroup(box, spec).dirs  # "v2" (membership, kill, freeze) and the v1 limits' controllers
        assert "v2" in used
        for h, d in used.items():
            assert cgroup_of(job_pid, h) == want, (h, Path(f"/proc/{job_pid}/cgroup").read_text())
            assert d == os.path.join(mounts[h], want)
        if "memory" in used:  # hybrid: the limit is v1's, in the unit's v1 cgroup too
            assert Path(used["memory"], "memory.limit_in_bytes").read_text().strip() == str(128 << 20)
        for mount in mounts.values():  # nothing of this agent below the root
            assert not os.path.exists(os.path.join(mount, "hai", level))
        assert (box.spool / cgroups.BASE_RECORD).read_text() == f"{name}\n"

        # Restart outside the unit's cgroup (as systemd before v254 does after KillMode=process).
        agent.kill(signal.SIGKILL)
        restarted = AgentInUnit(box, None, mounts, name="delegnode", agent_toml=toml).start()
        agent = restarted
        assert cgroup_of(agent.proc.pid, "v2") == f"{name}/agent"
        assert alive(job_pid) and cgroup_of(job_pid, "v2") == want

        async def cancel():
            async with client(agent) as c:
                await c.call("terminate_run", key(spec, reason="cancel"))
                return await c.exited(spec["job_id"], timeout=30)

        ended = run(cancel())
        assert ended["reason"] == "cancel"
        wait_for(lambda: not alive(job_pid), 10, "the job to be gone")
        wait_for(lambda: not any(os.path.exists(d) for d in run_cgroup(box, spec).dirs.values()), 10,
                 "the run's cgroups to be removed")
    finally:
        agent.stop()
        box.cleanup()
