"""What an installed hai-cluster needs beyond its package: the Alembic migrations (data files of
the wheel) are found wherever the installer put them, not only beside a checkout or in sys.prefix
(pip install --user and --prefix put them elsewhere: "migrations/ directory is missing")."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_prefix_install_finds_its_migrations(tmp_path):
    # --ignore-installed: the running environment keeps its own hai-cluster (pip would uninstall it first)
    src = tmp_path / "src"  # a copy: an in-tree build would leave build/ in the checkout
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".venv", ".git", "tests", "*.egg-info", "build",
                                                             "__pycache__", "docs", "examples"))
    prefix = tmp_path / "prefix"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--ignore-installed",
                    "--prefix", str(prefix), str(src)], check=True, timeout=600, capture_output=True, text=True)
    site = next(prefix.glob("lib/python3*/site-packages"))
    shutil.rmtree(src)  # nothing of the source tree may serve
    out = subprocess.run(
        [sys.executable, "-c", "import hai_cluster, hai_cluster.store.engine as e; "
                               "print(hai_cluster.__file__); print(e._migrations_dir())"],
        env={**os.environ, "PYTHONPATH": str(site)}, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    package, migrations = out.stdout.split()
    assert package.startswith(str(site))
    assert Path(migrations) == prefix / "share" / "hai-cluster" / "migrations"
    assert (Path(migrations) / "versions" / "0024_reservations.py").exists()
