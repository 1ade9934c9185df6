"""Both daemons speak sd_notify to the socket named by $NOTIFY_SOCKET, as under a Type=notify unit:
READY=1 only once they serve, STATUS= lines with what they know, WATCHDOG=1 when asked for,
STOPPING=1 on SIGTERM; and jobs do not inherit the variables."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import uuid
from pathlib import Path

import pytest

from hai_cluster.cli.client import ClientError, ControllerClient

from ..e2e.harness import wait_for

BIN = Path(sys.executable).parent


class NotifySocket:
    """What systemd listens on: collects every datagram, in order, from a thread."""

    def __init__(self, address: str | bytes) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(address)
        self.sock.settimeout(0.2)
        self.messages: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._collect, daemon=True)
        self._thread.start()

    def _collect(self) -> None:
        while not self._stop.is_set():
            try:
                self.messages.append(self.sock.recv(65536).decode())
            except socket.timeout:
                continue
            except OSError:
                return

    def lines(self) -> list[str]:
        return [line for m in list(self.messages) for line in m.split("\n")]

    def wait(self, needle: str, timeout: float = 60.0) -> str:
        """The first line that starts with needle (waiting for it)."""
        def find():
            return next((x for x in self.lines() if x.startswith(needle)), None)
        return wait_for(find, timeout, 0.05, f"{needle!r} on the notify socket (got {self.lines()[-5:]})")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


@pytest.fixture
def base():
    if os.geteuid() != 0:
        pytest.fail("needs root (jobs run as root in this test's agent); run scripts/test", pytrace=False)
    d = Path(tempfile.mkdtemp(prefix="hai-sdn-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def spawn(module: str, config: Path, log: Path, notify: str) -> subprocess.Popen:
    env = {**os.environ, "NOTIFY_SOCKET": notify, "WATCHDOG_USEC": "1000000"}
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", module, "--config", str(config)], env=env,
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def stop(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    return proc.wait(30)


def test_daemons_notify_ready_status_watchdog_and_stopping(base):
    (base / "agent.toml").write_text(
        f'[agent]\nname = "n1"\nsocket = "{base}/agent.sock"\nspool = "{base}/spool"\nallow_root_jobs = true\n'
        f'poll_interval = 0.1\n[gpus]\nbackend = "simulated"\nsimulated_count = 1\n')
    (base / "controller.toml").write_text(
        f'[controller]\nsocket = "{base}/ctl.sock"\ndatabase = "sqlite:///{base}/hai.db"\nstate_dir = "{base}"\n'
        f'tick_seconds = 0.3\n[[nodes]]\nname = "n1"\ntransport = "local"\nagent_socket = "{base}/agent.sock"\n')
    abstract = f"hai-test-{uuid.uuid4().hex}"
    agent_notify = NotifySocket(b"\0" + abstract.encode())  # '@name': an abstract socket, as systemd uses
    ctl_notify = NotifySocket(str(base / "notify.sock"))
    agent = ctl = None
    try:
        agent = spawn("hai_cluster.agent.daemon", base / "agent.toml", base / "agent.log", "@" + abstract)
        agent_notify.wait("READY=1")
        with socket.socket(socket.AF_UNIX) as s:  # READY means it serves now
            s.connect(str(base / "agent.sock"))
        assert agent_notify.wait("STATUS=").startswith("STATUS=serving, 0 run(s) running")

        ctl = spawn("hai_cluster.controller.daemon", base / "controller.toml", base / "ctl.log",
                    str(base / "notify.sock"))
        ctl_notify.wait("READY=1")  # it serves (a standby too): the lease may come a moment later
        client = ControllerClient(str(base / "ctl.sock"), timeout=10)
        try:
            def active_ping():  # the socket serves at once; the store is migrated once active
                try:
                    return client.call("ping", {})
                except ClientError as exc:
                    # a lone SQLite controller says what keeps it, not "point HAI_CONTROLLER at the active one"
                    # (the lease may be held already with the store still opening: that says so too)
                    assert ("the controller is not serving yet (it is starting)" in str(exc)
                            or "its store is not open yet" in str(exc)), exc
                    return None
            assert wait_for(active_ping, 20, what="the lease")["uid"] == 0

            def store_open():  # active does not mean its store is open yet: a submission would be told to retry
                try:
                    return client.call("jobs", {"all": True}) is not None
                except ClientError as exc:
                    assert "its store is not open yet" in str(exc), exc
                    return False
            wait_for(store_open, 20, what="the store")
        finally:
            client.close()

        flag, out = base / "go", base / "job.env"
        env = {**os.environ, "HAI_CONTROLLER": str(base / "ctl.sock")}
        submitted = subprocess.run([str(BIN / "hsubmit"), "--parsable", "-o", "/dev/null", "-D", str(base), "--wrap",
                                    f"env > {out}.tmp; mv {out}.tmp {out}; while [ ! -e {flag} ]; do sleep 0.1; done"],
                                   env=env, capture_output=True, text=True)
        assert submitted.returncode == 0, (submitted.stderr, (base / "ctl.log").read_text()[-3000:])
        job = submitted.stdout.strip()
        ctl_notify.wait("STATUS=serving, 1/1 nodes responding, 1 jobs running, 0 pending")
        agent_notify.wait("STATUS=serving, 1 run(s) running, 1 controller connection(s)")
        wait_for(out.exists, 30, what="the job's environment")
        job_env = out.read_text()
        assert f"HAI_JOB_ID={job}" in job_env
        for name in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
            assert f"\n{name}=" not in "\n" + job_env, f"the job inherited {name}"
        flag.touch()

        for n in (agent_notify, ctl_notify):
            wait_for(lambda n=n: n.lines().count("WATCHDOG=1") >= 2, 30, what="watchdog pings")
        assert stop(ctl) == 0
        ctl_notify.wait("STOPPING=1", 10)
        assert stop(agent) == 0
        agent_notify.wait("STOPPING=1", 10)
        for n in (agent_notify, ctl_notify):
            lines = n.lines()
            assert lines.index("READY=1") < lines.index("STOPPING=1")
            assert lines.count("READY=1") == 1
    finally:
        for p in (ctl, agent):
            if p is not None:
                stop(p)
        agent_notify.close()
        ctl_notify.close()

