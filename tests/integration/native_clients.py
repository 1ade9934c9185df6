"""The compiled front ends of a Python client (squeue.c, sacct.c) as their tests build them."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from hai_cluster.native.build import is_compiled

from .test_native_hsubmit import build

NATIVE = Path(__file__).parents[2] / "hai_cluster" / "native"
NO_PYTHON = "/nonexistent/python"


def front_end_builds(name: str) -> Iterator[dict[str, Path]]:
    """{"c": the compiled NAME, "py": the Python one's launcher, "nopy": the C one with no Python
    behind it (what it prints, the controller rendered)}, where the test users reach them; the
    directory goes afterwards (a generator for a module fixture)."""
    cc = os.environ.get("CC") or "cc"
    if not shutil.which(cc):
        pytest.skip("no C compiler")
    d = Path(tempfile.mkdtemp(prefix=f"hai-native-{name}-", dir="/tmp"))
    os.chmod(d, 0o755)
    proc = build(d, CFLAGS="-O2 -Wall -Wextra -Werror")
    assert proc.returncode == 0, proc.stderr
    assert f"built {d / name} (C)" in proc.stdout
    assert is_compiled(d / name)
    py = d / "py" / name  # bin/NAME, the launcher setup.cfg installs (named so: click prints the name)
    py.parent.mkdir(mode=0o755)
    py.write_text(f"#!{sys.executable}\nfrom hai_cluster.cli.{name} import main\nraise SystemExit(main())\n")
    py.chmod(0o755)
    nopy = d / "nopy" / name
    nopy.parent.mkdir(mode=0o755)
    subprocess.run([cc, "-O2", f'-DHAI_PYTHON="{NO_PYTHON}"', "-o", str(nopy), str(NATIVE / f"{name}.c")],
                   check=True)
    try:
        yield {"c": d / name, "py": py, "nopy": nopy}
    finally:
        shutil.rmtree(d, ignore_errors=True)
