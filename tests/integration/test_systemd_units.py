"""conf/hai-controller.service (with its .socket) and conf/hai-agent.service pass `systemd-analyze
verify` without a warning, and say what operations rely on: Type=notify with a watchdog, restart on
failure, and for the agent KillMode=process + Delegate=yes (restarting the agent never kills jobs).
The controller runs as the user hai in a sandbox whose `systemd-analyze security` exposure is
under 3; the agent stays root and has nothing its jobs would inherit to their harm.

verify wants ExecStart's binary to exist: each unit is checked as a temp copy whose ExecStart
names this venv's console script instead of /opt/hai-cluster/venv/bin/...; nothing else changes.
PID 1 is not systemd here: the exposure comes from `systemd-analyze security --offline=true`."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.infra.fixtures import require_binaries

REPO = Path(__file__).resolve().parents[2]
INSTALLED_BIN = "/opt/hai-cluster/venv/bin"
UNITS = {"hai-controller": "/etc/hai/controller.toml", "hai-agent": "/etc/hai/agent.toml"}


def directives(path: Path) -> dict[str, dict[str, str]]:
    """{section: {key: value}}; a key given on several lines (SystemCallFilter=) has them joined
    by newlines, as systemd adds them up."""
    out: dict[str, dict[str, str]] = {}
    section = None
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            section = out.setdefault(line.strip("[]"), {})
            continue
        key, _, value = line.partition("=")
        assert section is not None and _, f"{path}: not a directive: {line!r}"
        section[key] = f"{section[key]}\n{value}" if key in section else value
    return out


@pytest.mark.parametrize("unit", sorted(UNITS))
def test_unit_verifies_cleanly(unit, tmp_path):
    require_binaries("systemd unit verification", ["systemd-analyze"])
    text = (REPO / "conf" / f"{unit}.service").read_text()
    exec_start = f"ExecStart={INSTALLED_BIN}/{unit} --config {UNITS[unit]}"
    assert exec_start in text.splitlines()  # what install-controller / install-node put there
    local = Path(sys.executable).parent / unit
    assert local.exists(), f"{local}: the console script is missing (pip install -e .)"
    copy = tmp_path / f"{unit}.service"
    copy.write_text(text.replace(f"{INSTALLED_BIN}/{unit}", str(local)))
    files = [copy]
    if (REPO / "conf" / f"{unit}.socket").exists():  # the controller's: its service Requires= it
        files.append(tmp_path / f"{unit}.socket")
        shutil.copy(REPO / "conf" / f"{unit}.socket", files[-1])
    proc = subprocess.run([shutil.which("systemd-analyze"), "verify", *map(str, files)], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "" and proc.stderr.strip() == "", proc.stdout + proc.stderr  # no warnings


def test_units_declare_notify_watchdog_and_restart():
    for unit in UNITS:
        service = directives(REPO / "conf" / f"{unit}.service")["Service"]
        assert service["Type"] == "notify", unit
        assert service["NotifyAccess"] == "main", unit
        assert int(service["WatchdogSec"]) >= 30, unit  # decide() may hold the loop ~1.4 s at 10k jobs
        assert service["Restart"] == "on-failure", unit


def test_agent_unit_never_kills_jobs():
    service = directives(REPO / "conf" / "hai-agent.service")["Service"]
    assert service["KillMode"] == "process"
    assert service["Delegate"] == "yes"


def test_a_broken_directive_would_be_caught(tmp_path):
    """The check above is only worth something if verify complains about a bad unit."""
    require_binaries("systemd unit verification", ["systemd-analyze"])
    text = (REPO / "conf" / "hai-agent.service").read_text()
    copy = tmp_path / "broken.service"
    copy.write_text(text.replace(f"{INSTALLED_BIN}/hai-agent", str(Path(sys.executable).parent / "hai-agent"))
                    .replace("WatchdogSec=60", "WatchdogSec=soon"))
    proc = subprocess.run(["systemd-analyze", "verify", str(copy)], capture_output=True, text=True)
    assert "WatchdogSec" in proc.stderr or "Failed to parse" in proc.stderr


def exposure(unit: Path) -> float:
    """The `Overall exposure level` systemd-analyze security gives the unit file (0 safe, 10 unsafe)."""
    require_binaries("systemd unit security", ["systemd-analyze"])
    proc = subprocess.run(["systemd-analyze", "security", "--offline=true", "--no-pager", str(unit)],
                          capture_output=True, text=True)
    lines = [line for line in proc.stdout.splitlines() if "Overall exposure level for" in line]
    assert len(lines) == 1, proc.stdout + proc.stderr
    return float(lines[0].split(":", 1)[1].split()[0])


def test_controller_runs_as_hai_with_exposure_under_3():
    unit = REPO / "conf" / "hai-controller.service"
    service = directives(unit)["Service"]
    assert service["User"] == service["Group"] == "hai"
    assert service["StateDirectory"] == "hai" and service["StateDirectoryMode"] == "0700"
    assert "RuntimeDirectory" not in service  # /run/hai stays root's: the socket unit makes the socket
    assert exposure(unit) < 3
    # What it needs stays: notify + watchdog (above), Unix and IP sockets, no PrivateUsers (SO_PEERCRED).
    assert service["RestrictAddressFamilies"].split() == ["AF_UNIX", "AF_INET", "AF_INET6"]
    assert "PrivateUsers" not in service and "PrivateNetwork" not in service
    assert service["ProtectHome"] == "read-only"  # outputcheck reads users' directories' modes


def test_controller_socket_is_the_users_socket():
    from hai_cluster.paths import DEFAULT_CONTROLLER_SOCKET

    sock = directives(REPO / "conf" / "hai-controller.socket")["Socket"]
    assert sock["ListenStream"] == DEFAULT_CONTROLLER_SOCKET
    assert f'socket = "{DEFAULT_CONTROLLER_SOCKET}"' in (REPO / "conf" / "controller.toml").read_text()
    assert sock["SocketMode"] == "0666" and "Accept" not in sock  # anyone connects; one controller serves
    assert "hai-controller.socket" in directives(REPO / "conf" / "hai-controller.service")["Unit"]["Requires"]


# What the agent must not have: each reaches its jobs (they live in its cgroup and inherit its
# seccomp filters, bounding set, namespaces and no_new_privs) or stops its own work. ProtectClock
# is here for its implied DeviceAllow=char-rtc, a device allow-list that would hide the GPUs.
AGENT_NEVER = ("ProtectClock", "PrivateDevices", "DevicePolicy", "DeviceAllow", "ProtectKernelModules",
               "ProtectKernelTunables", "ProtectControlGroups", "ProtectKernelLogs", "NoNewPrivileges",
               "RestrictSUIDSGID", "ProtectSystem", "ProtectHome", "PrivateTmp", "PrivateMounts",
               "RestrictNamespaces", "SystemCallFilter", "SystemCallArchitectures", "MemoryDenyWriteExecute",
               "RestrictAddressFamilies", "CapabilityBoundingSet", "PrivateUsers", "PrivateNetwork", "User")


def test_agent_stays_root_hardened_only_where_jobs_keep_working():
    unit = REPO / "conf" / "hai-agent.service"
    service = directives(unit)["Service"]
    assert [d for d in AGENT_NEVER if d in service] == []
    assert service["RestrictRealtime"] == service["LockPersonality"] == "yes"
    text = unit.read_text()
    assert all(f"{d}=" in text for d in AGENT_NEVER if d not in ("DeviceAllow", "User")), \
        "each omitted directive is named in the unit with the reason"
    assert exposure(unit) > 9  # root, by design: the number the docs give
