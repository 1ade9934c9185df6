"""ssh into your job's node (agent/adopt.py, agent/adopt_pam.py, scripts/install-node --adopt),
with a real sshd using PAM in the node's network namespace.

install-node --adopt installs the package (a wheel of this checkout, --no-deps) under a temp
root, writes its account line into a copy of this machine's /etc/pam.d/sshd and its snippet
into a copy of /etc/profile.d; a second sshd in node 1's namespace (UsePAM yes) sees those
copies in place of the system's, through bind mounts in a mount namespace of its own. The
controller reaches the agent through the node's ordinary sshd, as always. Users log in as
haitest (a job there) and haiother (none), with the one key the test sshd accepts for anyone."""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.infra.sshd import keygen, start_sshd
from tests.integration.test_agent_containers import fake_gpu_nodes

from .harness import OTHER_USER, TEST_USER, start_ssh_cluster, user_dir, wait_for

REPO = Path(__file__).resolve().parents[2]
PAM_PORT = 2222


@pytest.fixture(scope="module")
def adopt_env(ssh_nodes):
    node = ssh_nodes[0]
    base = Path(tempfile.mkdtemp(prefix="hai-adopt-", dir="/tmp"))
    os.chmod(base, 0o755)  # sshd reads authorized_keys as the user logging in
    env_dir = base / "adopt-env"
    devices = fake_gpu_nodes(base / "dev", 2)  # the agent's device_dir: what the device cgroup refuses
    cluster = start_ssh_cluster(ssh_nodes[:1], gpus_per_node=2,
                                agent_toml=f'[adopt]\nenv_dir = "{env_dir}"\n[isolation]\ndevice_dir = "{devices}"\n')
    sshd = None
    try:
        root = base / "root"
        (root / "etc/hai").mkdir(parents=True)
        shutil.copytree("/etc/pam.d", root / "etc/pam.d", symlinks=True)
        shutil.copytree("/etc/profile.d", root / "etc/profile.d", symlinks=True)
        # install-node never overwrites agent.toml: it reads the test agent's socket and env_dir from it
        shutil.copy(cluster.workdir / node.name / "agent.toml", root / "etc/hai/agent.toml")
        build_wheel(base)
        install = install_node(root, "--name", node.name, "--adopt")
        sshd = start_sshd(node.network, node.name, base / "sshd", port=PAM_PORT, pam_root=root)
        key = keygen(base / "id_user")
        sshd.authorize(Path(f"{key}.pub"))  # AuthorizedKeysFile is one file, for every user
        os.chmod(sshd.workdir, 0o755)
        os.chmod(sshd.authorized_keys, 0o644)
        known = sshd.write_known_hosts(base / "known_hosts")
        yield Env(cluster, node, sshd, key, known, root, env_dir, install, devices)
    finally:
        if sshd is not None:
            sshd.stop()
        cluster.close()
        if not os.environ.get("HAI_KEEP_TEST_DIRS"):
            shutil.rmtree(base, ignore_errors=True)


def build_wheel(base: Path) -> Path:
    src = base / "src"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", ".hypothesis"))
    out = base / "wheel"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(src)],
                   check=True, capture_output=True, text=True, timeout=600)
    (whl,) = out.glob("hai_cluster-*.whl")
    return whl


def install_node(root: Path, *args: str) -> subprocess.CompletedProcess:
    """scripts/install-node under `root`, from the wheel build_wheel made beside it."""
    (wheel,) = (root.parent / "wheel").glob("hai_cluster-*.whl")
    proc = subprocess.run([str(REPO / "scripts/install-node"), "--root", str(root), "--source", str(wheel),
                           "--pip-args", "--no-deps", *args], capture_output=True, text=True, timeout=600,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


class Env:
    def __init__(self, cluster, node, sshd, key, known, root, env_dir, install, devices) -> None:
        self.cluster, self.node, self.sshd, self.key, self.known = cluster, node, sshd, key, known
        self.root, self.env_dir, self.install, self.devices = root, env_dir, install, devices

    def ssh_argv(self, user: str, command: str) -> list[str]:
        return ["ssh", "-p", str(PAM_PORT), "-i", str(self.key), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
                "-o", f"UserKnownHostsFile={self.known}", "-o", "StrictHostKeyChecking=yes",
                "-o", "ConnectTimeout=30", "-l", user, self.sshd.address, command]

    def ssh(self, user: str, command: str) -> subprocess.CompletedProcess:
        return subprocess.run(self.ssh_argv(user, command), capture_output=True, text=True, timeout=120,
                              stdin=subprocess.DEVNULL)


def cgroup_v2(text: str) -> str:
    return next(line[3:] for line in text.splitlines() if line.startswith("0::"))


def start_job(env: Env, name: str) -> tuple[int, Path]:
    d = user_dir(env.cluster.workdir, TEST_USER)
    script = d / f"{name}.sh"
    script.write_text("#!/bin/bash\n#SBATCH --gpus-per-node=1\n"
                      "echo \"cvd=$CUDA_VISIBLE_DEVICES\" > " + str(d) + "/" + name + "-$HAI_JOB_ID.env\n"
                      "exec sleep 100000\n")
    job_id = env.cluster.submit(str(script), "-o", f"{d}/{name}-%j.out")
    env.cluster.wait_state(job_id, "RUNNING", timeout=120)
    out = d / f"{name}-{job_id}.env"
    wait_for(lambda: out.exists() and out.read_text().strip(), 60, what=f"job {job_id} to write its env")
    return job_id, out


def test_install_node_adopt_writes_one_pam_line_and_the_snippet_idempotently(adopt_env):
    pam = (adopt_env.root / "etc/pam.d/sshd").read_text().splitlines()
    ours = [i for i, line in enumerate(pam) if "hai_cluster.agent.adopt_pam" in line]
    assert len(ours) == 1
    line = pam[ours[0]]
    assert line.split()[:5] == ["account", "required", "pam_exec.so", "quiet", "stdout"]
    assert f"--socket {adopt_env.cluster.workdir / (adopt_env.node.name + '.sock')}" in line
    accounts = [i for i, line in enumerate(pam) if line.split()[:1] == ["account"] or line.startswith("@include common-account")]
    assert ours[0] == max(accounts)  # last in the account stack: the site's own rules come first
    snippet = (adopt_env.root / "etc/profile.d/hai-adopt.sh").read_text()
    assert f"{adopt_env.env_dir}/$_hai_run.sh" in snippet and "ENV_DIR" not in snippet
    # again: nothing changes; --no-adopt takes both away, and the system's pam.d is untouched
    before = (adopt_env.root / "etc/pam.d/sshd").read_bytes()
    again = install_node(adopt_env.root, "--adopt")
    assert "nothing to do" in again.stdout and (adopt_env.root / "etc/pam.d/sshd").read_bytes() == before
    removed = install_node(adopt_env.root, "--no-adopt")
    assert "removed the hai-cluster adopt line" in removed.stdout
    assert (adopt_env.root / "etc/pam.d/sshd").read_text() == Path("/etc/pam.d/sshd").read_text()
    assert not (adopt_env.root / "etc/profile.d/hai-adopt.sh").exists()
    assert "nothing to do" in install_node(adopt_env.root, "--no-adopt").stdout
    install_node(adopt_env.root, "--adopt")  # back, for the tests below
    assert (adopt_env.root / "etc/pam.d/sshd").read_bytes() == before
    assert "hai_cluster" not in Path("/etc/pam.d/sshd").read_text()


def test_a_user_with_a_job_lands_in_its_cgroup_with_its_gpus_and_leaves_with_it(adopt_env):
    env = adopt_env
    first, first_env = start_job(env, "adopt-a")
    second, second_env = start_job(env, "adopt-b")  # the newest: the one a login joins (Slurm's default)
    proc = env.ssh(TEST_USER, "cat /proc/self/cgroup; id -un; bash -lc 'echo \"cvd=$CUDA_VISIBLE_DEVICES "
                              "job=$HAI_JOB_ID\"'")
    assert proc.returncode == 0, proc.stderr + env.sshd.log_tail()
    assert cgroup_v2(proc.stdout).endswith(f"/{second}.0"), proc.stdout
    assert f"\n{TEST_USER}\n" in proc.stdout
    assert f"{second_env.read_text().strip()} job={second}" in proc.stdout  # the job's own GPU
    assert second_env.read_text() != first_env.read_text()  # the two jobs hold different GPUs
    env_file = env.env_dir / f"{second}.0.sh"
    assert env_file.stat().st_uid == os.stat(user_dir(env.cluster.workdir, TEST_USER)).st_uid
    assert oct(env_file.stat().st_mode & 0o777) == "0o400"
    # only the job's own GPU's device node opens (ENXIO: no driver behind the fake node); the other
    # job's is refused by the cgroup (EPERM), as Slurm's ConstrainDevices does
    probe = ("import errno, os\nfor i in (0, 1):\n    try:\n        os.close(os.open(f'%s/nvidia{i}', os.O_RDWR))\n"
             "        print(i, 'open')\n    except OSError as e:\n        print(i, errno.errorcode[e.errno])\n"
             % env.devices)
    opened = env.ssh(TEST_USER, f"python3 -c {shlex.quote(probe)}")
    own = int(second_env.read_text().strip().split("=")[1])
    assert sorted(opened.stdout.split("\n")[:2]) == sorted([f"{own} ENXIO", f"{1 - own} EPERM"]), opened

    # A session that stays: its processes are the job's, and the job's end ends them
    marker = f"hai-adopt-{second}-stays"
    session = subprocess.Popen(env.ssh_argv(TEST_USER, f"exec -a {marker} sleep 100000"),
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        pid = wait_for(lambda: find(marker), 60, what="the ssh session's command to start")
        with open(f"/proc/{pid}/cgroup") as f:
            assert cgroup_v2(f.read()).endswith(f"/{second}.0")
        env.cluster.cli("hcancel", str(second))
        env.cluster.wait_state(second, "CANCELLED", timeout=120)
        wait_for(lambda: not find(marker), 60, what="the adopted session's command to be killed")
        assert session.wait(timeout=60) != 0  # its connection went with it
        wait_for(lambda: not env_file.exists(), 30, what="the env file of the ended job to go")
    finally:
        if session.poll() is None:
            session.kill()
            session.wait()

    # the other job is still there: the next login joins it, now the newest
    proc = env.ssh(TEST_USER, "cat /proc/self/cgroup")
    assert proc.returncode == 0 and cgroup_v2(proc.stdout).endswith(f"/{first}.0"), proc.stdout + proc.stderr
    env.cluster.cli("hcancel", str(first))
    env.cluster.wait_state(first, "CANCELLED", timeout=120)
    refused = env.ssh(TEST_USER, "true")
    assert refused.returncode == 255
    assert f"Access denied by hai-cluster: you ({TEST_USER}) have no running job on node {env.node.name}" \
        in refused.stderr


def test_a_user_without_a_job_there_is_refused_and_root_is_let_in(adopt_env):
    env = adopt_env
    job, _ = start_job(env, "adopt-c")  # haitest's job: haiother still has none
    try:
        refused = env.ssh(OTHER_USER, "touch /tmp/hai-adopt-should-not-exist")
        assert refused.returncode == 255
        assert f"Access denied by hai-cluster: you ({OTHER_USER}) have no running job on node {env.node.name}" \
            in refused.stderr
        assert not Path("/tmp/hai-adopt-should-not-exist").exists()
        root = env.ssh("root", "cat /proc/self/cgroup; id -u")
        assert root.returncode == 0, root.stderr
        assert root.stdout.split()[-1] == "0"
        assert not cgroup_v2(root.stdout).endswith(f"/{job}.0")  # root is let in, into no job
    finally:
        env.cluster.cli("hcancel", str(job))
        env.cluster.wait_state(job, "CANCELLED", timeout=120)


def find(marker: str) -> int | None:
    """The pid of the process whose command line starts with `marker`, if one runs."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read().split(b"\0")[0] == marker.encode():
                    return int(pid)
        except OSError:
            pass
    return None


def test_an_operator_in_allow_users_is_let_in_without_a_job(adopt_env):
    """[adopt] allow_users: an operator with no job on the node gets in, into no job's cgroup (as
    root does); taken out of the list again, the same login is refused."""
    env = adopt_env
    toml = env.cluster.workdir / env.node.name / "agent.toml"
    original = toml.read_text()
    assert original.count("[adopt]\n") == 1

    def restart_agent(text: str) -> None:
        toml.write_text(text)
        agent = env.cluster.agents[env.node.name]
        agent.stop()
        agent.start()

    try:
        restart_agent(original.replace("[adopt]\n", f'[adopt]\nallow_users = ["{OTHER_USER}"]\n'))
        # until the agent serves its socket again, a login is refused (PAM cannot ask it)
        let_in = wait_for(lambda: (r := env.ssh(OTHER_USER, "cat /proc/self/cgroup; id -un")).returncode == 0 and r,
                          60, interval=1, what="the agent, restarted with allow_users, to let the operator in")
        assert let_in.stdout.split()[-1] == OTHER_USER
        assert not re.search(r"/\d+\.\d+$", cgroup_v2(let_in.stdout)), let_in.stdout  # into no job
    finally:
        restart_agent(original)
    refused = wait_for(lambda: (r := env.ssh(OTHER_USER, "true")).returncode == 255 and "no running job" in r.stderr
                       and r, 60, interval=1, what="the agent, restarted without allow_users, to refuse")
    assert f"Access denied by hai-cluster: you ({OTHER_USER}) have no running job on node {env.node.name}" \
        in refused.stderr
    env.cluster.wait_nodes(1)
