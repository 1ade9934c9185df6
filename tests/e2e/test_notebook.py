"""examples/notebook.sbatch with a real Jupyter server (jupyter-server, from the test extra), as a
job on a node in its own network namespace: it prints one `ssh -L` command and a URL with a
token; the command, run (with the test's key and the node's address put in), reaches the server
through the node's real sshd; the server wants the token, and listens on the node's loopback
alone."""
from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.infra.sshd import spare_port

from .harness import TEST_USER, start_ssh_cluster, user_dir, wait_for

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples/notebook.sbatch"


@pytest.fixture(scope="module")
def cluster(ssh_nodes):
    c = start_ssh_cluster(ssh_nodes[:1], gpus_per_node=1)
    yield c
    c.close()


def get(url: str, headers: dict | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""


def test_the_notebook_job_prints_one_ssh_command_that_reaches_its_token_guarded_loopback_server(cluster, ssh_nodes):
    assert shutil.which("jupyter-server", path=str(Path(sys.executable).parent)), "jupyter-server (test extra)"
    node = ssh_nodes[0]
    d = user_dir(cluster.workdir, TEST_USER)
    job = cluster.submit("-o", f"{d}/nb-%j.out", "--export=ALL,NOTEBOOK_LOGIN_HOST=login.example.org", str(SCRIPT),
                         cwd=d)
    cluster.wait_state(job, "RUNNING", timeout=120)
    out = d / f"nb-{job}.out"
    def printed():
        text = out.read_text() if out.exists() else ""
        if re.search(r"\?token=[0-9a-f]{48}\n", text):  # the job's line, not the server's "token=..."
            return text
        state = cluster.job(job)["state"]
        assert state == "RUNNING", f"job {job} is {state}:\n{text}"
        return None
    text = wait_for(printed, 180, 0.5, what="the notebook job to print its URL")
    try:
        assert oct(out.stat().st_mode & 0o777) == "0o600"  # the token is in it
        commands = [line.strip() for line in text.splitlines() if line.strip().startswith("ssh ")]
        assert len(commands) == 1, text
        m = re.fullmatch(rf"ssh -N -L (\d+):127\.0\.0\.1:(\d+) -J login\.example\.org {TEST_USER}@{node.name}",
                         commands[0])
        assert m and m[1] == m[2], commands[0]
        port = int(m[2])
        url = re.search(rf"http://127\.0\.0\.1:{port}/\?token=([0-9a-f]{{48}})", text)
        assert url, text
        token = url[1]
        # the token is not on the server's command line (ps shows that to everyone)
        ps = subprocess.run(["ps", "-u", TEST_USER, "-o", "args="], capture_output=True, text=True).stdout
        assert "jupyter" in ps and token not in ps

        # The printed command, run as printed but for what the test's network needs: the test's
        # key and known_hosts, the node's address for its name, root (the test sshd's key is
        # root's), no jump host (the test reaches the node directly), another local port.
        local = spare_port()
        argv = commands[0].split()
        argv[3] = f"{local}:127.0.0.1:{port}"
        jump = argv.index("-J")
        del argv[jump:jump + 2]
        argv[-1] = f"root@{node.address}"
        argv[1:1] = ["-i", str(node.key), "-o", f"UserKnownHostsFile={node.known_hosts}", "-o", "BatchMode=yes",
                     "-o", "ExitOnForwardFailure=yes"]
        tunnel = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            def up():
                assert tunnel.poll() is None, tunnel.stderr.read().decode()
                try:
                    socket.create_connection(("127.0.0.1", local), 2).close()
                    return True
                except OSError:
                    return False
            wait_for(up, 60, what="the ssh tunnel")
            base = f"http://127.0.0.1:{local}"
            status, body = get(f"{base}/api/status?token={token}")
            assert status == 200 and "started" in json.loads(body)
            assert get(f"{base}/api/status", {"Authorization": f"token {token}"})[0] == 200
            assert get(f"{base}/api/status")[0] == 403  # no token: refused
            assert get(f"{base}/api/status?token={'0' * 48}")[0] == 403
            assert get(f"{base}/api/contents?token={token}")[0] == 200
        finally:
            tunnel.terminate()
            tunnel.wait(timeout=30)

        # Only the node's loopback listens: its own network address does not, from inside the
        # node or from outside
        inside = node.run([sys.executable, "-c", (
            "import socket, sys\n"
            "for host in ('127.0.0.1', sys.argv[1]):\n"
            "    try:\n"
            "        socket.create_connection((host, int(sys.argv[2])), 5).close(); print(host, 'open')\n"
            "    except ConnectionRefusedError:\n"
            "        print(host, 'refused')\n"), node.address, str(port)], capture_output=True, text=True)
        assert inside.stdout.split("\n")[:2] == ["127.0.0.1 open", f"{node.address} refused"], inside.stderr
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((node.address, port), 5)
    finally:
        cluster.cli("hcancel", str(job))
        cluster.wait_state(job, "CANCELLED", timeout=120)
    assert "jupyter" not in subprocess.run(["ps", "-u", TEST_USER, "-o", "args="], capture_output=True,
                                           text=True).stdout
