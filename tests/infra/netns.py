"""Several "nodes" on one machine: network namespaces joined by a bridge (needs root).

    with TestNetwork(2) as net:
        proc = net.popen("hai-n1", ["sshd", ...])   # runs in hai-n1's namespace, hostname hai-n1

Layout for slot 0: bridge `haibr0` (10.213.0.1/24) in the root namespace; namespaces `hai-n1` ..
`hai-nN`, each with a veth pair (`haiv0-1` on the bridge, `eth0` inside) at 10.213.0.(10+i)/24
and loopback up. There is no default route inside: the namespaces reach only each other and the
bridge address, never anything else.

Processes start through `nsenter --net=/run/netns/NS` (not `ip netns exec`, which remounts /sys and
hides the cgroup tree) plus `unshare --uts` so that each process sees its node's hostname. Both
nsenter and unshare exec, so `Popen.pid` is the program itself.

Concurrent test runs on one machine each take a free slot (an flock on /run/hai-testnet-K.lock);
slot K uses bridge haibrK, subnet 10.213.K.0/24 and namespaces hai-nI (K = 0) or haiK-nI. Whatever
a crashed earlier run left in the slot (processes in its namespaces, namespaces, links) is removed
on entry, since no live run can hold that slot's lock.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field

MAX_SLOTS = 16
LOCK_DIR = "/run"
NETNS_DIR = "/run/netns"
REQUIRED_BINARIES = ("ip", "nsenter", "unshare", "hostname")


class NetworkSetupError(RuntimeError):
    pass


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if check and proc.returncode != 0:
        raise NetworkSetupError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def missing_binaries() -> list[str]:
    return [b for b in REQUIRED_BINARIES if shutil.which(b) is None]


@dataclass
class NetNode:
    name: str  # node name, also its hostname inside the namespace
    netns: str  # name under /run/netns
    address: str  # IPv4 address on the bridge subnet
    veth_host: str  # the veth end attached to the bridge (root namespace)

    @property
    def netns_path(self) -> str:
        return f"{NETNS_DIR}/{self.netns}"


@dataclass
class TestNetwork:
    """Bridge + N namespaces; a context manager. See the module docstring."""

    __test__ = False  # not a pytest test class

    count: int = 2
    nodes: list[NetNode] = field(default_factory=list, init=False)
    slot: int = field(default=-1, init=False)
    bridge: str = field(default="", init=False)
    gateway: str = field(default="", init=False)
    _lock_fd: int | None = field(default=None, init=False, repr=False)
    _procs: list[subprocess.Popen] = field(default_factory=list, init=False, repr=False)

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> "TestNetwork":
        if os.geteuid() != 0:
            raise NetworkSetupError("network namespaces need root")
        missing = missing_binaries()
        if missing:
            raise NetworkSetupError(f"missing binaries: {', '.join(missing)}")
        if not 1 <= self.count <= 200:
            raise ValueError("count must be between 1 and 200")
        self._take_slot()
        try:
            self._layout()
            self._remove_leftovers()
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _take_slot(self) -> None:
        for slot in range(MAX_SLOTS):
            fd = os.open(f"{LOCK_DIR}/hai-testnet-{slot}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            self.slot, self._lock_fd = slot, fd
            return
        raise NetworkSetupError(f"all {MAX_SLOTS} test network slots are in use")

    def _layout(self) -> None:
        k = self.slot
        prefix = "hai" if k == 0 else f"hai{k}"
        self.bridge = f"haibr{k}"
        self.gateway = f"10.213.{k}.1"
        self.nodes = [
            NetNode(name=f"{prefix}-n{i}", netns=f"{prefix}-n{i}", address=f"10.213.{k}.{10 + i}",
                    veth_host=f"haiv{k}-{i}")
            for i in range(1, self.count + 1)
        ]

    def _slot_namespaces(self) -> list[str]:
        """Namespaces that belong to this slot, whatever count the run that made them used."""
        prefix = "hai" if self.slot == 0 else f"hai{self.slot}"
        try:
            names = os.listdir(NETNS_DIR)
        except FileNotFoundError:
            return []
        return [n for n in names if n.startswith(f"{prefix}-n") and n[len(prefix) + 2:].isdigit()]

    def _slot_links(self) -> list[str]:
        out = _run("ip", "-o", "link", "show", check=False).stdout
        links = []
        for line in out.splitlines():
            parts = line.split(":", 2)
            if len(parts) < 2:
                continue
            name = parts[1].strip().split("@")[0]
            if name == self.bridge or name.startswith(f"haiv{self.slot}-"):
                links.append(name)
        return links

    def _remove_leftovers(self) -> None:
        for ns in self._slot_namespaces():
            self._kill_namespace_pids(ns)
            _run("ip", "netns", "del", ns, check=False)
        for link in self._slot_links():
            _run("ip", "link", "del", link, check=False)

    def _create(self) -> None:
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        for node in self.nodes:
            _run("ip", "netns", "add", node.netns)
            _run("ip", "link", "add", node.veth_host, "type", "veth", "peer", "name", "eth0", "netns", node.netns)
            _run("ip", "link", "set", node.veth_host, "master", self.bridge)
            _run("ip", "link", "set", node.veth_host, "up")
            _run("ip", "-n", node.netns, "addr", "add", f"{node.address}/24", "dev", "eth0")
            _run("ip", "-n", node.netns, "link", "set", "eth0", "up")
            _run("ip", "-n", node.netns, "link", "set", "lo", "up")
        self._wait_links_up()

    def _wait_links_up(self, timeout: float = 30.0) -> None:
        """A bridge port forwards once its veth carrier is up; wait for that, not for a fixed time."""
        deadline = time.monotonic() + timeout
        pending = {n.veth_host for n in self.nodes}
        while pending:
            for name in list(pending):
                try:
                    with open(f"/sys/class/net/{name}/operstate") as f:
                        if f.read().strip() == "up":
                            pending.discard(name)
                except FileNotFoundError:
                    pass
            if not pending:
                return
            if time.monotonic() > deadline:
                raise NetworkSetupError(f"links not up after {timeout:g} s: {', '.join(sorted(pending))}")
            time.sleep(0.05)

    def close(self) -> None:
        """Stop what we started, remove namespaces and links, release the slot. Idempotent."""
        if self._lock_fd is None:
            return
        for proc in self._procs:
            _stop_process(proc)
        self._procs.clear()
        try:
            self._remove_leftovers()
        finally:
            os.close(self._lock_fd)
            self._lock_fd = None

    # -- processes -----------------------------------------------------------------------------

    def node(self, node: str | NetNode) -> NetNode:
        if isinstance(node, NetNode):
            return node
        for n in self.nodes:
            if n.name == node:
                return n
        raise KeyError(f"no node {node!r} in this test network ({', '.join(n.name for n in self.nodes)})")

    def command(self, node: str | NetNode, argv: list[str]) -> list[str]:
        """The argv that runs `argv` in the node's namespace with the node's hostname."""
        n = self.node(node)
        return ["nsenter", f"--net={n.netns_path}", "unshare", "--uts", "--",
                "sh", "-c", 'hostname "$1" && shift && exec "$@"', "sh", n.name, *argv]

    def popen(self, node: str | NetNode, argv: list[str], **kw) -> subprocess.Popen:
        """Start argv in the node's namespace (own session unless told otherwise); stopped at close()."""
        kw.setdefault("start_new_session", True)
        proc = subprocess.Popen(self.command(node, [str(a) for a in argv]), **kw)
        self._procs.append(proc)
        return proc

    def run(self, node: str | NetNode, argv: list[str], **kw) -> subprocess.CompletedProcess:
        kw.setdefault("timeout", 60)
        return subprocess.run(self.command(node, [str(a) for a in argv]), **kw)

    @staticmethod
    def _kill_namespace_pids(ns: str) -> None:
        out = _run("ip", "netns", "pids", ns, check=False).stdout
        for pid in (int(p) for p in out.split() if p.isdigit()):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _stop_process(proc: subprocess.Popen, grace: float = 5.0) -> None:
    """SIGTERM the process (and its group when it leads one), then SIGKILL after `grace` seconds."""
    if proc.poll() is not None:
        return
    _signal(proc, signal.SIGTERM)
    try:
        proc.wait(grace)
        return
    except subprocess.TimeoutExpired:
        pass
    _signal(proc, signal.SIGKILL)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        pass


def _signal(proc: subprocess.Popen, sig: int) -> None:
    try:
        if os.getpgid(proc.pid) == proc.pid:
            os.killpg(proc.pid, sig)
        else:
            os.kill(proc.pid, sig)
    except ProcessLookupError:
        pass
