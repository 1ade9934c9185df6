"""The isolation pieces on their own, without an agent: cgroup detection and limits on a pure
cgroup v2 layout (faked in a temp dir: this machine is hybrid), RunSpec's new fields, the
[isolation] config table, the safe tarball unpacking and the runc bundle."""
from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path

import pytest

from hai_cluster.agent import cgroups, devcgroup
from hai_cluster.agent.isolation import NodeIsolation
from hai_cluster.protocol.runspec import RunSpec, SpecError
from hai_cluster.agent.runtimes import Context, inner
from hai_cluster.agent.runtimes.cache import unpack_cached
from hai_cluster.agent.runtimes.rootfs import RootfsError
from hai_cluster.agent.runtimes.runc import bundle_config
from hai_cluster.config import ConfigError, load_agent_config

HYBRID = """cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0
cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0
cgroup /sys/fs/cgroup/pids cgroup rw,relatime,pids 0 0
cgroup /sys/fs/cgroup/freezer cgroup rw,relatime,freezer 0 0
cgroup /sys/fs/cgroup/devices cgroup rw,relatime,devices 0 0
cgroup /sys/fs/cgroup/systemd cgroup rw,relatime,name=systemd 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
"""
COMOUNTED = "cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,nosuid,cpu,cpuacct 0 0\n"


def test_mounts_are_read_per_controller():
    assert cgroups.parse_mounts(HYBRID) == ("/sys/fs/cgroup/unified", {
        "cpu": "/sys/fs/cgroup/cpu", "memory": "/sys/fs/cgroup/memory", "pids": "/sys/fs/cgroup/pids",
        "freezer": "/sys/fs/cgroup/freezer", "devices": "/sys/fs/cgroup/devices"})
    assert cgroups.parse_mounts(COMOUNTED) == (None, {"cpu": "/sys/fs/cgroup/cpu,cpuacct"})
    assert cgroups.parse_mounts("cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n") == ("/sys/fs/cgroup", {})


def fake_v2(root: Path) -> str:
    """A pure v2 tree as the kernel shows it: the root offers memory, cpu and pids."""
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (root / "cgroup.subtree_control").write_text("")
    return f"cgroup2 {root} cgroup2 rw 0 0\n"


def test_pure_v2_gets_every_limit_from_v2(tmp_path, monkeypatch):
    root = tmp_path / "cg"
    mounts = fake_v2(root)
    real_makedirs = os.makedirs

    def makedirs(path, *a, **kw):  # the kernel fills each new cgroup dir with its files
        real_makedirs(path, *a, **kw)
        for f in ("cgroup.subtree_control", "cgroup.kill", "cgroup.freeze"):
            Path(path, f).touch()
    monkeypatch.setattr(cgroups.os, "makedirs", makedirs)
    monkeypatch.setattr(devcgroup, "v2_usable", lambda: True)  # the kernel's answer, not this machine's
    caps = cgroups.detect("hai/n1", mounts)
    assert caps.summary() == {"memory": "v2", "cpu": "v2", "pids": "v2", "kill": "v2", "freeze": "v2",
                              "devices": "v2"}
    assert (root / "cgroup.subtree_control").read_text() == "+pids"  # each one written in turn
    assert (root / "hai" / "n1" / "cgroup.subtree_control").read_text() == "+pids"
    cg = cgroups.RunCgroup(caps, "7.0")
    assert cg.path == "/hai/n1/7.0" and cg.dirs == {"v2": str(root / "hai/n1/7.0")}
    cg.create(mem_mb=100, cpus=3, pids=50)
    d = root / "hai/n1/7.0"
    assert (d / "memory.max").read_text() == str(100 << 20)
    assert (d / "memory.swap.max").read_text() == "0" and (d / "memory.oom.group").read_text() == "1"
    assert (d / "cpu.max").read_text() == "300000 100000" and (d / "pids.max").read_text() == "50"
    (d / "memory.events").write_text("low 0\nhigh 0\nmax 9\noom 1\noom_kill 2\n")
    assert cg.oom_kills() == 2
    assert cg.procs_files() == [str(d / "cgroup.procs")]
    assert cgroups.RunCgroup.from_record(cg.record()).dirs == cg.dirs


def test_v1_counts_members_and_oom_kills_in_cgroups_a_runtime_made_below_the_run(tmp_path):
    """podman's runc puts the container in <run>/libpod-<id>: its processes are the run's, and v1
    counts an OOM kill only in the victim's own cgroup (v2 propagates memory.events upwards)."""
    mem = tmp_path / "memory"
    caps = cgroups.Capabilities(parent="hai/n1", v2=None, v1={"memory": str(mem)},
                                features={"memory": "v1", "kill": "v1"})
    cg = cgroups.RunCgroup(caps, "7.0")
    run_dir = mem / "hai/n1/7.0"
    child = run_dir / "libpod-abc"
    child.mkdir(parents=True)
    (run_dir / "cgroup.procs").write_text("11\n")
    (run_dir / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 0\n")
    (child / "cgroup.procs").write_text("12\n13\n")
    (child / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 1\n")
    assert cg.members() == [11, 12, 13]
    assert cg.oom_kills() == 1


def test_no_cgroups_at_all_is_not_an_error():
    caps = cgroups.detect("hai/n1", "proc /proc proc rw 0 0\n")
    assert not caps.usable and caps.summary() == dict.fromkeys(cgroups.FEATURES)


BASE = {"job_id": 1, "attempt": 0, "rank": 0, "user": "u", "uid": 1000, "gid": 1000,
        "script": "#!/bin/sh\n", "script_args": [], "workdir": "/w", "stdout": "/w/o", "stderr": None,
        "environment": {}, "time_limit": None, "signal": None, "signal_time": 0, "grace": 1,
        "checkpoint_dir": None}


def test_runspec_isolation_fields_are_optional_and_checked():
    old = RunSpec.from_wire(dict(BASE))  # a controller that predates them
    assert (old.runtime, old.container_image, old.mem_mb, old.cpus, old.gpus) == (None, None, None, None, ())
    new = RunSpec.from_wire({**BASE, "runtime": "runc", "container_image": "/i", "mem_mb": 5, "cpus": 2,
                             "gpus": [3, 1]})
    assert new.gpus == (3, 1) and RunSpec.from_wire(new.to_wire()) == new
    for bad, message in [({"gpus": [1, 1]}, "lists a GPU twice"), ({"gpus": [-1]}, "GPU indices"),
                         ({"mem_mb": 0}, "mem_mb must be a positive"), ({"cpus": True}, "cpus must be"),
                         ({"runtime": "lxc"}, "spec.runtime must be one of"),
                         ({"runtime": "none", "container_image": "/i"}, "needs a container runtime"),
                         ({"runtime": "enroot"}, "needs a container_image"),
                         ({"container_image": "rel"}, "must be an absolute path"),
                         ({"surprise": 1}, "unknown field")]:
        with pytest.raises(SpecError, match=message):
            RunSpec.from_wire({**BASE, **bad})


def test_isolation_config(tmp_path):
    path = tmp_path / "agent.toml"
    path.write_text('[agent]\nname = "n"\nspool = "spool"\n[isolation]\ndefault_container_runtime = "runc"\n'
                    'device_dir = "fakedev"\npids_limit = 4096\ncgroup_parent = "jobs/hai"\n')
    cfg = load_agent_config(path).isolation
    assert cfg.default_container_runtime == "runc" and cfg.device_dir == str(tmp_path / "fakedev")
    assert cfg.pids_limit == 4096 and cfg.cgroup_parent == "jobs/hai" and cfg.default_runtime == "none"
    for body, message in [('default_runtime = "docker"', "default_runtime must be one of"),
                          ('default_container_runtime = "none"', "must be a container runtime"),
                          ('cgroup_parent = "../x"', "cgroup_parent must be \"auto\", \"self\" or a relative path"),
                          ("pids_limit = -1", "pids_limit must be >= 0"),
                          ('container_init = "tini"', "container_init must be"),
                          ("memory = 1", "unknown key")]:
        path.write_text(f'[agent]\nname = "n"\n[isolation]\n{body}\n')
        with pytest.raises(ConfigError, match=message):
            load_agent_config(path)


def tarball(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> int:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for info, data in members:
            tf.addfile(info, io.BytesIO(data) if data is not None else None)
    fd = os.memfd_create("tar")  # unpack_cached reads the fd twice (hash, then unpack)
    os.write(fd, buf.getvalue())
    return fd


def member(name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"", mode: int = 0o644, link: str = ""):
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.linkname, info.size = kind, mode, link, len(data) if kind == tarfile.REGTYPE else 0
    return info, data if kind == tarfile.REGTYPE else None


def test_unpacking_strips_privileges_and_never_follows_the_archives_links(tmp_path):
    fd = tarball([member("bin", tarfile.DIRTYPE, mode=0o755),
                  member("bin/tool", data=b"x", mode=0o4755),
                  member("bin/ls", tarfile.SYMTYPE, link="/bin/tool"),
                  member("bin/hard", tarfile.LNKTYPE, link="bin/tool"),
                  member("dev/sda", tarfile.BLKTYPE)])
    root = Path(unpack_cached(fd, "ok.tar", str(tmp_path / "cache")))
    assert stat.S_IMODE((root / "bin/tool").stat().st_mode) == 0o755  # no setuid
    assert os.readlink(root / "bin/ls") == "/bin/tool"  # absolute: resolved inside the container
    assert (root / "bin/hard").stat().st_ino == (root / "bin/tool").stat().st_ino
    assert not (root / "dev/sda").exists()
    assert unpack_cached(fd, "ok.tar", str(tmp_path / "cache")) == str(root)  # cached by content

    outside = tmp_path / "outside"
    outside.mkdir()
    for members in ([member("etc", tarfile.SYMTYPE, link=str(outside)), member("etc/passwd", data=b"pwned")],
                    [member("../escape", data=b"pwned")],
                    [member("x", tarfile.SYMTYPE, link=str(outside)), member("y", tarfile.LNKTYPE, link="x/f")]):
        with pytest.raises(RootfsError):
            unpack_cached(tarball(members), "evil.tar", str(tmp_path / "cache"))
    assert list(outside.iterdir()) == [] and not (tmp_path / "escape").exists()


def test_runc_bundle(tmp_path):
    devdir = tmp_path / "dev"
    devdir.mkdir()
    node = NodeIsolation(node="n", device_dir=str(devdir), container_init="/usr/bin/tini-static")
    spec = RunSpec.from_wire({**BASE, "runtime": "runc", "container_image": "/i", "gpus": [1],
                              "stdout": "/out/o", "checkpoint_dir": "/w/ckpt",
                              "environment": {"CUDA_VISIBLE_DEVICES": "1", "A": "b"}})
    ctx = Context(spec=spec, run_dir=tmp_path, node=node, groups=[1000, 27],
                  env={**spec.environment, "HAI_STEP_SOCKET": "/spool/step/step.sock", "PATH": "/usr/bin"},
                  script="/spool/runs/1.0/script", control="/spool/runs/1.0/control", cgroup_path="/hai/n/1.0")
    if os.geteuid() == 0:
        os.mknod(devdir / "nvidia1", 0o666 | stat.S_IFCHR, os.makedev(195, 1))
    cfg = bundle_config(ctx, "/run/1.0/rootfs", node.container_init)
    p = cfg["process"]
    assert p["user"] == {"uid": 1000, "gid": 1000, "additionalGids": [1000, 27]}
    assert p["args"] == ["/dev/init", "-g", "-p", "SIGKILL", "--", "/spool/runs/1.0/script"]
    # TINI_VERBOSITY=0: tini's warnings are not the job's output (runc.init_env)
    # srun and the step server in the image: the agent's socket and the launchers (runtimes/inner.py)
    assert sorted(p["env"]) == ["A=b", "CUDA_VISIBLE_DEVICES=0", "HAI_STEP_SOCKET=/.hai/step/step.sock",
                                "NVIDIA_VISIBLE_DEVICES=1", "PATH=/usr/bin:/.hai/bin", "TINI_VERBOSITY=0"]
    assert p["noNewPrivileges"] and all(v == [] for v in p["capabilities"].values())
    assert p["rlimits"][0]["type"] == "RLIMIT_NOFILE" and p["cwd"] == "/w"
    assert cfg["root"] == {"path": "/run/1.0/rootfs", "readonly": True}
    binds = {m["destination"]: m["options"][1] for m in cfg["mounts"] if m["type"] == "bind" and m["source"] != "/sys"}
    python = {inner.HOST + p: "ro" for p in inner.host_python().binds}
    assert binds == {"/dev/init": "ro", "/w": "rw", "/out": "rw", "/spool/runs/1.0/control": "ro",
                     "/spool/runs/1.0/script": "ro", "/.hai/bin": "ro", "/.hai/step": "ro",
                     **python}  # /w/ckpt is inside /w
    assert sorted(os.listdir(tmp_path / inner.BIN_DIR)) == ["hcontrol", "scontrol", "srun"]
    linux = cfg["linux"]
    assert linux["cgroupsPath"] == "/hai/n/1.0"
    assert linux["resources"]["devices"][0] == {"allow": False, "access": "rwm"}
    if os.geteuid() == 0:
        assert [d["path"] for d in linux["devices"]] == ["/dev/nvidia1"]
        assert linux["resources"]["devices"][1] == {"allow": True, "type": "c", "major": 195, "minor": 1,
                                                    "access": "rwm"}


def test_a_step_servers_devnull_output_binds_no_host_dev(tmp_path):
    """A step server's run writes to /dev/null: the host's /dev must not be bound over the
    container's own (it would show every device, and nodev makes /dev/null unopenable)."""
    from hai_cluster.agent.runtimes.common import job_binds
    node = NodeIsolation(node="n", device_dir=str(tmp_path))
    spec = RunSpec.from_wire({**BASE, "container_image": "/i", "stdout": "/dev/null", "stderr": None,
                              "step_server": True})
    ctx = Context(spec=spec, run_dir=tmp_path, node=node, groups=[1000], env={"HAI_STEP_SOCKET": "/s/step/step.sock"},
                  script="/spool/runs/1.0/script", control="/spool/runs/1.0/control", cgroup_path=None)
    dsts = [b.dst for b in job_binds(ctx)]
    assert not any(d == "/dev" or d.startswith("/dev/") for d in dsts) and spec.workdir in dsts
    assert {b.dst for b in job_binds(ctx) if b.ours} >= {inner.BIN, inner.STEP_DIR}


def test_the_node_python_runs_in_an_image_without_one(tmp_path):
    """inner.py's launcher, run as in a job's container: busybox has no Python and maybe an
    older C library; the node's interpreter is bound in and started through its own loader."""
    import shutil
    import subprocess
    from tests.integration.test_agent_containers import BUSYBOX, busybox_rootfs
    py = inner.host_python()
    assert set(py.search_path) and all(any(p == b or p.startswith(b + "/") for b in py.binds)
                                       for p in (*py.search_path, py.executable))
    interp = inner.elf_interpreter(py.executable)  # a dynamic interpreter names its loader
    assert interp is not None and os.path.isfile(interp) and os.path.realpath(interp) == py.loader
    assert inner.elf_interpreter(BUSYBOX) is None  # static
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        pytest.skip("bwrap is not installed (scripts/test installs it)")
    root = busybox_rootfs(tmp_path / "root")
    bins = inner.write_launchers(tmp_path)
    argv = [bwrap, "--bind", str(root), "/", "--proc", "/proc", "--dev", "/dev", "--ro-bind", bins, inner.BIN]
    for b in py.binds:
        argv += ["--ro-bind", b, inner.HOST + b]
    res = subprocess.run([*argv, "/bin/sh", "-c", f"{inner.BIN}/scontrol show hostnames 'n[1-2]'; readlink /bin/ls"],
                         capture_output=True, text=True, timeout=60)
    assert (res.returncode, res.stdout.split()) == (0, ["n1", "n2", "/bin/busybox"]), res.stderr
