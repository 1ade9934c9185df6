"""Helpers for the agent's integration tests: a real hai-agent process with a temp config, a
client speaking the real protocol over its Unix socket, a non-root test user, and run specs.

Nothing here mocks the OS: jobs are real processes of a real user, signalled for real.
"""
from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from hai_cluster.agent import contain, spool
from hai_cluster.transport.rpc import RpcConnection
from tests.e2e.harness import shepherd_start_toml
from tests.infra import users

TEST_USER = "haitest"
_job_ids = itertools.count(1)


def need_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("the agent tests need root (jobs run as a separate user)")


def ensure_user() -> pwd.struct_passwd:
    return users.ensure_user(TEST_USER)


def wait_for(pred: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


async def async_wait_for(pred: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


class Sandbox:
    """A temp tree reachable by the test user: spool, socket dir, and a workdir the user owns."""

    def __init__(self) -> None:
        self.user = ensure_user()
        self.base = Path(tempfile.mkdtemp(prefix="hai-agent-test-", dir="/tmp"))
        os.chmod(self.base, 0o711)  # the job's user must traverse it to reach spool and workdir
        self.work = self.base / "work"
        self.work.mkdir()
        os.chown(self.work, self.user.pw_uid, self.user.pw_gid)
        self.spool = self.base / "spool"
        self.socket = self.base / "run" / "agent.sock"

    def spec(self, script: str, **over: Any) -> dict:
        job_id = over.pop("job_id", None) or next(_job_ids)
        spec = {
            "job_id": job_id, "attempt": 0, "rank": 0, "user": TEST_USER,
            "uid": self.user.pw_uid, "gid": self.user.pw_gid, "script": script, "script_args": [],
            "workdir": str(self.work), "stdout": str(self.work / f"job-{job_id}.out"), "stderr": None,
            "environment": {"PATH": "/usr/bin:/bin", "HAI_JOB_ID": str(job_id)},
            "time_limit": None, "signal": None, "signal_time": 0, "grace": 1, "checkpoint_dir": None,
        }
        spec.update(over)
        return spec

    def cleanup(self) -> None:
        """Kill whatever a failed test left behind: shepherds of this sandbox and their jobs."""
        runs = spool.runs_dir(self.spool)
        if runs.is_dir():
            for entry in os.listdir(runs):
                run_dir = runs / entry
                job = spool.read_json(run_dir / spool.JOB) if (run_dir / spool.JOB).exists() else None
                pid = spool.find_shepherd(run_dir)
                if pid:
                    os.kill(pid, signal.SIGKILL)
                if isinstance(job, dict) and spool.same_process(job.get("pid"), job.get("starttime")):
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(job["pid"], signal.SIGKILL)
                # a container's processes are in no group of ours: its cgroup and the runtime's
                # cleanup (podman rm --force, runc delete) take them, as for a shepherd that died
                with contextlib.suppress(Exception):
                    contain.teardown_recorded(run_dir)
        if not os.environ.get("HAI_KEEP_TEST_DIRS"):  # set it to read agent and shepherd logs
            shutil.rmtree(self.base, ignore_errors=True)


class AgentProcess:
    """hai-agent as a subprocess, on a sandbox, with simulated GPUs."""

    def __init__(self, box: Sandbox, name: str = "testnode", launch_timeout: float = 20.0,
                 poll_interval: float = 0.1, agent_toml: str = "") -> None:
        self.box = box
        self.config = box.base / f"agent-{name}.toml"
        self.config.write_text(
            f'[agent]\nname = "{name}"\nsocket = "{box.socket}"\nspool = "{box.spool}"\n'
            f'poll_interval = {poll_interval}\nlaunch_timeout = {launch_timeout}\nlog_level = "DEBUG"\n'
            f'{shepherd_start_toml(agent_toml)}{agent_toml}'
            f'[gpus]\nbackend = "simulated"\nsimulated_count = 4\n'
            f'simulated_model = "Simulated H100 80GB"\nsimulated_memory_mb = 81920\n')
        self.log = box.base / f"agent-{name}.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> "AgentProcess":
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "hai_cluster.agent.daemon", "--config", str(self.config)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        wait_for(self._ready, 30, f"the agent to serve (log: {self.log})")
        return self

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"agent exited with {self.proc.returncode}:\n{self.log.read_text()}")
        with socket.socket(socket.AF_UNIX) as s:
            try:
                s.connect(str(self.box.socket))
            except OSError:
                return False
        return True

    def kill(self, sig: int = signal.SIGKILL) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.kill(signal.SIGTERM)


class Client:
    """The controller's side of one connection, collecting pushed events."""

    def __init__(self, conn: RpcConnection, task: asyncio.Task, events: list) -> None:
        self.conn, self.task, self.events = conn, task, events

    @classmethod
    async def connect(cls, path: str | os.PathLike) -> "Client":
        reader, writer = await asyncio.open_unix_connection(str(path))
        events: list = []

        async def on_event(name: str, body: Any) -> None:
            events.append((name, body))

        conn = RpcConnection(reader, writer, on_event=on_event, name="agent")
        return cls(conn, asyncio.create_task(conn.run()), events)

    async def call(self, method: str, body: Any = None) -> Any:
        return await self.conn.call(method, body, timeout=30)

    async def exited(self, job_id: int, attempt: int = 0, timeout: float = 20.0) -> dict:
        def find() -> dict | None:
            for name, body in self.events:
                if name == "run_exited" and body["job_id"] == job_id and body["attempt"] == attempt:
                    return body
            return None
        return await async_wait_for(find, timeout, f"run_exited for job {job_id}.{attempt}")

    async def close(self) -> None:
        await self.conn.close()
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


@contextlib.asynccontextmanager
async def client(agent: AgentProcess):
    c = await Client.connect(agent.box.socket)
    try:
        yield c
    finally:
        await c.close()


def run(coro) -> Any:
    return asyncio.run(coro)


def run_to_end(agent: AgentProcess, spec: dict, timeout: float = 60.0) -> dict:
    """Start the run of `spec` on the agent and wait for its run_exited event: that event's body."""
    async def body():
        async with client(agent) as c:
            await c.call("start_run", {"spec": spec})
            return await c.exited(spec["job_id"], spec["attempt"], timeout=timeout)
    return run(body())


def group_alive(pgid: int) -> bool:
    return bool(spool.group_members(pgid))


async def read_when(path: str | os.PathLike, needle: str, timeout: float = 20.0) -> str:
    """The file's text once it contains needle (jobs write asynchronously)."""
    def check() -> str | None:
        try:
            text = Path(path).read_text()
        except FileNotFoundError:
            return None
        return text if needle in text else None
    return await async_wait_for(check, timeout, f"{needle!r} in {path}")
