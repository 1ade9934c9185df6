"""The scheduling core stays pure: importing it must not pull in anything that does I/O,
and the CLI must not import the heavy server libraries."""
import subprocess
import sys
from pathlib import Path

import pytest

IO_MODULES = ["asyncio", "sqlalchemy", "asyncssh", "pynvml", "psutil", "socket", "subprocess"]


def loaded_after(imports: str) -> set[str]:
    code = f"import sys; {imports}; print('\\n'.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return set(out.split())


@pytest.mark.parametrize("module", ["hai_cluster.scheduling.registry", "hai_cluster.core.model",
                                    "hai_cluster.core.jobscript", "hai_cluster.core.resources",
                                    "hai_cluster.core.outcome", "hai_cluster.core.jobenv",
                                    "hai_cluster.scheduling.idle", "hai_cluster.config.idle"])
def test_core_and_scheduling_import_no_io(module):
    loaded = loaded_after(f"import {module}")
    assert not [m for m in IO_MODULES if m in loaded]


@pytest.mark.parametrize("module", ["hai_cluster.cli.hqueue", "hai_cluster.cli.hsubmit", "hai_cluster.cli.hcancel",
                                    "hai_cluster.cli.hinfo", "hai_cluster.cli.hacct", "hai_cluster.cli.hcontrol",
                                    "hai_cluster.cli.hstat",
                                    "hai_cluster.cli.hshare"])
def test_cli_does_not_import_server_libraries(module):
    loaded = loaded_after(f"import {module}")
    assert not [m for m in ("sqlalchemy", "asyncssh", "asyncio", "pynvml", "alembic") if m in loaded]


def test_hsubmit_imports_stay_light():
    """Every submission starts a Python process: hsubmit's import chain keeps off the modules that
    cost the most of its start (typing, dataclasses and the inspect they pull in; socket with enum
    and selectors; msgpack's package with datetime and collections; re)."""
    loaded = loaded_after("import hai_cluster.cli.hsubmit")
    heavy = ("typing", "dataclasses", "inspect", "click", "socket", "enum", "selectors", "msgpack", "datetime",
             "collections", "re")
    assert not [m for m in heavy if m in loaded]


def test_squeue_and_sacct_start_without_click():
    """Tools poll them all day: their common options are parsed without click (cli/fastargs.py),
    nor do they import what only another column or -s needs (the sharing model, hqueue)."""
    for module in ("hai_cluster.cli.squeue", "hai_cluster.cli.sacct"):
        loaded = loaded_after(f"import {module}")
        assert not [m for m in ("click", "hai_cluster.core.model", "hai_cluster.cli.hqueue", "hai_cluster.cli.hacct")
                    if m in loaded], module


def test_cli_launchers_import_only_their_command():
    """bin/: the user commands' launchers (not pip's console_scripts wrapper, which imports re)."""
    bin_dir = Path(__file__).resolve().parents[2] / "bin"
    for launcher in sorted(bin_dir.iterdir()):
        lines = [ln for ln in launcher.read_text().splitlines() if ln and not ln.startswith("#")]
        assert lines == [f"from hai_cluster.cli.{launcher.name} import main", "raise SystemExit(main())"]
