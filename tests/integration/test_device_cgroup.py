"""The GPU device nodes of cards a run was not given are refused in its cgroup (devcgroup): with
the kernel's own checks, on a real cgroup of this machine. Fake nvidiaN nodes (195:N, as the driver
makes them) tell the two answers apart: a node the cgroup allows opens to ENXIO (no driver here),
one it refuses gives EPERM before the driver is asked."""
from __future__ import annotations

import errno
import os
import secrets
import stat
from pathlib import Path

import pytest

from hai_cluster.agent import cgroups, devcgroup

from .agent_helpers import need_root

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def mounts() -> tuple[str | None, dict[str, str]]:
    with open("/proc/self/mounts") as f:
        return cgroups.parse_mounts(f.read())


@pytest.fixture
def gpu_dir(tmp_path):
    for i in range(3):
        os.mknod(tmp_path / f"nvidia{i}", 0o666 | stat.S_IFCHR, os.makedev(195, i))
    os.mknod(tmp_path / "nvidiactl", 0o666 | stat.S_IFCHR, os.makedev(195, 255))
    os.symlink("/dev/null", tmp_path / "nvidia7")  # a link is no device node of ours
    (tmp_path / "nvidia8").write_text("")
    return tmp_path


def open_errors(cgroup_procs: str, paths: list[Path]) -> list[str]:
    """In a child moved into the cgroup: each path's open error name ("" if it opened)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            with open(cgroup_procs, "w") as f:
                f.write("0")
            out = []
            for p in paths:
                try:
                    os.close(os.open(p, os.O_RDWR))
                    out.append("")
                except OSError as exc:
                    out.append(errno.errorcode[exc.errno])
            os.write(w, ",".join(out).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        text = f.read()
    os.waitpid(pid, 0)
    return text.split(",")


def test_the_other_cards_are_found_by_their_device_numbers(gpu_dir):
    assert devcgroup.gpu_nodes(str(gpu_dir)) == {0: (195, 0), 1: (195, 1), 2: (195, 2)}
    assert devcgroup.others(str(gpu_dir), [1]) == [(195, 0), (195, 2)]
    assert devcgroup.others(str(gpu_dir / "none"), []) == []


def test_the_program_is_one_check_per_refused_node():
    assert len(devcgroup.deny_program([])) == 7 * 8
    assert len(devcgroup.deny_program([(195, 0), (195, 2), (195, 0)])) == (7 + 2 * 4) * 8


@pytest.mark.parametrize("hierarchy", ["v2", "v1"])
def test_a_run_cgroup_opens_only_its_own_cards(gpu_dir, hierarchy):
    need_root()
    v2, v1 = mounts()
    if hierarchy == "v2" and not (v2 and devcgroup.v2_usable()):
        pytest.skip("no cgroup v2 with device programs here")
    if hierarchy == "v1" and "devices" not in v1:
        pytest.skip("no cgroup v1 devices controller here")
    parent = f"haitest-dev-{secrets.token_hex(4)}"
    caps = cgroups.Capabilities(parent=parent, v2=v2 if hierarchy == "v2" else None,
                                v1={"devices": v1["devices"]} if hierarchy == "v1" else {},
                                features={"devices": hierarchy})
    root = v2 if hierarchy == "v2" else v1["devices"]
    os.mkdir(os.path.join(root, parent))
    cg = cgroups.RunCgroup(caps, "7.0")
    try:
        cg.create(None, None, None)
        assert cg.restrict_devices(devcgroup.others(str(gpu_dir), [1]))
        nodes = [gpu_dir / n for n in ("nvidia0", "nvidia1", "nvidia2", "nvidiactl")]
        assert open_errors(cg.procs_files()[0], nodes) == ["EPERM", "ENXIO", "EPERM", "ENXIO"]
        # /dev/null and friends are untouched
        assert open_errors(cg.procs_files()[0], [Path("/dev/null"), Path("/dev/zero")]) == ["", ""]
    finally:
        cg.remove()
        os.rmdir(os.path.join(root, parent))


def test_nothing_to_refuse_attaches_nothing(tmp_path):
    caps = cgroups.Capabilities(parent="p", v2=str(tmp_path), features={})  # no devices feature
    cg = cgroups.RunCgroup(caps, "1.0")
    assert not cg.restrict_devices([(195, 0)])
    assert not cg.restrict_devices([])
