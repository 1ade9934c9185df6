"""conf/hai-controller.service and conf/hai-agent.service pass `systemd-analyze verify` without a
warning, and say what operations rely on: Type=notify with a watchdog, restart on failure, and for
the agent KillMode=process + Delegate=yes (restarting the agent never kills jobs).

verify wants ExecStart's binary to exist: each unit is checked as a temp copy whose ExecStart
names this venv's console script instead of /opt/hai-cluster/venv/bin/...; nothing else changes."""
from __future__ import annotations

import configparser
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
    parser = configparser.ConfigParser(strict=True, interpolation=None, comment_prefixes=("#", ";"))
    parser.optionxform = str  # keys are case-sensitive in units
    parser.read_string(path.read_text())
    return {s: dict(parser[s]) for s in parser.sections()}


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
    proc = subprocess.run([shutil.which("systemd-analyze"), "verify", str(copy)], capture_output=True, text=True)
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
