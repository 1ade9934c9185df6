"""Jobs in containers through a real hai-agent, with the real runtimes (bubblewrap, runc, podman
where it is installed), a busybox rootfs built here from /bin/busybox and fake GPU device nodes (char 195:N, made with
mknod): each job sees only its own GPUs' nodes, runs as the user, writes its output where asked,
gets the preempt notice and its grace, is held to its memory limit, and leaves nothing behind."""
from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import tarfile
from pathlib import Path

import pytest

from hai_cluster.agent import spool
from hai_cluster.transport.rpc import RpcError

from .agent_helpers import AgentProcess, Sandbox, client, need_root, read_when, run, run_to_end, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

NODE = "ctrnode"
GPUS = 4
BUSYBOX = "/bin/busybox"


def busybox_rootfs(path: Path) -> Path:
    """A minimal image: busybox and its applet links, plus the usual top-level directories."""
    for d in ("bin", "etc", "proc", "dev", "sys", "tmp", "home", "var"):
        (path / d).mkdir(parents=True, exist_ok=True)
    os.chmod(path / "tmp", 0o1777)
    shutil.copy2(BUSYBOX, path / "bin" / "busybox")
    subprocess.run(["chroot", str(path), "/bin/busybox", "--install", "-s", "/bin"], check=True)
    (path / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    os.chmod(path, 0o755)
    return path


def fake_gpu_nodes(path: Path, count: int) -> Path:
    """What the NVIDIA driver makes: /dev/nvidiaN (195:N) and the control nodes."""
    path.mkdir(mode=0o755)
    for i in range(count):
        os.mknod(path / f"nvidia{i}", 0o666 | stat.S_IFCHR, os.makedev(195, i))
    os.mknod(path / "nvidiactl", 0o666 | stat.S_IFCHR, os.makedev(195, 255))
    os.mknod(path / "nvidia-uvm", 0o666 | stat.S_IFCHR, os.makedev(511, 0))
    for p in (path, *path.iterdir()):
        os.chmod(p, 0o755 if p == path else 0o666)
    return path


def podman_installed() -> bool:
    """podman installed (scripts/test installs it): the podman cases are skipped only without it."""
    return shutil.which("podman") is not None


PODMAN_IMAGE = f"localhost/hai-test-busybox:{os.getpid()}"


def podman_load(tarball: Path) -> str | None:
    """The busybox rootfs as a local podman image (as a site would load one; never pulled)."""
    if not podman_installed():
        return None
    subprocess.run(["podman", "--runtime", "runc", "import", str(tarball), PODMAN_IMAGE], check=True,
                   stdin=subprocess.DEVNULL, capture_output=True)
    return PODMAN_IMAGE


def podman_containers(name: str) -> list[str]:
    """Containers of any state whose name contains `name` (`podman ps -a`)."""
    out = subprocess.run(["podman", "--runtime", "runc", "ps", "-a", "--format", "{{.Names}}"],
                         check=True, capture_output=True, text=True).stdout
    return [n for n in out.split() if name in n]


def isolation_agent(box: Sandbox, name: str, toml: str) -> AgentProcess:
    """An AgentProcess whose config also has an [isolation] table."""
    agent = AgentProcess(box, name=name)
    with open(agent.config, "a") as f:
        f.write(f"[isolation]\n{toml}")
    return agent


@pytest.fixture(scope="module")
def env():
    need_root()
    for tool in ("bwrap", "runc", "chroot"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is not installed; run the tests with scripts/test, which installs it")
    box = Sandbox()
    devices = fake_gpu_nodes(box.base / "fakedev", GPUS)
    rootfs = busybox_rootfs(box.base / "images" / "busybox")
    tarball = box.base / "images" / "busybox.tar.gz"
    with tarfile.open(tarball, "w:gz") as tf:
        tf.add(rootfs, arcname=".")
    os.chmod(box.base / "images", 0o755)
    reference = podman_load(tarball)
    agent = isolation_agent(box, NODE, f'device_dir = "{devices}"\n').start()
    yield agent, rootfs, tarball
    agent.stop()
    if reference:
        subprocess.run(["podman", "rmi", "--force", reference], capture_output=True)
    box.cleanup()


def key(spec: dict, **more) -> dict:
    return {"job_id": spec["job_id"], "attempt": spec["attempt"], **more}


def run_dir(box: Sandbox, spec: dict) -> Path:
    return spool.runs_dir(box.spool) / spool.run_dir_name(spec["job_id"], spec["attempt"])


def procs_with(marker: str) -> list[int]:
    """Live processes whose command line contains marker."""
    out = []
    for pid in spool._pids():
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmd and spool.proc_starttime(pid) is not None:
            out.append(pid)
    return out


# (runtime, image): bwrap on the host's root, bwrap and runc on the busybox image, runc on its
# tarball; podman on the image, the tarball and a local image ("ref", imported by the fixture)
_PODMAN = pytest.mark.skipif(not podman_installed(), reason="podman is not installed (scripts/test installs it)")


def _case(runtime: str, kind: str | None, name: str):
    return pytest.param(runtime, kind, id=name, marks=[_PODMAN] if runtime == "podman" else [])


ALL = {n: _case(r, k, n) for r, k, n in [
    ("bwrap", None, "bwrap-host"), ("bwrap", "dir", "bwrap-image"), ("runc", "dir", "runc-image"),
    ("runc", "tar", "runc-tarball"), ("podman", "dir", "podman-image"), ("podman", "tar", "podman-tarball"),
    ("podman", "ref", "podman-local")]}
CASES = list(ALL.values())
SIGNAL_CASES = [ALL[n] for n in ("bwrap-host", "bwrap-image", "runc-image", "podman-image", "podman-local")]
OOM_CASES = [ALL[n] for n in ("bwrap-image", "runc-image", "podman-image", "podman-local")]


def image_for(env, kind):
    _, rootfs, tarball = env
    if kind == "ref":
        return PODMAN_IMAGE
    return None if kind is None else str(rootfs if kind == "dir" else tarball)


@pytest.mark.parametrize("runtime,kind", CASES)
def test_job_sees_only_its_gpus_runs_as_the_user_and_writes_its_output(env, runtime, kind):
    agent = env[0]
    box = agent.box
    script = ("#!/bin/sh\n"
              'echo "uid=$(id -u) gid=$(id -g) cwd=$(pwd) args=$*"\n'
              'echo "nvd=$NVIDIA_VISIBLE_DEVICES cvd=$CUDA_VISIBLE_DEVICES control=$HAI_CONTROL_DIR"\n'
              "echo DEV $(ls /dev | grep nvidia)\n"
              "echo ALLDEV $(ls /dev)\n"
              "cat /dev/nvidia1 2>&1 | sed 's/^/OPEN /'\n"
              'echo "pid1=$(cat /proc/1/comm)"\n'
              "echo written > made-by-$HAI_JOB_ID\n"
              "touch /etc/not-allowed 2>/dev/null && echo ROOT-WRITABLE\n"
              "exit 7\n")
    spec = box.spec(script, runtime=runtime, container_image=image_for(env, kind), gpus=[1, 2],
                    script_args=["a", "b c"])
    spec["environment"]["CUDA_VISIBLE_DEVICES"] = "1,2"

    ended = run_to_end(agent, spec)
    out = Path(spec["stdout"]).read_text()
    assert ended["exit_code"] == 7 and ended["reason"] is None and ended["signal"] is None, (ended, out)
    user = box.user
    assert f"uid={user.pw_uid} gid={user.pw_gid} cwd={box.work} args=a b c\n" in out, out
    # only the rank's GPUs, renumbered for CUDA; the control nodes that exist on the host
    control = run_dir(box, spec) / spool.CONTROL
    assert f"nvd=1,2 cvd=0,1 control={control}\n" in out, out
    assert "DEV nvidia-uvm nvidia1 nvidia2 nvidiactl\n" in out, out
    # a fake node has no driver behind it: ENXIO means the node (and the devices cgroup) let it through
    assert "OPEN cat: can't open '/dev/nvidia1': No such device or address" in out or \
        "OPEN cat: /dev/nvidia1: No such device or address" in out, out
    assert "ROOT-WRITABLE" not in out  # the root is read-only
    made = box.work / f"made-by-{spec['job_id']}"
    assert made.read_text() == "written\n"
    assert (os.stat(made).st_uid, os.stat(spec["stdout"]).st_uid) == (user.pw_uid, user.pw_uid)
    # own PID namespace: PID 1 is bwrap's reaper, or the init bound into the runc/podman container
    assert f"pid1={'bwrap' if runtime == 'bwrap' else 'init'}\n" in out, out
    devs = next(ln for ln in out.splitlines() if ln.startswith("ALLDEV ")).split()[1:]
    assert not [d for d in devs if d.startswith(("sd", "vd", "nvme", "loop")) or d in ("nvidia0", "nvidia3")]
    cg = json.loads((run_dir(box, spec) / "isolation.json").read_text())
    assert cg["runtime"] == runtime
    for d in cg["cgroup"] and _cgroup_dirs(cg["cgroup"]) or []:
        assert not os.path.exists(d), f"{d} was not removed"


def _cgroup_dirs(record: dict) -> list[str]:
    from hai_cluster.agent.cgroups import RunCgroup
    return list(RunCgroup.from_record(record).dirs.values())


@pytest.mark.parametrize("runtime,kind", SIGNAL_CASES)
def test_cancel_leaves_no_process_behind(env, runtime, kind):
    agent = env[0]
    box = agent.box
    marker = str(31000 + len(runtime) * 10 + {"dir": 1, "ref": 2}.get(kind, 0))
    # in the group, a double-forked one that left the session, and one trapping TERM
    script = ("#!/bin/sh\n"
              f"sleep {marker} &\n"
              f"setsid sh -c 'sleep {marker}1 & sleep {marker}2' &\n"
              "trap '' TERM\n"
              "echo ready > ready-$HAI_JOB_ID\n"
              "while :; do sleep 0.1; done\n")
    spec = box.spec(script, runtime=runtime, container_image=image_for(env, kind), grace=1)

    async def body():
        async with client(agent) as c:
            await c.call("start_run", {"spec": spec})
            await read_when(box.work / f"ready-{spec['job_id']}", "ready", timeout=60)
            wait_for(lambda: len(procs_with(f"sleep {marker}")) >= 3, 20, "the job's sleeps")
            assert await c.call("terminate_run", key(spec, reason="cancel")) == {"found": True}
            return await c.exited(spec["job_id"], timeout=60)

    ended = run(body())
    assert ended["reason"] == "cancel" and ended["killed"] is True, ended
    assert procs_with(f"sleep {marker}") == []
    left = [p for p in spool._pids() if _uid(p) == box.user.pw_uid and _in_run(p, box, spec)]
    assert left == [], [_describe(p) for p in left]
    if runtime == "podman":  # and no container, running or stopped
        from hai_cluster.agent.cgroups import agent_cgroup
        name = f"hai-{agent_cgroup(NODE, str(box.spool))}-{spec['job_id']}-{spec['attempt']}"
        assert podman_containers(name) == []


def _uid(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def _describe(pid: int) -> str:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        return f"{pid} {cmd!r} in {Path(f'/proc/{pid}/cgroup').read_text().splitlines()[:2]}"
    except OSError:
        return f"{pid} (gone)"


def _run_cgroup(box: Sandbox, spec: dict) -> str:
    """This agent's cgroup of the run: agents of other tests on the machine have runs with the
    same job ids, by the same test user."""
    from hai_cluster.agent.cgroups import agent_cgroup
    return f"/{agent_cgroup(NODE, str(box.spool))}/{spool.run_dir_name(spec['job_id'], spec['attempt'])}"


def _in_run(pid: int, box: Sandbox, spec: dict) -> bool:
    try:
        return _run_cgroup(box, spec) in Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return False


@pytest.mark.parametrize("runtime,kind", SIGNAL_CASES)
def test_preempt_notice_reaches_the_job_which_checkpoints_within_its_grace(env, runtime, kind):
    agent = env[0]
    box = agent.box
    ckpt = box.work / "ckpt" / f"{runtime}-{kind}"
    script = ("#!/bin/sh\n"
              "trap 'cat \"$HAI_CONTROL_DIR/preempt\" > \"$HAI_CHECKPOINT_DIR/notice\"; "
              "echo step-41 > \"$HAI_CHECKPOINT_DIR/state\"; exit 0' TERM\n"
              "echo ready > ready-$HAI_JOB_ID\n"
              "while :; do sleep 0.1; done\n")
    spec = box.spec(script, runtime=runtime, container_image=image_for(env, kind), grace=30,
                    checkpoint_dir=str(ckpt))
    spec["environment"]["HAI_CHECKPOINT_DIR"] = str(ckpt)

    async def body():
        async with client(agent) as c:
            await c.call("start_run", {"spec": spec})
            await read_when(box.work / f"ready-{spec['job_id']}", "ready", timeout=60)
            await c.call("terminate_run", key(spec, reason="preempt"))
            return await c.exited(spec["job_id"], timeout=60)

    ended = run(body())
    out = Path(spec["stdout"]).read_text()
    assert ended["reason"] == "preempt" and ended["killed"] is False and ended["exit_code"] == 0, (ended, out)
    assert ended["end_time"] - ended["start_time"] < 30  # within the grace, not killed at its end
    notice = json.loads((ckpt / "notice").read_text())
    assert notice["reason"] == "preempt" and notice["signal"] == signal.SIGTERM and notice["grace"] == 30
    assert (ckpt / "state").read_text() == "step-41\n"
    assert os.stat(ckpt / "state").st_uid == box.user.pw_uid


@pytest.mark.parametrize("runtime,kind", OOM_CASES)
@pytest.mark.parametrize("then", ["loops", "exits"])
def test_memory_limit_ends_the_job_as_oom(env, runtime, kind, then):
    agent = env[0]
    box = agent.box
    # tail keeps the whole "line" of zeros in memory: far past the limit. The OOM killer kills
    # tail only; the run must end all the same (the script would loop for ever). Or the script
    # exits at once: a container's cgroup, where cgroup v1 counted the kill, is gone before the
    # shepherd's next look; the run's cgroup's OOM event still tells it.
    rest = "while :; do sleep 0.1; done" if then == "loops" else "exit 0"
    script = f"#!/bin/sh\nhead -c 300m /dev/zero | tail > /dev/null\n{rest}\n"
    spec = box.spec(script, runtime=runtime, container_image=image_for(env, kind), mem_mb=48)

    ended = run_to_end(agent, spec)
    assert ended["reason"] == "oom", (ended, Path(spec["stdout"]).read_text())
    assert ended["message"] == "job exceeded its memory limit of 48 MiB"


def test_a_tarball_is_unpacked_once_into_the_cache(env):
    agent, _, tarball = env
    box = agent.box
    specs = [box.spec("#!/bin/sh\ncat /etc/passwd\n", runtime="runc", container_image=str(tarball))
             for _ in range(2)]

    async def body():
        async with client(agent) as c:
            out = []
            for spec in specs:
                await c.call("start_run", {"spec": spec})
                out.append(await c.exited(spec["job_id"], timeout=60))
            return out

    for ended, spec in zip(run(body()), specs):
        assert ended["exit_code"] == 0, ended
        assert Path(spec["stdout"]).read_text() == "root:x:0:0:root:/root:/bin/sh\n"
    cache = box.spool / "images"
    entries = [e for e in os.listdir(cache) if not e.startswith(".") and not e.endswith(".lock")]
    assert len(entries) == 1 and len(entries[0]) == 64  # sha256 of the tarball
    # its lock (held by each run that uses it) records what it unpacked to, for the cache's limit
    recorded = json.loads((cache / f"{entries[0]}.lock").read_text())
    assert recorded["bytes"] >= os.path.getsize(BUSYBOX) and recorded["entries"] > 100, recorded
    assert not (cache / entries[0] / "bin" / "busybox").stat().st_mode & (stat.S_ISUID | stat.S_ISGID)


def test_a_tarball_made_by_gnu_tar_unpacks_as_it_was(env):
    """The cache reads a tarball once, front to back (tarfile's stream mode, our decompression):
    what GNU tar makes (xz, in two streams as pixz and pbzip2 make them; hard links, a pax sparse
    file, setuid bits, a read-only directory) comes out as tar would unpack it, with its holes."""
    agent, rootfs, _ = env
    box = agent.box
    src = box.base / "images" / "gnu-rootfs"
    shutil.copytree(rootfs, src, symlinks=True)
    data = src / "data"
    data.mkdir()
    (data / "a").write_text("hard-linked\n")
    os.link(data / "a", data / "b")
    with open(data / "sparse", "wb") as f:
        f.truncate(256 << 20)
        f.seek(100 << 20)
        f.write(b"middle")
    (data / "suid").write_text("#!/bin/sh\n")
    os.chmod(data / "suid", 0o4755)
    os.chmod(data, 0o555)  # its mode is set only after its files were written

    def tar(*names: str) -> bytes:
        return subprocess.run(["tar", "--sparse", "--format=posix", "-C", str(src), "-cf", "-", *names],
                              check=True, capture_output=True).stdout

    def xz(raw: bytes) -> bytes:
        return subprocess.run(["xz", "-1"], input=raw, check=True, capture_output=True).stdout
    first = tar("bin", "etc").rstrip(b"\0")  # without its end-of-archive blocks: the second stream goes on
    tarball = box.base / "images" / "gnu.tar.xz"
    tarball.write_bytes(xz(first + bytes(-len(first) % 512)) + xz(tar("data")))
    os.chmod(data, 0o755)
    script = ("#!/bin/sh\n"
              "[ $(stat -c %i /data/a) = $(stat -c %i /data/b) ] && echo linked\n"
              "cat /data/b; stat -c %s /data/sparse; stat -c %a /data/suid /data\n"
              "dd if=/data/sparse bs=1048576 skip=100 count=1 2>/dev/null | head -c 6; echo\n")
    spec = box.spec(script, runtime="runc", container_image=str(tarball))

    ended = run_to_end(agent, spec)
    out = Path(spec["stdout"]).read_text()
    assert ended["exit_code"] == 0, (ended, out)
    assert out == "linked\nhard-linked\n268435456\n755\n555\nmiddle\n", out
    cache = box.spool / "images"
    image = next(cache / e for e in os.listdir(cache) if len(e) == 64 and (cache / e / "data").is_dir())
    assert (image / "data" / "sparse").stat().st_blocks * 512 < 4 << 20  # its holes stayed holes


def test_launch_failures_name_the_reason(env):
    agent, rootfs, _ = env
    box = agent.box
    missing = str(box.base / "images" / "missing")
    private = box.base / "images" / "private"
    shutil.copytree(rootfs, private / "rootfs", symlinks=True)
    os.chmod(private, 0o700)
    failing = [
        (box.spec("#!/bin/sh\ntrue\n", runtime="bwrap", container_image=missing),
         f"container image {missing} does not exist on node {NODE}"),
        (box.spec("#!/bin/sh\ntrue\n", runtime="runc", container_image=missing),
         f"container image {missing} does not exist on node {NODE}"),
        (box.spec("#!/bin/sh\ntrue\n", runtime="runc", container_image=str(private / "rootfs")),
         f"container image {private}/rootfs: permission denied for user"),
        (box.spec("#!/bin/sh\ntrue\n", runtime="podman", container_image="docker.io/library/busybox"),
         f"podman is not installed on node {NODE}"),
        (box.spec("#!/bin/sh\ntrue\n", runtime="bwrap", container_image=str(rootfs),
                  workdir="/nonexistent/dir"), "chdir to /nonexistent/dir failed"),
    ]
    refused = [
        (box.spec("#!/bin/sh\ntrue\n", runtime="docker"), "spec.runtime must be one of none, bwrap, runc"),
        (box.spec("#!/bin/sh\ntrue\n", runtime="runc"), "spec.runtime runc needs a container_image"),
        (box.spec("#!/bin/sh\ntrue\n", runtime="bwrap", container_image="relative/dir"),
         "spec.container_image must be an absolute path"),
    ]

    async def body():
        async with client(agent) as c:
            replies = [await c.call("start_run", {"spec": s}) for s, _ in failing]
            errors = []
            for s, _ in refused:
                with pytest.raises(RpcError) as info:
                    await c.call("start_run", {"spec": s})
                errors.append(str(info.value))
            return replies, errors

    replies, errors = run(body())
    if podman_installed():  # installed: a reference that is not a local image is refused, never pulled
        failing[3] = (failing[3][0], f"container image docker.io/library/busybox is not a local podman "
                                     f"image on node {NODE}")
    for (spec, message), reply in zip(failing, replies):
        st = reply["status"]
        assert st["state"] == "ended" and st["reason"] == "launch_failed", st
        assert message in st["message"], st["message"]
        assert st["pid"] is None
    for (_, message), error in zip(refused, errors):
        assert message in error


def test_runcs_log_is_roots_alone(env):
    """runc.log (runc's errors: the job's paths, ids, mounts) is 0600 root in the 0711 run dir, not
    0644 as runc makes it (issue 18, L5); the shepherd still quotes runc's error from it."""
    agent, rootfs, _ = env
    box = agent.box
    broken = box.base / "images" / "tmp-is-a-file"  # runc cannot mount its tmpfs on /tmp
    shutil.copytree(rootfs, broken, symlinks=True)
    (broken / "tmp").rmdir()
    (broken / "tmp").write_text("")
    ok = box.spec("#!/bin/sh\ntrue\n", runtime="runc", container_image=str(rootfs))
    bad = box.spec("#!/bin/sh\ntrue\n", runtime="runc", container_image=str(broken))

    async def body():
        async with client(agent) as c:
            out = []
            for spec in (ok, bad):
                st = (await c.call("start_run", {"spec": spec}))["status"]
                out.append(st if st["state"] == "ended" else await c.exited(spec["job_id"], timeout=60))
            return out

    ended = run(body())
    assert ended[0]["exit_code"] == 0, ended
    assert ended[1]["reason"] == "launch_failed", ended
    assert ended[1]["message"].startswith("runc could not start the container: "), ended
    assert 'mounting "tmpfs" to rootfs at "/tmp"' in ended[1]["message"], ended  # runc's own, from its log
    for spec in (ok, bad):
        log = run_dir(box, spec) / "runc.log"
        st = log.stat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o600), oct(st.st_mode)
        read = subprocess.run(["cat", str(log)], user=box.user.pw_uid, group=box.user.pw_gid, extra_groups=[],
                              capture_output=True, text=True)
        assert read.returncode != 0 and "Permission denied" in read.stderr, read
