"""A private OpenSSH sshd for tests: its own host key, config, authorized_keys and log (needs root).

    handle = start_sshd(net, "hai-n1", workdir)     # in the node's namespace, on port 22
    handle = start_sshd(None, "local", workdir)     # on 127.0.0.1, a spare port
    key = handle.create_client_key(workdir / "id_ed25519")
    handle.authorize(key.with_suffix(".pub"))
    handle.write_known_hosts(workdir / "known_hosts")
    ...
    handle.stop()

The config allows only public-key logins and enables direct-streamlocal forwarding (what the SSH
transport uses to reach an agent's Unix socket). Logs go to `workdir/sshd.log` (`-e` sends them to
stderr, which is redirected there), at LogLevel VERBOSE: read it when a connection fails.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from .netns import TestNetwork, _stop_process

SSHD = "/usr/sbin/sshd"
REQUIRED_BINARIES = (SSHD, "ssh-keygen")
PRIVSEP_DIR = "/run/sshd"


class SshdError(RuntimeError):
    pass


def missing_binaries() -> list[str]:
    return [b for b in REQUIRED_BINARIES if shutil.which(b) is None]


def spare_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def keygen(path: str | os.PathLike, comment: str = "hai-test") -> Path:
    """Create an ed25519 key pair at path (and path.pub); returns the private key's path."""
    path = Path(path)
    for p in (path, Path(f"{path}.pub")):
        if p.exists():
            p.unlink()
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                   check=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return path


def known_hosts_host(address: str, port: int) -> str:
    return address if port == 22 else f"[{address}]:{port}"


@dataclass
class SshdHandle:
    name: str
    address: str
    port: int
    workdir: Path
    config: Path
    host_key: Path
    authorized_keys: Path
    log: Path
    proc: subprocess.Popen

    @property
    def host_public_key(self) -> str:
        """The host public key as 'ssh-ed25519 AAAA...' (no comment)."""
        algo, blob = Path(f"{self.host_key}.pub").read_text().split()[:2]
        return f"{algo} {blob}"

    def known_hosts_line(self) -> str:
        return f"{known_hosts_host(self.address, self.port)} {self.host_public_key}\n"

    def write_known_hosts(self, path: str | os.PathLike, append: bool = True) -> Path:
        path = Path(path)
        with open(path, "a" if append else "w") as f:
            f.write(self.known_hosts_line())
        return path

    def create_client_key(self, path: str | os.PathLike) -> Path:
        return keygen(path, comment=f"hai-test-client@{self.name}")

    def authorize(self, public_key: str | os.PathLike) -> None:
        """Append a public key (a .pub path, or the key text itself) to authorized_keys."""
        if isinstance(public_key, os.PathLike) or os.path.exists(public_key):
            text = Path(public_key).read_text()
        else:
            text = str(public_key)
        with open(self.authorized_keys, "a") as f:
            f.write(text.strip() + "\n")

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        _stop_process(self.proc)


def _config_text(address: str, port: int, workdir: Path, host_key: Path, authorized_keys: Path,
                 use_pam: bool = False) -> str:
    return f"""\
# written by tests/infra/sshd.py
ListenAddress {address}:{port}
AddressFamily inet
HostKey {host_key}
PidFile {workdir / 'sshd.pid'}
AuthorizedKeysFile {authorized_keys}
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM {"yes" if use_pam else "no"}
StrictModes no
AllowStreamLocalForwarding yes
# Not "no": sshd then disables every local forward, direct-streamlocal included
# ("Received request to connect to path ..., but the request was denied").
AllowTcpForwarding local
X11Forwarding no
PrintMotd no
UseDNS no
LogLevel VERBOSE
MaxStartups 100:30:200
"""


def start_sshd(network: TestNetwork | None, node: str, workdir: str | os.PathLike, *,
               port: int | None = None, timeout: float = 30.0, pam_root: Path | None = None) -> SshdHandle:
    """Start sshd for `node`: inside its namespace (port 22 by default) or, with no network,
    on 127.0.0.1 at a spare port. Returns once the port answers with an SSH banner.

    pam_root: UsePAM yes, with pam_root/etc/pam.d and pam_root/etc/profile.d in place of the
    system's (bind mounts in a mount namespace of sshd's own: the system's files are untouched)."""
    if os.geteuid() != 0:
        raise SshdError("sshd for tests needs root")
    missing = missing_binaries()
    if missing:
        raise SshdError(f"missing binaries: {', '.join(missing)}")
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    os.makedirs(PRIVSEP_DIR, mode=0o755, exist_ok=True)  # sshd refuses to start without it

    if network is not None:
        address, spare = network.node(node).address, False
        port = port or 22
    else:
        address, spare = "127.0.0.1", port is None
        port = port or spare_port(address)

    host_key = keygen(workdir / "ssh_host_ed25519_key", comment=f"host@{node}")
    authorized_keys = workdir / "authorized_keys"
    authorized_keys.touch()
    config = workdir / "sshd_config"
    log = workdir / "sshd.log"
    # A spare port can be taken between choosing and binding it (by another test process): retry.
    for attempt in range(5):
        try:
            return _start(network, node, address, port, workdir, config, host_key, authorized_keys, log, timeout,
                          pam_root)
        except SshdError as exc:
            if not spare or attempt == 4 or "Address already in use" not in str(exc):
                raise
            port = spare_port(address)
    raise AssertionError("not reached")


def _start(network: TestNetwork | None, node: str, address: str, port: int, workdir: Path, config: Path,
           host_key: Path, authorized_keys: Path, log: Path, timeout: float, pam_root: Path | None) -> SshdHandle:
    config.write_text(_config_text(address, port, workdir, host_key, authorized_keys, use_pam=pam_root is not None))

    # Check the config first: a bad config then fails with sshd's own message, not a timeout.
    check = subprocess.run([SSHD, "-t", "-f", str(config)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
    if check.returncode != 0:
        raise SshdError(f"sshd -t rejected {config}: {check.stdout.strip()}")

    argv = [SSHD, "-D", "-e", "-f", str(config)]
    if pam_root is not None:
        binds = " && ".join(f"mount --bind {pam_root}/etc/{d} /etc/{d}" for d in ("pam.d", "profile.d"))
        argv = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", f'{binds} && exec "$@"',
                "sh", *argv]
    with open(log, "ab") as logf:
        log_from = logf.tell()
        if network is not None:
            proc = network.popen(node, argv, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf)
        else:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf,
                                    start_new_session=True)
    handle = SshdHandle(name=node, address=address, port=port, workdir=workdir, config=config,
                        host_key=host_key, authorized_keys=authorized_keys, log=log, proc=proc)
    try:
        _wait_banner(handle, timeout, log_from)
    except BaseException:
        handle.stop()
        raise
    return handle


def _wait_banner(handle: SshdHandle, timeout: float, log_from: int = 0) -> None:
    """Wait for sshd's "Server listening" line (in what it logged since log_from: this start's),
    then for its banner. The line first: with a spare port, another test process's server may have
    taken the port, and its banner must not be taken for ours."""
    deadline = time.monotonic() + timeout
    last = "no attempt"
    listening = f"Server listening on {handle.address} port {handle.port}.".encode()
    while True:
        if handle.proc.poll() is not None:
            raise SshdError(f"sshd for {handle.name} exited with {handle.proc.returncode}:\n{handle.log_tail()}")
        try:
            with open(handle.log, "rb") as f:
                f.seek(log_from)
                logged = listening in f.read()
            if not logged:
                last = "sshd has not logged that it listens"
            else:
                with socket.create_connection((handle.address, handle.port), timeout=2.0) as s:
                    s.settimeout(2.0)
                    banner = s.recv(64)
                    if banner.startswith(b"SSH-"):
                        return
                    last = f"unexpected banner {banner!r}"
        except OSError as exc:
            last = str(exc)
        if time.monotonic() > deadline:
            raise SshdError(f"sshd for {handle.name} not answering on {handle.address}:{handle.port} "
                            f"after {timeout:g} s ({last}):\n{handle.log_tail()}")
        time.sleep(0.05)
