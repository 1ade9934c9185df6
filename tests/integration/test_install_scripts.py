"""scripts/install-controller and scripts/install-node, run for real under --root (nothing outside
the temp root is touched): the files they make, idempotence (a second run changes no byte, no
mode, no mtime), --add-node taking host keys only from --host-keys or an explicit
--scan-host-keys of a real sshd, and a login with what they made, whose key reaches the agent's
socket and nothing else (no command, shell, pty, TCP forward or other socket).

The package is installed from a wheel built from this checkout, with --no-deps (the tests make no
network use beyond what building that wheel needs, as scripts/test's own install does)."""
from __future__ import annotations

import asyncio
import hashlib
import os
import pwd
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

import pytest

from hai_cluster.native.build import is_compiled
from tests.infra.fixtures import require_binaries, require_root
from tests.infra.sshd import PRIVSEP_DIR, keygen, start_sshd

REPO = Path(__file__).resolve().parents[2]
CONTROLLER = REPO / "scripts" / "install-controller"
NODE = REPO / "scripts" / "install-node"
SITE = next(p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir())


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """A wheel of this checkout, built from a copy (the checkout gets no build/ or egg-info)."""
    require_root("the install scripts")
    require_binaries("the install scripts", ["ssh-keygen", "ssh-keyscan", "systemctl"])
    src = tmp_path_factory.mktemp("src") / "hai-cluster"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", ".hypothesis"))
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(src)],
                   check=True, capture_output=True, text=True)
    (whl,) = out.glob("hai_cluster-*.whl")
    return whl


def run(script: Path, root: Path, wheel: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(script), "--root", str(root), "--source", str(wheel), "--pip-args", "--no-deps",
                           *args], capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    if check and proc.returncode != 0:
        raise AssertionError(f"{script.name} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def tree(root: Path) -> dict[str, tuple]:
    """Every entry under root: type, mode, mtime, and content hash or link target."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            rel = str(p.relative_to(root))
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", st.st_mode, st.st_mtime_ns)
            else:
                out[rel] = ("file", st.st_mode, st.st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
    return out


def mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def restricted(pub: str, socket: str = "/run/hai/agent.sock") -> str:
    """The authorized_keys line install-node writes for the controller's key."""
    return (f'restrict,port-forwarding,permitopen="[{socket}]:*",'
            f'command="echo \'hai-cluster: this key only reaches {socket}\' >&2; exit 1" {pub}')


def test_install_controller_makes_its_files_and_is_idempotent(wheel, tmp_path):
    root = tmp_path / "root"
    first = run(CONTROLLER, root, wheel)
    assert "NOT started" in first.stdout  # --root: says clearly that nothing was started
    venv = root / "opt/hai-cluster/venv"
    for name in ("hai-controller", "hai-agent", "hsubmit", "hqueue"):
        assert os.access(venv / "bin" / name, os.X_OK), name
    assert (venv / "share/hai-cluster/migrations/versions/0001_initial.py").exists()  # a wheel install migrates
    if shutil.which("cc"):  # scripts/test installs gcc: hsubmit is the C one, built from the wheel's source
        assert all(is_compiled(venv / "bin" / name) for name in ("hsubmit", "squeue", "sacct", "hai-jobexec"))
        assert "compiled the C hsubmit, squeue, sacct and hai-jobexec" in first.stdout
    cfg = root / "etc/hai/controller.toml"
    parsed = tomllib.loads(cfg.read_text())
    assert parsed.get("nodes", []) == []  # the example nodes are commented out, not live
    assert parsed["controller"]["database"] == "sqlite:////var/lib/hai/hai.db"
    assert mode(cfg) == 0o640 and mode(root / "var/lib/hai") == 0o700
    key = root / "etc/hai/id_ed25519"
    assert mode(key) == 0o600 and (root / "etc/hai/known_hosts").exists()
    pub = subprocess.run(["ssh-keygen", "-y", "-f", str(key)], capture_output=True, text=True, check=True).stdout
    assert pub.split()[:2] == (root / "etc/hai/id_ed25519.pub").read_text().split()[:2]
    unit = root / "etc/systemd/system/hai-controller.service"
    assert unit.read_text() == (REPO / "conf/hai-controller.service").read_text()
    wants = root / "etc/systemd/system/multi-user.target.wants/hai-controller.service"
    assert os.readlink(wants) == "/etc/systemd/system/hai-controller.service"  # enabled, offline

    # The installed package runs, and finds the migrations it ships (PYTHONPATH lends it the
    # test venv's dependencies, since it was installed with --no-deps).
    local = tmp_path / "local.toml"
    local.write_text(f'[controller]\ndatabase = "sqlite:///{tmp_path}/db/hai.db"\n')
    env = {**os.environ, "PYTHONPATH": SITE}
    dry = subprocess.run([str(venv / "bin/hai-controller"), "db", "upgrade", "--dry-run", "--config", str(local)],
                         capture_output=True, text=True, env=env)
    assert dry.returncode == 0, dry.stderr
    assert "0001" in dry.stdout and "dry run: nothing changed" in dry.stdout
    assert not (tmp_path / "db").exists()

    before = tree(root)
    second = run(CONTROLLER, root, wheel)
    assert "nothing to do: everything was already in place" in second.stdout
    assert tree(root) == before
    # An operator's edits survive a re-run.
    cfg.write_text(cfg.read_text().replace('tick_seconds = 1.0', 'tick_seconds = 2.0'))
    run(CONTROLLER, root, wheel)
    assert "tick_seconds = 2.0" in cfg.read_text()
    # A different source (here: different pip arguments) reinstalls the package.
    third = run(CONTROLLER, root, wheel, "--pip-args", "--no-deps --no-compile")
    assert "installed hai-cluster from" in third.stdout
    assert os.access(venv / "bin/hai-controller", os.X_OK)


@pytest.mark.parametrize("script", ["install-controller", "install-node"])
def test_installs_use_the_constraints_file(wheel, tmp_path, script):
    """Both scripts hand conf/constraints.txt to pip: in a copy of scripts/ and conf/ whose pins
    refuse this very wheel, pip refuses it; a file that is missing stops the install before pip."""
    checkout = tmp_path / "checkout"
    shutil.copytree(REPO / "scripts", checkout / "scripts")
    shutil.copytree(REPO / "conf", checkout / "conf")
    pins = checkout / "conf/constraints.txt"
    original = pins.read_text()
    pins.write_text(original + "hai-cluster==0.0.0\n")
    refused = run(checkout / "scripts" / script, tmp_path / "root", wheel, check=False)
    assert refused.returncode != 0 and "hai-cluster" in refused.stderr, refused.stderr
    pins.write_text(original)  # the same run with the real pins installs: the pin was what refused it
    extra = ("--controller-key", f"{keygen(tmp_path / 'ctl_key')}.pub") if script == "install-node" else ()
    assert "installed hai-cluster from" in run(checkout / "scripts" / script, tmp_path / "root", wheel, *extra).stdout
    pins.unlink()
    missing = run(checkout / "scripts" / script, tmp_path / "root", wheel, check=False)
    assert missing.returncode != 0 and f"{pins} is missing" in missing.stderr, missing.stderr


def test_install_node_makes_its_files_and_is_idempotent(wheel, tmp_path):
    root = tmp_path / "root"
    (root / "etc/ssh/sshd_config.d").mkdir(parents=True)
    # A Debian-like sshd_config that forbids TCP forwarding (which also refuses stream-local).
    (root / "etc/ssh/sshd_config").write_text(
        "Include /etc/ssh/sshd_config.d/*.conf\nPermitRootLogin prohibit-password\nAllowTcpForwarding no\n"
        "Match User nobody\n    AllowTcpForwarding yes\n")
    host_key = keygen(root / "etc/ssh/ssh_host_ed25519_key", comment="host@n1")
    ctl_key = keygen(tmp_path / "ctl_key", comment="hai-controller@test")
    pub = Path(f"{ctl_key}.pub").read_text().strip()

    first = run(NODE, root, wheel, "--name", "gpu07", "--address", "10.1.2.3", "--controller-key", f"{ctl_key}.pub")
    assert "NOT started" in first.stdout
    agent = tomllib.loads((root / "etc/hai/agent.toml").read_text())
    assert agent["agent"]["name"] == "gpu07"
    assert mode(root / "var/spool/hai") == 0o711
    ak = root / "root/.ssh/authorized_keys"
    assert ak.read_text().splitlines() == [restricted(pub)]
    assert mode(ak) == 0o600 and mode(root / "root/.ssh") == 0o700
    wants = root / "etc/systemd/system/multi-user.target.wants/hai-agent.service"
    assert os.readlink(wants) == "/etc/systemd/system/hai-agent.service"
    algo, blob = Path(f"{host_key}.pub").read_text().split()[:2]
    assert f"10.1.2.3 {algo} {blob}" in first.stdout.splitlines()  # the known_hosts line
    assert "--add-node gpu07 10.1.2.3 --host-keys FILE" in first.stdout
    fingerprint = subprocess.run(["ssh-keygen", "-lf", f"{host_key}.pub"], capture_output=True, text=True,
                                 check=True).stdout.split()[1]
    assert f"its fingerprint (what install-controller --scan-host-keys shows): {fingerprint}" in first.stdout

    # What sshd really makes of it: the drop-in, read through a copy whose Include points here.
    dropin = root / "etc/ssh/sshd_config.d/00-hai-cluster.conf"
    assert "Match User root\n    AllowStreamLocalForwarding local\n" in dropin.read_text()
    check = tmp_path / "sshd_config"
    check.write_text(f"HostKey {host_key}\n" + (root / "etc/ssh/sshd_config").read_text().replace(
        "/etc/ssh/sshd_config.d", str(root / "etc/ssh/sshd_config.d")))
    os.makedirs(PRIVSEP_DIR, mode=0o755, exist_ok=True)  # sshd -T wants it too (start_sshd makes it otherwise)

    def effective(user: str) -> list[str]:
        out = subprocess.run(["/usr/sbin/sshd", "-T", "-f", str(check), "-C", f"user={user},host=x,addr=10.0.0.9"],
                             capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        return out.stdout.splitlines()
    assert {"allowstreamlocalforwarding local", "allowtcpforwarding local"} <= set(effective("root"))
    # Other users keep the site's settings (sixth audit: a global drop-in lifted them for all).
    assert "allowtcpforwarding no" in effective("daemon") and "allowtcpforwarding yes" in effective("nobody")

    before = tree(root)
    second = run(NODE, root, wheel, "--name", "gpu07", "--address", "10.1.2.3", "--controller-key", pub)
    assert "nothing to do: everything was already in place" in second.stdout
    assert tree(root) == before

    bad = run(NODE, root, wheel, "--controller-key", "not a key", check=False)
    assert bad.returncode != 0 and "not an SSH public key" in bad.stderr

    # The commands in the system PATH only when asked; Slurm's names never over a real Slurm client
    assert not (root / "usr/local/bin/hsubmit").exists()
    (root / "usr/local/bin").mkdir(parents=True, exist_ok=True)
    (root / "usr/local/bin/sbatch").write_text("#!/bin/sh\necho the site's Slurm\n")
    linked = run(NODE, root, wheel, "--name", "gpu07", "--controller-key", pub, "--link-commands", "--slurm-names")
    venv = "/opt/hai-cluster/venv/bin"
    for c in ("hsubmit", "hqueue", "squeue", "sacct", "srun", "scontrol"):
        assert os.readlink(root / "usr/local/bin" / c) == f"{venv}/{c}"
        assert (root / venv.lstrip("/") / c).exists()
    assert (root / "usr/local/bin/sbatch").read_text().endswith("the site's Slurm\n")
    assert "usr/local/bin/sbatch exists and is not ours: left as it is" in linked.stdout
    again = run(NODE, root, wheel, "--name", "gpu07", "--controller-key", pub, "--link-commands", "--slurm-names")
    assert "nothing to do" in again.stdout
    lonely = run(NODE, root, wheel, "--controller-key", pub, "--slurm-names", check=False)
    assert lonely.returncode != 0 and "--slurm-names goes with --link-commands" in lonely.stderr


def test_sshd_without_dropin_directory_gets_a_block_on_top(wheel, tmp_path):
    root = tmp_path / "root"
    (root / "etc/ssh").mkdir(parents=True)
    original = "PermitRootLogin prohibit-password\nMatch User nobody\n    X11Forwarding no\n"
    (root / "etc/ssh/sshd_config").write_text(original)
    run(NODE, root, wheel, "--name", "n1", "--no-start")
    text = (root / "etc/ssh/sshd_config").read_text()
    assert text.startswith(original) and text.index("Match User nobody") < text.index("Match User root")  # the end
    assert "    AllowStreamLocalForwarding local" in text and "AllowTcpForwarding" not in text  # nothing to override
    before = tree(root)
    run(NODE, root, wheel, "--name", "n1", "--no-start")
    assert tree(root) == before


def test_add_node_scans_host_keys_only_when_asked_and_the_controller_can_log_in(wheel, tmp_path):
    import asyncssh

    ctl_root, node_root = tmp_path / "ctl", tmp_path / "node"
    run(CONTROLLER, ctl_root, wheel)
    sshd = start_sshd(None, "local", tmp_path / "sshd")
    try:
        # No host key to go by: refused (a scan would trust whoever answers), nothing changed.
        before = tree(ctl_root)
        blind = run(CONTROLLER, ctl_root, wheel, "--add-node", "n1", "127.0.0.1", "--port", str(sshd.port),
                    check=False)
        assert blind.returncode != 0 and "give --host-keys FILE" in blind.stderr and "--scan-host-keys" in blind.stderr
        assert tree(ctl_root) == before

        out = run(CONTROLLER, ctl_root, wheel, "--add-node", "n1", "127.0.0.1", "--port", str(sshd.port),
                  "--scan-host-keys").stdout
        assert "added node n1" in out
        fingerprint = subprocess.run(["ssh-keygen", "-lf", f"{sshd.host_key}.pub"], capture_output=True, text=True,
                                     check=True).stdout.split()[1]
        assert f"  {fingerprint} (ED25519)" in out and "compare them with the fingerprint install-node" in out
        known = (ctl_root / "etc/hai/known_hosts").read_text()
        assert sshd.known_hosts_line() in known
        nodes = tomllib.loads((ctl_root / "etc/hai/controller.toml").read_text())["nodes"]
        assert nodes == [{"name": "n1", "address": "127.0.0.1", "port": sshd.port}]
        before = tree(ctl_root)
        again = run(CONTROLLER, ctl_root, wheel, "--add-node", "n1", "127.0.0.1", "--port", str(sshd.port))
        assert "nothing to do" in again.stdout  # its key is known now: no flag needed
        assert tree(ctl_root) == before

        # install-node authorizes the controller's key; this sshd reads its own authorized_keys.
        node_root.mkdir()
        run(NODE, node_root, wheel, "--name", "n1", "--controller-key", str(ctl_root / "etc/hai/id_ed25519.pub"))
        sshd.authorize((node_root / "root/.ssh/authorized_keys").read_text())

        async def login() -> None:
            async with asyncssh.connect("127.0.0.1", port=sshd.port, username="root",
                                        client_keys=[str(ctl_root / "etc/hai/id_ed25519")],
                                        known_hosts=str(ctl_root / "etc/hai/known_hosts")):
                pass
        asyncio.run(login())

        # A node whose host key changed is refused, and the message says what to do.
        other = keygen(tmp_path / "other_host_key")
        algo, blob = Path(f"{other}.pub").read_text().split()[:2]
        lines = tmp_path / "keys.txt"
        lines.write_text(f"[127.0.0.1]:{sshd.port} {algo} {blob}\n")
        bad = run(CONTROLLER, ctl_root, wheel, "--add-node", "n1", "127.0.0.1", "--port", str(sshd.port),
                  "--host-keys", str(lines), check=False)
        assert bad.returncode != 0 and "ssh-keygen -R" in bad.stderr
        assert tree(ctl_root) == before
    finally:
        sshd.stop()


def test_controller_key_reaches_only_the_agent_socket(wheel, tmp_path):
    """What install-node authorizes, against the real sshd: the controller's own transport reaches
    the agent's socket (from agent.toml); a command, a shell, a pty, a TCP forward and any other
    socket are refused. An earlier, unrestricted line for the key is replaced; others stay."""
    import asyncssh

    from hai_cluster.config import NodeConfig, SshConfig
    from hai_cluster.transport.ssh import open_ssh_stream

    root = tmp_path / "node"
    (root / "etc/hai").mkdir(parents=True)
    sock, other_sock, marker = tmp_path / "agent.sock", tmp_path / "other.sock", tmp_path / "ran"
    (root / "etc/hai/agent.toml").write_text(f'[agent]\nname = "n1"\nsocket = "{sock}"\n')
    ctl_key, admin_key = keygen(tmp_path / "ctl_key"), keygen(tmp_path / "admin_key", comment="admin")
    ctl_pub, admin_pub = (Path(f"{k}.pub").read_text().strip() for k in (ctl_key, admin_key))
    ak = root / "root/.ssh/authorized_keys"
    ak.parent.mkdir(parents=True, mode=0o700)
    ak.write_text(f"{admin_pub}\n{ctl_pub}\n")  # an install from before the restriction
    ak.chmod(0o600)
    out = run(NODE, root, wheel, "--name", "n1", "--no-start", "--controller-key", f"{ctl_key}.pub").stdout
    assert f"restricted the controller's key in {ak} to the agent socket {sock}" in out
    assert ak.read_text().splitlines() == [admin_pub, restricted(ctl_pub, str(sock))]
    assert mode(ak) == 0o600
    before = tree(root)
    run(NODE, root, wheel, "--name", "n1", "--no-start", "--controller-key", f"{ctl_key}.pub")
    assert tree(root) == before

    sshd = start_sshd(None, "local", tmp_path / "sshd")
    sshd.authorize(ak.read_text())
    known_hosts = sshd.write_known_hosts(tmp_path / "known_hosts")

    async def echo(reader, writer) -> None:
        writer.write(b"echo:" + await reader.read(100))
        await writer.drain()
        writer.close()

    async def scenario() -> None:
        servers = [await asyncio.start_unix_server(echo, path=str(sock)),
                   await asyncio.start_unix_server(echo, path=str(other_sock)),
                   tcp := await asyncio.start_server(echo, "127.0.0.1", 0)]
        try:
            node = NodeConfig(name="n1", address="127.0.0.1", port=sshd.port, agent_socket=str(sock))
            stream = await open_ssh_stream(node, SshConfig(key=str(ctl_key), known_hosts=str(known_hosts)))
            stream.writer.write(b"hello")
            await stream.writer.drain()
            assert await stream.reader.read(100) == b"echo:hello"
            await stream.close()

            async with asyncssh.connect("127.0.0.1", port=sshd.port, username="root", client_keys=[str(ctl_key)],
                                        known_hosts=str(known_hosts), config=[], agent_path=None) as conn:
                command = await conn.run(f"touch {marker}", check=False)
                shell = await conn.run(input=f"touch {marker}\nexit 0\n", check=False)
                for r in (command, shell):
                    assert r.exit_status == 1 and "this key only reaches" in r.stderr, r
                with pytest.raises(asyncssh.ChannelOpenError):
                    await conn.run(f"touch {marker}", term_type="xterm")
                with pytest.raises(asyncssh.ChannelOpenError):
                    await conn.open_connection("127.0.0.1", tcp.sockets[0].getsockname()[1])
                with pytest.raises(asyncssh.ChannelOpenError):
                    await conn.open_unix_connection(str(other_sock))
        finally:
            for server in servers:
                server.close()
    try:
        asyncio.run(scenario())
        assert not marker.exists()
        assert "but the request was denied" in sshd.log.read_text()
    finally:
        sshd.stop()


def test_add_node_from_the_line_install_node_printed(wheel, tmp_path):
    root = tmp_path / "ctl"
    key = keygen(tmp_path / "host_key")
    algo, blob = Path(f"{key}.pub").read_text().split()[:2]
    lines = tmp_path / "keys.txt"
    lines.write_text(f"10.1.2.3 {algo} {blob}\n")
    run(CONTROLLER, root, wheel, "--add-node", "gpu07", "10.1.2.3", "--host-keys", str(lines))
    assert (root / "etc/hai/known_hosts").read_text() == f"10.1.2.3 {algo} {blob}\n"
    assert tomllib.loads((root / "etc/hai/controller.toml").read_text())["nodes"] == [
        {"name": "gpu07", "address": "10.1.2.3"}]
    missing = run(CONTROLLER, root, wheel, "--add-node", "gpu08", "10.1.2.4", "--host-keys", str(lines), check=False)
    assert missing.returncode != 0 and "no line for 10.1.2.4" in missing.stderr
    # On another SSH port, the same line (install-node prints the bare address) is stored as [ADDR]:PORT.
    lines.write_text(f"10.1.2.9 {algo} {blob}\n")
    run(CONTROLLER, root, wheel, "--add-node", "gpu09", "10.1.2.9", "--port", "2222", "--host-keys", str(lines))
    assert f"[10.1.2.9]:2222 {algo} {blob}\n" in (root / "etc/hai/known_hosts").read_text()


def test_db_commands_for_operators(tmp_path):
    """hai-controller db current / db upgrade [--dry-run]: read-only until asked, clear errors."""
    import sqlite3

    from alembic.script import ScriptDirectory

    from hai_cluster.store.engine import _migrations_dir, downgrade, make_engine

    script = ScriptDirectory(str(_migrations_dir()))
    head = script.get_current_head()
    revisions = [r.revision for r in reversed(list(script.walk_revisions()))]
    db = tmp_path / "state" / "hai.db"
    cfg = tmp_path / "controller.toml"
    cfg.write_text(f'[controller]\ndatabase = "sqlite:///{db}"\n')
    ctl = str(Path(sys.executable).parent / "hai-controller")

    def hc(*args: str, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run([ctl, *args], capture_output=True, text=True, timeout=120)
        assert not check or proc.returncode == 0, proc.stderr
        return proc

    current = hc("db", "current", "--config", str(cfg)).stdout
    assert "does not exist yet" in current and f"{len(revisions)} migration(s) to run" in current
    dry = hc("db", "upgrade", "--dry-run", "--config", str(cfg)).stdout
    assert [line.split()[0] for line in dry.splitlines() if line.startswith("  ")] == revisions
    assert not db.exists() and not db.parent.exists()  # a dry run creates nothing

    assert f"upgraded to {head}" in hc("db", "upgrade", "--config", str(cfg)).stdout
    assert "nothing to do" in hc("db", "upgrade", "--config", str(cfg)).stdout
    assert "up to date" in hc("--config", str(cfg), "db", "current").stdout  # --config before the command too

    downgrade(make_engine(f"sqlite:///{db}"), revisions[0])
    dry = hc("--config", str(cfg), "db", "upgrade", "--dry-run").stdout
    assert f"at {revisions[0]}, head {head}; would run {len(revisions) - 1} migration(s)" in dry
    assert "dry run: nothing changed" in dry
    assert f"current   {revisions[0]}" in hc("db", "current", "--config", str(cfg)).stdout

    with sqlite3.connect(db) as c:
        c.execute("UPDATE alembic_version SET version_num = 'f00d'")
    bad = hc("db", "upgrade", "--config", str(cfg), check=False)
    assert bad.returncode == 1 and "revision f00d, which this hai-cluster does not know" in bad.stderr

    missing = hc(check=False)
    assert missing.returncode == 2 and "Missing option '--config'" in missing.stderr
    nofile = hc("db", "current", "--config", str(tmp_path / "nope.toml"), check=False)
    assert nofile.returncode == 1 and "nope.toml" in nofile.stderr


def test_db_commands_run_by_root_run_as_the_store_s_owner():
    """An operator's `sudo hai-controller db upgrade` makes the store as the service would: as the
    owner of its directory (hai; here haitest), so the service can open it; a file root made
    anyway is named, with whose it is and what to run."""
    from tests.e2e.harness import ensure_user

    require_root("running db commands as root")
    user = ensure_user("haitest")
    base = Path(tempfile.mkdtemp(prefix="hai-db-", dir="/tmp"))
    try:
        base.chmod(0o755)
        state = base / "state"
        state.mkdir(mode=0o700)
        os.chown(state, user.pw_uid, user.pw_gid)
        cfg = base / "controller.toml"
        cfg.write_text(f'[controller]\ndatabase = "sqlite:///{state}/hai.db"\nrun_as = "haitest"\n')
        ctl = str(Path(sys.executable).parent / "hai-controller")
        up = subprocess.run([ctl, "db", "upgrade", "--config", str(cfg)], capture_output=True, text=True, timeout=120)
        assert up.returncode == 0, up.stderr
        assert f"running as haitest, the owner of {state}" in up.stderr and "upgraded to" in up.stdout
        files = sorted(state.iterdir())
        assert files and all(owner(f) == (user.pw_uid, user.pw_gid) and mode(f) == 0o600 for f in files), \
            [(f, owner(f), oct(mode(f))) for f in files]
        os.chown(state / "hai.db", 0, 0)  # what an older version's db upgrade, run as root, left
        bad = subprocess.run([ctl, "db", "current", "--config", str(cfg)], capture_output=True, text=True, timeout=120)
        assert bad.returncode == 1 and "Traceback" not in bad.stderr, bad.stderr
        assert (f"cannot open the store's file {state}/hai.db: Permission denied ({state}/hai.db belongs to root, "
                f"this controller runs as haitest)") in bad.stderr and f"chown -R haitest: {state}" in bad.stderr
    finally:
        shutil.rmtree(base, ignore_errors=True)


def seeded_root(base: Path) -> Path:
    """An install root with this host's account files (an image's would be there): useradd
    --prefix then picks ids nobody here has, so a process may run as the user it creates."""
    root = base / "root"
    (root / "etc").mkdir(parents=True)
    for name in ("passwd", "group", "shadow", "gshadow"):
        if Path("/etc", name).exists():
            shutil.copy2(Path("/etc", name), root / "etc" / name)
    return root


def hai_entry(root: Path) -> list[str]:
    (entry,) = [line.split(":") for line in (root / "etc/passwd").read_text().splitlines() if line.startswith("hai:")]
    return entry


def owner(p: Path) -> tuple[int, int]:
    st = p.lstat()
    return st.st_uid, st.st_gid


def test_install_controller_creates_hai_and_gives_it_its_files(wheel, tmp_path):
    """The controller's system user: created once (no login shell, home its state dir), owner of
    /var/lib/hai and the SSH key, group of the config (which users cannot read); an older
    install's root-owned store becomes hai's with its directory."""
    root = seeded_root(tmp_path)
    old_store = root / "var/lib/hai"  # an install from when the controller ran as root
    old_store.mkdir(parents=True, mode=0o700)
    for name in ("hai.db", "hai.db-wal", "hai.db.controller.lock"):
        (old_store / name).write_bytes(b"x")
        (old_store / name).chmod(0o600)
    first = run(CONTROLLER, root, wheel)
    assert "created the system user hai (no login shell, home /var/lib/hai)" in first.stdout
    name, _, uid, gid, _, home, shell = hai_entry(root)
    uid, gid = int(uid), int(gid)
    assert 0 < uid < 1000 and home == "/var/lib/hai" and shell == "/usr/sbin/nologin"
    assert f"hai:x:{gid}:" in (root / "etc/group").read_text()
    with pytest.raises(KeyError):
        pwd.getpwuid(uid)  # a uid this host does not use: the test below runs a process as it
    state = root / "var/lib/hai"
    assert owner(state) == (uid, gid) and mode(state) == 0o700
    assert all(owner(f) == (uid, gid) and mode(f) == 0o600 for f in state.iterdir())
    cfg = root / "etc/hai/controller.toml"
    assert owner(cfg) == (0, gid) and mode(cfg) == 0o640  # hai reads it; users do not
    key = root / "etc/hai/id_ed25519"
    assert owner(key) == (uid, gid) and mode(key) == 0o600
    assert owner(root / "etc/hai/known_hosts") == (0, 0) and owner(root / "etc/hai") == (0, 0)
    for unit in ("hai-controller.service", "hai-controller.socket"):
        assert (root / "etc/systemd/system" / unit).read_text() == (REPO / "conf" / unit).read_text()
    assert os.readlink(root / "etc/systemd/system/sockets.target.wants/hai-controller.socket") == \
        "/etc/systemd/system/hai-controller.socket"

    before, ids = tree(root), {p: owner(p) for p in (state, cfg, key)}
    again = run(CONTROLLER, root, wheel)
    assert "nothing to do: everything was already in place" in again.stdout
    assert tree(root) == before and {p: owner(p) for p in ids} == ids
    assert [line for line in (root / "etc/passwd").read_text().splitlines() if line.startswith("hai:")] == \
        [":".join(hai_entry(root))]  # once
    # A config an operator opened to everyone is closed again (it may hold a database password).
    cfg.chmod(0o644)
    assert "mode 0640 on" in run(CONTROLLER, root, wheel).stdout and mode(cfg) == 0o640


def test_the_installed_controller_runs_as_hai_and_serves_users(wheel):
    """What install-controller made, run as its user: a real controller process as hai (with
    no_new_privs, as the unit runs it), its socket bound by root and handed over as systemd's
    hai-controller.socket does, reads the root:hai config, serves the socket to another user
    (haitest, told apart by SO_PEERCRED), and stores that user's job in hai's SQLite store."""
    import sqlite3

    from tests.e2e.harness import ensure_user

    require_binaries("running the controller as hai", ["setpriv", "runuser"])
    user = ensure_user("haitest")
    base = Path(tempfile.mkdtemp(prefix="hai-inst-", dir="/tmp"))
    proc = None
    try:
        base.chmod(0o755)  # hai and haitest reach the install root and the socket through it
        root = seeded_root(base)
        run(CONTROLLER, root, wheel)
        _, _, uid, gid, *_ = hai_entry(root)
        state, cfg = root / "var/lib/hai", root / "etc/hai/controller.toml"
        (base / "run").mkdir(mode=0o755)  # root's, as /run/hai is
        sock_path = base / "run/controller.sock"
        text = cfg.read_text()
        for old, new in (('"/run/hai/controller.sock"', f'"{sock_path}"'),
                         ('"sqlite:////var/lib/hai/hai.db"', f'"sqlite:///{state}/hai.db"'),
                         ('state_dir = "/var/lib/hai"', f'state_dir = "{state}"')):
            assert old in text
            text = text.replace(old, new)
        cfg.write_text(text)  # the same file: root:hai 0640
        assert owner(cfg) == (0, int(gid)) and mode(cfg) == 0o640
        work = base / "work"
        work.mkdir()
        os.chown(work, user.pw_uid, user.pw_gid)

        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(sock_path))
        os.chmod(sock_path, 0o666)  # SocketMode=0666
        listener.listen(64)
        venv = root / "opt/hai-cluster/venv/bin"
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": SITE, "HOME": "/var/lib/hai", "LANG": "C.UTF-8"}
        # fd 3 = the socket, LISTEN_PID = the process that execs the controller (sd_listen_fds)
        start = ('exec 3<&0 </dev/null; export LISTEN_FDS=1 LISTEN_PID=$$; exec setpriv --reuid="$1" '
                 '--regid="$2" --clear-groups --no-new-privs -- "$3" --config "$4"')
        log = open(base / "controller.log", "wb")
        proc = subprocess.Popen(["sh", "-c", start, "sh", uid, gid, str(venv / "hai-controller"), str(cfg)],
                                stdin=listener.fileno(), stdout=log, stderr=subprocess.STDOUT, env=env)
        listener.close()

        def as_user(*argv: str) -> subprocess.CompletedProcess:
            return subprocess.run(["runuser", "-u", user.pw_name, "--", "env", f"HAI_CONTROLLER={sock_path}",
                                   f"PYTHONPATH={SITE}", *argv], capture_output=True, text=True, timeout=60,
                                  cwd=work)

        deadline = time.monotonic() + 60
        while (listed := as_user(str(venv / "hqueue"), "-h")).returncode != 0:
            assert proc.poll() is None, (base / "controller.log").read_text()
            assert time.monotonic() < deadline, listed.stderr + (base / "controller.log").read_text()
            time.sleep(0.3)
        submitted = as_user(str(venv / "hsubmit"), "--parsable", "--hold", "--job-name=as-hai", "--wrap", "true")
        assert submitted.returncode == 0, submitted.stderr + (base / "controller.log").read_text()
        job = int(submitted.stdout.strip())
        listed = as_user(str(venv / "hqueue"), "-h", "-o", "%i %j %u %T %r")
        assert listed.stdout.split() == [str(job), "as-hai", user.pw_name, "PENDING", "JobHeldUser"], listed

        processes = subprocess.run(["ps", "-o", "uid=,euid=", "-p", str(proc.pid)], capture_output=True,
                                   text=True).stdout.split()
        assert processes == [uid, uid]  # the controller itself, not a root parent
        proc.terminate()
        assert proc.wait(30) == 0, (base / "controller.log").read_text()
        proc = None
        store = state / "hai.db"
        assert owner(store) == (int(uid), int(gid)) and mode(store) == 0o600
        assert all(owner(f)[0] == int(uid) for f in state.iterdir())  # WAL, lock: nothing of root's
        with sqlite3.connect(store) as c:
            assert c.execute("SELECT name, user FROM jobs WHERE id = ?", (job,)).fetchall() == [("as-hai", "haitest")]
        assert sock_path.exists()  # systemd's socket stays for the next start
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()
        shutil.rmtree(base, ignore_errors=True)


def test_a_controller_started_as_root_binds_its_socket_then_runs_as_the_store_s_owner():
    """Without systemd, root starts the controller by hand: it binds the socket in a directory of
    root's, then becomes the owner of its store's directory (hai; here haiother) before it opens
    the store, and serves another user (haitest) as that owner."""
    from tests.e2e.harness import ensure_user

    require_root("starting the controller as root")
    owner_pw, user = ensure_user("haiother"), ensure_user("haitest")
    base = Path(tempfile.mkdtemp(prefix="hai-root-", dir="/tmp"))
    proc = None
    try:
        base.chmod(0o755)
        state, run_dir, work = base / "state", base / "run", base / "work"
        state.mkdir(mode=0o700)
        os.chown(state, owner_pw.pw_uid, owner_pw.pw_gid)
        run_dir.mkdir(mode=0o755)
        work.mkdir()
        os.chown(work, user.pw_uid, user.pw_gid)
        sock = run_dir / "controller.sock"
        cfg = base / "controller.toml"
        cfg.write_text(f'[controller]\nsocket = "{sock}"\ndatabase = "sqlite:///{state}/hai.db"\n'
                       f'run_as = "haiother"\n')
        log = open(base / "controller.log", "wb")
        bin_dir = Path(sys.executable).parent
        proc = subprocess.Popen([str(bin_dir / "hai-controller"), "--config", str(cfg)], stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while True:
            listed = subprocess.run(["runuser", "-u", user.pw_name, "--", "env", f"HAI_CONTROLLER={sock}",
                                     str(bin_dir / "hqueue"), "-h", "-o", "%i"], capture_output=True, text=True,
                                    timeout=60, cwd=work)
            if listed.returncode == 0:
                break
            assert proc.poll() is None and time.monotonic() < deadline, (base / "controller.log").read_text()
            time.sleep(0.3)
        ids = subprocess.run(["ps", "-o", "ruid=,euid=,suid=", "-p", str(proc.pid)], capture_output=True,
                             text=True).stdout.split()
        assert ids == [str(owner_pw.pw_uid)] * 3  # every uid given up: no way back to root
        assert owner(sock)[0] == 0 and mode(sock) == 0o666  # bound as root, before
        proc.terminate()
        assert proc.wait(30) == 0
        proc = None
        text = (base / "controller.log").read_text()
        assert f"running as haiother, the owner of {state}, not as root" in text
        assert all(owner(f) == (owner_pw.pw_uid, owner_pw.pw_gid) for f in state.iterdir())
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()
        shutil.rmtree(base, ignore_errors=True)


def test_a_controller_started_as_root_refuses_a_store_owned_by_someone_else():
    """The store's directory belongs to a user who is not run_as (here: the default, hai): root
    does not become them (they could then act for every user), says why, and leaves no socket."""
    from tests.e2e.harness import ensure_user

    require_root("starting the controller as root")
    squatter = ensure_user("haitest")
    base = Path(tempfile.mkdtemp(prefix="hai-root-", dir="/tmp"))
    try:
        base.chmod(0o755)
        state, run_dir = base / "state", base / "run"
        state.mkdir(mode=0o700)
        os.chown(state, squatter.pw_uid, squatter.pw_gid)
        run_dir.mkdir(mode=0o755)
        sock = run_dir / "controller.sock"
        cfg = base / "controller.toml"
        cfg.write_text(f'[controller]\nsocket = "{sock}"\ndatabase = "sqlite:///{state}/hai.db"\n')
        bin_dir = Path(sys.executable).parent
        done = subprocess.run([str(bin_dir / "hai-controller"), "--config", str(cfg)], capture_output=True,
                              text=True, timeout=60, stdin=subprocess.DEVNULL)
        assert done.returncode == 2, done
        assert f"{state} belongs to haitest, not to the controller's user hai ([controller] run_as)" in done.stderr
        assert not sock.exists() and list(state.iterdir()) == []  # nothing made, nothing opened
        upgrade = subprocess.run([str(bin_dir / "hai-controller"), "--config", str(cfg), "db", "upgrade"],
                                 capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        assert upgrade.returncode != 0 and "belongs to haitest" in upgrade.stderr, upgrade
        assert list(state.iterdir()) == []
    finally:
        shutil.rmtree(base, ignore_errors=True)
