"""The resource limits a job starts with ([isolation.rlimits], pids_limit), read from inside real
jobs of a real user, in every runtime: jobs used to inherit whatever the agent had (systemd's 1024
open files and 8 MiB of locked memory; root's own here), and no cap on processes (fork bombs)."""
from __future__ import annotations

import os
import resource
import subprocess
import sys

import pytest

from tests.integration.test_agent_containers import busybox_rootfs, podman_installed

from .harness import TEST_USER, start_local_cluster, user_dir

pytestmark = pytest.mark.timeout(240)

# Within the hard limits this test machine's root has (it may not raise them: no CAP_SYS_RESOURCE),
# so that every value is what the job must see; a raise that is not allowed is tested below.
RLIMITS = '[isolation.rlimits]\nnofile = "4096:8192"\nmemlock = 65536\ncore = "0:unlimited"\nstack = "inherit"\n'
EXPECTED = {"Max open files": ("4096", "8192"), "Max locked memory": ("65536", "65536"),
            "Max core file size": ("0", "unlimited")}


@pytest.fixture(scope="module")
def cluster():
    c = start_local_cluster(gpus=1, agent_toml=f"[isolation]\npids_limit = 500\n{RLIMITS}")
    yield c
    c.close()


def limits_of(text: str) -> dict[str, tuple[str, str]]:
    """/proc/self/limits: name -> (soft, hard)."""
    out = {}
    for line in text.splitlines()[1:]:
        name, soft, hard = line[:26].strip(), line[26:47].strip(), line[47:68].strip()
        out[name] = (soft, hard)
    return out


def run_job(cluster, *args: str, command: str = "cat /proc/self/limits") -> str:
    d = user_dir(cluster.workdir, TEST_USER)
    job = cluster.submit("-o", "limits-%j.out", *args, "--wrap", command, cwd=d)
    done = cluster.wait_state(job, "COMPLETED", "FAILED", "CANCELLED")
    out = (d / f"limits-{job}.out").read_text()
    assert done["state"] == "COMPLETED", (done, out)
    return out


@pytest.mark.parametrize("runtime", ["none", "bwrap", "bwrap-image", "runc", "podman"])
def test_jobs_start_with_the_configured_limits(cluster, runtime):
    args: tuple[str, ...] = ()
    if runtime != "none":
        if runtime == "podman" and not podman_installed():
            pytest.skip("podman is not installed (scripts/test installs it)")
        args = (f"--runtime={runtime.split('-')[0]}",)
        if runtime != "bwrap":  # bwrap without an image goes through hai-jobexec; with one, Python
            d = user_dir(cluster.workdir, TEST_USER)
            if not (d / "busybox-root").exists():
                busybox_rootfs(d / "busybox-root")
                os.chmod(d, 0o755)
            args += (f"--container-image={d / 'busybox-root'}",)  # a path: for podman a name is an image name
    seen = limits_of(run_job(cluster, *args))
    for name, want in EXPECTED.items():
        assert seen[name] == want, (runtime, name, seen[name])
    assert seen["Max stack size"] == limits_of(open("/proc/self/limits").read())["Max stack size"]  # inherited


def test_a_job_may_lower_its_limits_but_not_raise_them(cluster):
    out = run_job(cluster, command="ulimit -n 2048; echo $?; ulimit -n 9000 2>/dev/null; echo $?; ulimit -Hn")
    lowered, raised, hard = out.split()
    assert (lowered, hard) == ("0", "2048") and raised != "0", out  # a raise is refused; the hard limit went down too


def test_a_fork_bomb_stops_at_the_runs_pids_limit(cluster):
    """pids_limit (default 65536; 500 here) caps the processes and threads of one run."""
    d = user_dir(cluster.workdir, TEST_USER)
    (d / "bomb.py").write_text(
        "#!/usr/bin/env python3\n"
        "import os, signal, time\n"
        "kids = []\n"
        "try:\n"
        "    for _ in range(800):\n"
        "        pid = os.fork()\n"
        "        if pid == 0:\n"
        "            time.sleep(60)\n"
        "            os._exit(0)\n"
        "        kids.append(pid)\n"
        "except OSError as exc:\n"
        "    print('refused', exc.strerror)\n"
        "print('started', len(kids), flush=True)\n"
        "for pid in kids:\n"
        "    os.kill(pid, signal.SIGKILL)\n")
    job = cluster.submit("-o", "bomb-%j.out", str(d / "bomb.py"), cwd=d)
    done = cluster.wait_state(job, "COMPLETED", "FAILED", "CANCELLED")
    out = (d / f"bomb-{job}.out").read_text()
    assert done["state"] == "COMPLETED", (done, out)
    assert "refused Resource temporarily unavailable" in out, out
    started = int(out.split("started ")[1].split()[0])
    assert 100 < started < 500, out  # the script and its interpreter count too


def test_a_limit_above_what_the_agent_may_raise_is_lowered_with_a_warning(tmp_path):
    """On a node where root may not raise hard limits (no CAP_SYS_RESOURCE, as on this test
    machine), the default nofile 131072 becomes the agent's own hard limit, with a warning that
    says what to change; where it may, jobs get 131072."""
    probe = subprocess.run([sys.executable, "-c", "import resource; resource.setrlimit(resource.RLIMIT_NOFILE, "
                            "(131072, 131072))"], capture_output=True)
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    want = "131072" if probe.returncode == 0 else str(hard)
    c = start_local_cluster(gpus=1)
    try:
        seen = limits_of(run_job(c))
        assert seen["Max open files"] == (want, want)
        pids = run_job(c, command='p=$(grep -m1 -E ":pids:|^0::" /proc/self/cgroup | cut -d: -f3); '
                                  'cat /sys/fs/cgroup/pids$p/pids.max 2>/dev/null || cat /sys/fs/cgroup$p/pids.max')
        assert pids.strip() == "65536"  # pids_limit's default
        log = (c.workdir / "agent.log").read_text()
        if probe.returncode != 0:
            assert "isolation.rlimits nofile: cannot raise this agent's hard limit" in log
            assert "Limit" in log and "hai-agent.service" in log
    finally:
        c.close()
