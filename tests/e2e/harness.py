"""A real cluster for end-to-end tests: a controller, agents (behind sshd in network namespaces,
or local), and the CLI run as an ordinary user, exactly as people use it."""
from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hai_cluster.cli.client import ClientError, ControllerClient

from ..infra import users

BIN = Path(sys.executable).parent
TEST_USER = "haitest"
OTHER_USER = "haiother"


def ensure_user(name: str) -> pwd.struct_passwd:
    return users.ensure_user(name)


def user_dir(base: Path, user: str) -> Path:
    """A directory the user owns (job scripts, output files, checkpoints)."""
    pw = ensure_user(user)
    d = base / user
    d.mkdir(parents=True, exist_ok=True)
    os.chown(d, pw.pw_uid, pw.pw_gid)
    return d


def wait_for(predicate, timeout: float = 30.0, interval: float = 0.1, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def user_processes(user: str, workdir: Path) -> list[str]:
    """'PID ARGS' of each process of `user` that belongs to the cluster in `workdir`: its working
    directory is below it, or its environment names it (a job's HAI_SUBMIT_DIR and checkpoint dir
    do, whatever the job did with its cwd). Not every process of the user: other test processes
    (pytest-xdist workers) run clusters of their own, each in its own directory, at the same time."""
    uid = ensure_user(user).pw_uid
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid:
                continue
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read().rsplit(b")", 1)[1].split()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # gone meanwhile: not left
            continue
        # a zombie has no cwd or environment left: it is the cluster's if its parent is
        if _in_cluster(int(stat[1]) if stat[0] == b"Z" else int(pid), workdir):
            found.append(f"{pid} {'<defunct>' if stat[0] == b'Z' else args}")
    return found


def _in_cluster(pid: int, workdir: Path) -> bool:
    try:
        cwd = os.readlink(f"/proc/{pid}/cwd")
        with open(f"/proc/{pid}/environ", "rb") as f:
            environ = f.read()
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
    except OSError:
        return False
    mark = os.fsencode(str(workdir))
    return cwd == str(workdir) or cwd.startswith(f"{workdir}/") or mark in environ or mark in cmdline


class Daemon:
    """A daemon process we start, kill and restart at will (Popen or a node's popen)."""

    def __init__(self, argv: list[str], log: Path, spawn=None) -> None:
        self.argv, self.log, self._spawn = argv, log, spawn or self._local
        self.proc: subprocess.Popen | None = None

    @staticmethod
    def _local(argv, **kw):
        return subprocess.Popen(argv, **kw)

    def start(self) -> None:
        out = open(self.log, "ab")
        self.proc = self._spawn(self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        out.close()

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        self.kill(signal.SIGTERM)


class Cluster:
    def __init__(self, socket: str, controller: Daemon, agents: dict[str, Daemon], workdir: Path) -> None:
        self.socket, self.controller, self.agents, self.workdir = socket, controller, agents, workdir

    def cli(self, *argv: str, user: str = TEST_USER, cwd: Path | None = None, input: str | None = None,
            check: bool = True, env: dict | None = None) -> subprocess.CompletedProcess:
        pw = ensure_user(user)
        full_env = {"PATH": f"{BIN}:/usr/bin:/bin", "HOME": pw.pw_dir, "USER": user, "LANG": "C.UTF-8",
                    "HAI_CONTROLLER": self.socket, **(env or {})}
        proc = subprocess.run([str(BIN / argv[0]), *argv[1:]], user=pw.pw_uid, group=pw.pw_gid,
                              extra_groups=[], cwd=cwd or user_dir(self.workdir, user), input=input,
                              capture_output=True, text=True, env=full_env, timeout=60)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr}{proc.stdout}")
        return proc

    def submit(self, *argv: str, user: str = TEST_USER, **kw) -> int:
        out = self.cli("hsubmit", "--parsable", *argv, user=user, **kw).stdout
        return int(out.strip())

    def call(self, method: str, body=None):
        client = ControllerClient(self.socket, timeout=30)
        try:
            return client.call(method, body)
        finally:
            client.close()

    def job_ids(self) -> list[int]:
        """Every job's id: what a refused submission must leave as it was (the jobs themselves may
        be moving on meanwhile: an earlier test's job ending)."""
        return [j["id"] for j in self.call("jobs", {"all": True})["jobs"]]

    def job(self, job_id: int) -> dict:
        return self.call("show_job", {"job_id": job_id})["job"]

    def wait_state(self, job_id: int, *states: str, timeout: float = 60.0) -> dict:
        def check():
            try:
                job = self.job(job_id)
            except ClientError:
                return None  # controller restarting
            return job if job["state"] in states else None
        return wait_for(check, timeout, 0.1, f"job {job_id} to reach {'/'.join(states)}")

    def wait_nodes(self, n: int, timeout: float = 60.0) -> None:
        def check():
            try:
                return sum(x["responding"] for x in self.call("nodes", {})["nodes"]) == n
            except ClientError:
                return False
        wait_for(check, timeout, 0.2, f"{n} responding nodes")

    def stop(self) -> None:
        self.controller.stop()
        for a in self.agents.values():
            a.stop()

    def cancel_left(self) -> None:
        """Cancel every job still alive, so that one failed test does not hold the nodes for the next."""
        if self.controller.proc is not None and self.controller.proc.poll() is None:
            try:
                self.call("cancel", {"states": ["PENDING", "RUNNING", "COMPLETING", "PREEMPTING"]})
                wait_for(lambda: not self.call("jobs", {"states": ["RUNNING", "COMPLETING", "PREEMPTING"]})["jobs"],
                         30, what="jobs to end")
            except (ClientError, AssertionError):
                pass

    def close(self) -> None:
        """Cancel what is left, stop the daemons, remove the directory."""
        self.cancel_left()
        self.stop()
        if not os.environ.get("HAI_KEEP_TEST_DIRS"):  # keep the logs to debug a failure
            shutil.rmtree(self.workdir, ignore_errors=True)


def shepherd_start_toml(agent_toml: str = "") -> str:
    """`shepherd_start` for test agents' [agent] tables: HAI_TEST_SHEPHERD_START=exec runs the tests
    with shepherds started as fresh interpreters; unset, the agent's default (fork, the zygote).
    Nothing where the test's own agent_toml sets it (a key may appear only once)."""
    mode = os.environ.get("HAI_TEST_SHEPHERD_START")
    return f'shepherd_start = "{mode}"\n' if mode and "shepherd_start" not in agent_toml else ""


def python_daemon(module: str, config: Path) -> list[str]:
    return [sys.executable, "-m", module, "--config", str(config)]


def start_ssh_cluster(ssh_nodes, *, gpus_per_node: int, scheduler_toml: str = "", tick: float = 0.3,
                      controller_toml: str = "", agent_toml: str = "", database: str | None = None) -> Cluster:
    """Agents in the nodes' namespaces behind their sshd, a controller reaching them over SSH.

    Everything lives under a fresh /tmp directory readable by the test users (pytest's own tmp
    dirs are root-only) with short socket paths; Cluster.close() removes it."""
    base = Path(tempfile.mkdtemp(prefix="hai-e2e-", dir="/tmp"))
    os.chmod(base, 0o755)
    agents = {}
    node_tables = []
    for node in ssh_nodes:
        nd = base / node.name
        nd.mkdir()
        sock = base / f"{node.name}.sock"
        (nd / "agent.toml").write_text(
            f'[agent]\nname = "{node.name}"\nsocket = "{sock}"\nspool = "{nd}/spool"\n{shepherd_start_toml(agent_toml)}'
            f'[gpus]\nbackend = "simulated"\nsimulated_count = {gpus_per_node}\n{agent_toml}\n')
        agents[node.name] = Daemon(python_daemon("hai_cluster.agent.daemon", nd / "agent.toml"),
                                   nd / "agent.log", spawn=node.popen)
        node_tables.append(f'[[nodes]]\nname = "{node.name}"\naddress = "{node.address}"\nport = {node.port}\n'
                           f'agent_socket = "{sock}"\n')
    ctl_sock = base / "controller.sock"
    default_db = f"sqlite:///{base}/hai.db"
    (base / "controller.toml").write_text(
        f'[controller]\nsocket = "{ctl_sock}"\ndatabase = "{database or default_db}"\n'
        f'state_dir = "{base}"\n'
        f'tick_seconds = {tick}\n{controller_toml}\n[ssh]\nuser = "root"\nkey = "{ssh_nodes[0].key}"\n'
        f'known_hosts = "{ssh_nodes[0].known_hosts}"\n\n{scheduler_toml}\n' + "\n".join(node_tables))
    controller = Daemon(python_daemon("hai_cluster.controller.daemon", base / "controller.toml"),
                        base / "controller.log")
    for a in agents.values():
        a.start()
    controller.start()
    cluster = Cluster(str(ctl_sock), controller, agents, base)
    try:
        cluster.wait_nodes(len(ssh_nodes))
    except BaseException:
        cluster.close()
        raise
    return cluster


def start_local_cluster(*, database: str | None = None, gpus: int = 2, tick: float = 0.3, node: str = "local1",
                        agent_toml: str = "", controller_toml: str = "", gpus_toml: str = "") -> Cluster:
    """A controller and one agent on this machine over the local transport (no sshd), for tests
    about the controller itself. `database` defaults to SQLite in the cluster's directory;
    `controller_toml` is added to the [controller] table, `gpus_toml` to the agent's [gpus]."""
    base = Path(tempfile.mkdtemp(prefix="hai-local-", dir="/tmp"))
    os.chmod(base, 0o755)
    url = database or f"sqlite:///{base}/hai.db"
    (base / "agent.toml").write_text(f'[agent]\nname = "{node}"\nsocket = "{base}/agent.sock"\n'
                                     f'spool = "{base}/spool"\n{shepherd_start_toml(agent_toml)}{agent_toml}\n'
                                     f'[gpus]\nbackend = "simulated"\nsimulated_count = {gpus}\n{gpus_toml}\n')
    (base / "controller.toml").write_text(
        f'[controller]\nsocket = "{base}/ctl.sock"\ndatabase = "{url}"\nstate_dir = "{base}"\ntick_seconds = {tick}\n'
        f'{controller_toml}\n[[nodes]]\nname = "{node}"\ntransport = "local"\nagent_socket = "{base}/agent.sock"\n')
    agent = Daemon(python_daemon("hai_cluster.agent.daemon", base / "agent.toml"), base / "agent.log")
    ctl = Daemon(python_daemon("hai_cluster.controller.daemon", base / "controller.toml"), base / "ctl.log")
    agent.start()
    ctl.start()
    cluster = Cluster(str(base / "ctl.sock"), ctl, {node: agent}, base)
    try:
        cluster.wait_nodes(1)
    except BaseException:
        cluster.close()
        raise
    return cluster
