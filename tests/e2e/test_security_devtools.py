"""hai-dev and the quickstart, run as root against a directory another user (haiother) prepared
(hai_cluster/safefs.py, devprocs.py): nothing of theirs is run, read back, killed or removed, and
the refusal says why. And `hai-dev down` really stops a running cluster's shepherds and jobs.

hai-dev is run as `python -c 'from hai_cluster.dev import main'` with PYTHONPATH at this checkout,
so that a copy of these tests in an older tree runs that tree's hai-dev."""
from __future__ import annotations

import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from tests.infra.fixtures import require_root

from .harness import OTHER_USER, ensure_user, wait_for

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
ENV.pop("HAI_DEV_DIR", None)
HAI_DEV = [sys.executable, "-c", "from hai_cluster.dev import main; main()"]


def hai_dev(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*HAI_DEV, *map(str, args)], capture_output=True, text=True, env=ENV, cwd="/",
                          timeout=timeout)


def as_other(*argv: str, **kw) -> subprocess.CompletedProcess:
    pw = ensure_user(OTHER_USER)
    return subprocess.run([*map(str, argv)], user=pw.pw_uid, group=pw.pw_gid, extra_groups=[], cwd="/tmp",
                          check=True, capture_output=True, text=True, **kw)


def mentioning(path: Path) -> list[int]:
    """Processes whose command line names path (what a test's cluster leaves, if anything)."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if str(path).encode() in f.read():
                    out.append(int(pid))
        except OSError:
            pass
    return out


def kill_mentioning(path: Path) -> None:
    for pid in mentioning(path):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def alive(proc: subprocess.Popen) -> bool:
    return proc.poll() is None


@pytest.fixture
def theirs():
    """A directory haiother made in /tmp (the fixed-name trap of the audit), removed afterwards
    along with whatever an unfixed hai-dev started there."""
    require_root("hai-dev as root against another user's directory")
    d = Path(f"/tmp/hai-quickstart-{uuid.uuid4().hex[:8]}")
    as_other("mkdir", "-m", "0755", d)
    yield d
    kill_mentioning(d)
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def root_sleeper():
    """A root process that a planted cluster.json names."""
    proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


def starttime(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


def test_up_refuses_a_directory_another_user_made_and_runs_nothing_of_theirs(theirs):
    # The audit's attack: node1/agent.toml is a FIFO. The unfixed hai-dev wrote root's config into
    # it, the agent (root) then read haiother's back, with a health check program of theirs.
    node = theirs / "node1"
    as_other("mkdir", node)
    as_other("mkfifo", node / "agent.toml")
    evil = theirs / "evil.sh"
    as_other("sh", "-c", f"printf '#!/bin/sh\\ntouch {theirs}/pwned\\n' > {evil}; chmod 755 {evil}")
    config = (f'[agent]\nname = "node1"\nsocket = "{node}/agent.sock"\nspool = "{node}/spool"\n'
              f'allow_root_jobs = true\nhealth_check_program = "{evil}"\nhealth_check_interval = 1\n'
              f'[gpus]\nbackend = "simulated"\nsimulated_count = 1\n')
    feeder_code = (f"f = open({str(node / 'agent.toml')!r}, 'rb'); f.read(); f.close()\n"
                   f"f = open({str(node / 'agent.toml')!r}, 'w'); f.write({config!r}); f.close()\n")
    pw = ensure_user(OTHER_USER)
    feeder = subprocess.Popen(["python3", "-c", feeder_code], user=pw.pw_uid, group=pw.pw_gid, extra_groups=[],
                              cwd="/tmp")
    try:
        up = hai_dev("up", "--dir", theirs, "--nodes", 1, "--gpu-backend", "simulated", "--timeout", 20)
        assert up.returncode != 0, up.stdout
        assert f"refusing to use {theirs}" in up.stderr and f"owned by {OTHER_USER}" in up.stderr, up.stderr
        time.sleep(2)  # an agent that had read their config would have run the check by now
        assert not (theirs / "pwned").exists()
        assert mentioning(theirs) == [feeder.pid]  # no daemon started there
        assert stat.S_ISFIFO(os.lstat(node / "agent.toml").st_mode) and alive(feeder)  # untouched
        assert sorted(os.listdir(theirs)) == ["evil.sh", "node1"]
    finally:
        feeder.kill()
        feeder.wait()


def test_up_refuses_a_path_others_can_redirect(theirs, tmp_path):
    # Below a directory of theirs (they could rename what hai-dev made there and put theirs in its
    # place), through a symlink of theirs, or into a directory of ours that others can write.
    as_other("chmod", "0777", theirs)
    sub = hai_dev("up", "--dir", theirs / "sub", "--nodes", 1, "--timeout", 10)
    assert sub.returncode != 0 and f"{theirs} is owned by {OTHER_USER}" in sub.stderr, sub.stderr
    assert not (theirs / "sub").exists()

    target = tmp_path / "root-private"
    target.mkdir(mode=0o700)
    link = Path(f"/tmp/hai-link-{uuid.uuid4().hex[:8]}")
    as_other("ln", "-s", target, link)
    try:
        via = hai_dev("up", "--dir", link, "--nodes", 1, "--timeout", 10)
        assert via.returncode != 0 and f"{link} is a symlink owned by {OTHER_USER}" in via.stderr, via.stderr
        assert os.listdir(target) == []
    finally:
        link.unlink()

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    loose = hai_dev("up", "--dir", shared, "--nodes", 1, "--timeout", 10)
    assert loose.returncode != 0 and "is writable by others (mode 0777)" in loose.stderr, loose.stderr
    assert os.listdir(shared) == []


def test_down_refuses_another_users_cluster_json(theirs, root_sleeper):
    # cluster.json naming a root process: the unfixed `down` killed it, as root.
    pid = root_sleeper.pid
    planted = (f'{{"pids": {{"controller": {pid}, "node1": {pid}}}, "nodes": ["node1"], '
               f'"procs": {{"controller": {{"pid": {pid}, "starttime": {starttime(pid)}, '
               f'"argv": ["sleep", "300"]}}}}}}')
    as_other("sh", "-c", f"cat > {theirs}/cluster.json", input=planted)
    down = hai_dev("down", "--dir", theirs)
    assert down.returncode != 0, down.stdout
    assert f"refusing to use {theirs}" in down.stderr and f"owned by {OTHER_USER}" in down.stderr, down.stderr
    time.sleep(0.5)
    assert alive(root_sleeper)
    assert (theirs / "cluster.json").read_text() == planted  # nothing of theirs removed either


def test_down_signals_only_what_it_can_prove_it_started(tmp_path, root_sleeper):
    """In a directory of ours, a cluster.json whose pids are now other processes (reused pids, or
    a record of the old format): nothing is signalled."""
    require_root("hai-dev down as root")
    d = tmp_path / "mine"
    d.mkdir(mode=0o700)
    decoy = subprocess.Popen(["/bin/sh", "-c", "sleep 300; :", "--config", f"{d}/controller.toml"],
                             start_new_session=True)  # the right command line tail, not our process
    try:
        pid = root_sleeper.pid
        (d / "cluster.json").write_text(
            f'{{"pids": {{"controller": {pid}, "node1": {decoy.pid}}}, "nodes": ["node1"], "procs": {{'
            f'"controller": {{"pid": {pid}, "starttime": {starttime(pid)}, "argv": ["sleep", "300"]}}, '
            f'"node1": {{"pid": {decoy.pid}, "starttime": {starttime(decoy.pid) - 1}, '
            f'"argv": ["/bin/sh", "-c", "sleep 300; :", "--config", "{d}/node1/agent.toml"]}}}}}}')
        down = hai_dev("down", "--dir", d)
        assert down.returncode == 0, down.stderr
        time.sleep(0.5)
        assert alive(root_sleeper) and alive(decoy)
        assert not (d / "cluster.json").exists()
    finally:
        os.killpg(decoy.pid, signal.SIGKILL)  # the shell and its sleep
        decoy.wait()


def _argv(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []


def _job_sleeps() -> list[int]:
    return [p for p in map(int, filter(str.isdigit, os.listdir("/proc")))
            if _argv(p) in (["sleep", "4101"], ["sleep", "4102"])]


def test_down_stops_the_shepherds_and_jobs_of_a_running_cluster():
    require_root("a dev cluster as root")
    d = Path(tempfile.mkdtemp(prefix="hai-dev-down-", dir="/tmp"))
    try:
        up = hai_dev("up", "--dir", d, "--nodes", 2, "--gpus-per-node", 2, "--gpu-backend", "simulated",
                     "--tick", 0.2, "--timeout", 60)
        assert up.returncode == 0, up.stderr
        assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
        for name in ("cluster.json", "controller.toml", "node1/agent.toml", "node1/agent.log"):
            assert stat.S_IMODE(os.stat(d / name).st_mode) == 0o600, name
        env = {**ENV, "HAI_CONTROLLER": f"{d}/controller.sock"}
        work = d / "work"
        work.mkdir()
        hsubmit = str(Path(sys.executable).parent / "hsubmit")
        for extra, script in ((["-N", "2"], "sleep 4101"),
                              ([], "trap '' TERM; sleep 4102")):  # this one ignores the shepherd's SIGTERM
            subprocess.run([hsubmit, "--parsable", "--gpus-per-node", "1", *extra, "--wrap", script], cwd=work,
                           env=env, capture_output=True, text=True, check=True)

        def both_jobs_run():
            found = _job_sleeps()
            return found if {_argv(p)[1] for p in found} == {"4101", "4102"} else None
        sleeps = wait_for(both_jobs_run, 60, 0.2, "both jobs to run")
        shepherds = [p for p in mentioning(d) if "hai_cluster.agent.shepherd" in _argv(p)]
        assert shepherds

        down = hai_dev("down", "--dir", d, timeout=60)
        assert down.returncode == 0, down.stderr
        assert f"{len(shepherds)} job run(s) ended" in down.stdout, down.stdout
        assert not set(sleeps) & set(_job_sleeps()), "a job process is left"
        assert mentioning(d) == [], "a daemon or shepherd of the cluster is left"
        assert not (d / "cluster.json").exists()

        removed = hai_dev("down", "--dir", d, "--remove")
        assert removed.returncode == 0 and not d.exists(), removed.stderr
    finally:
        kill_mentioning(d)
        for pid in _job_sleeps():  # what an unfixed `down` leaves running
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(d, ignore_errors=True)


def test_quickstart_leaves_another_users_directory_alone(theirs, root_sleeper):
    # The unfixed quickstart ran `hai-dev down` there (killing what cluster.json named) and rm -rf.
    as_other("sh", "-c", f"cat > {theirs}/cluster.json",
             input=f'{{"pids": {{"controller": {root_sleeper.pid}}}, "nodes": []}}')
    as_other("touch", theirs / "their-notes.txt")
    qs = subprocess.run([str(REPO / "scripts" / "quickstart")], cwd=REPO, env={**ENV, "HAI_DEV_DIR": str(theirs)},
                        capture_output=True, text=True, timeout=600)
    assert qs.returncode != 0, qs.stdout
    assert f"HAI_DEV_DIR={theirs} is not a directory of yours (owner {OTHER_USER}" in qs.stderr, qs.stderr
    assert sorted(os.listdir(theirs)) == ["cluster.json", "their-notes.txt"] and alive(root_sleeper)


def test_quickstart_default_is_a_fresh_private_directory():
    """No HAI_DEV_DIR: a new mktemp -d directory, even when someone made /tmp/hai-quickstart (the
    old fixed default) a trap; the README's two commands work with the lines it prints."""
    require_root("the quickstart")
    old = Path("/tmp/hai-quickstart")
    trap = not os.path.lexists(old)
    if trap:  # (an operator's own one is left alone)
        as_other("mkdir", old)
    d = None
    try:
        qs = subprocess.run([str(REPO / "scripts" / "quickstart")], cwd=REPO, env=ENV, capture_output=True,
                            text=True, timeout=600)
        assert qs.returncode == 0, qs.stdout + qs.stderr
        d = Path(qs.stdout.split("== starting a dev cluster in ")[1].split("\n")[0])
        assert d.parent == Path("/tmp") and d.name.startswith("hai-quickstart.") and d != old
        st = os.stat(d)
        assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o700
        assert "short job: COMPLETED; long job: COMPLETED" in qs.stdout
        stop = qs.stdout.strip().splitlines()[-1].split()
        assert stop[1:] == ["down", "--dir", str(d), "--remove"], stop
        down = subprocess.run(stop, capture_output=True, text=True, env=ENV)
        assert down.returncode == 0 and not d.exists(), down.stderr
        if trap:
            assert pwd.getpwuid(os.stat(old).st_uid).pw_name == OTHER_USER and os.listdir(old) == []
    finally:
        if d is not None:
            kill_mentioning(d)
            shutil.rmtree(d, ignore_errors=True)
        if trap:
            shutil.rmtree(old, ignore_errors=True)
