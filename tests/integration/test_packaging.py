"""What an installed hai-cluster needs beyond its package: the Alembic migrations (data files of
the wheel) are found wherever the installer put them, not only beside a checkout or in sys.prefix
(pip install --user and --prefix put them elsewhere: "migrations/ directory is missing"); and the
versions of everything it requires are pinned in conf/constraints.txt, which the installs use."""
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


def _constraints():
    import importlib.util
    spec = importlib.util.spec_from_file_location("constraints", ROOT / "scripts" / "lib" / "constraints.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_constraints_pin_every_run_time_dependency():
    """conf/constraints.txt pins each package that setup.cfg's install_requires (and the postgres and
    plot extras) need, transitively, at the version this venv runs (scripts/test installs it with -c)."""
    import configparser

    c = _constraints()
    pins = c.pins((ROOT / "conf" / "constraints.txt").read_text())
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    declared = [line for line in cfg["options"]["install_requires"].splitlines() if line.strip()]
    for extra in c.EXTRAS:
        declared += [line for line in cfg["options.extras_require"][extra].splitlines() if line.strip()]
    names = {c.canonical(c.Requirement(line).name) for line in declared}
    assert names - set(pins) == set(), "setup.cfg declares these, conf/constraints.txt does not pin them"
    resolved = {k: v for k, (v, _) in c.closure().items()}
    assert set(resolved) >= names  # the closure starts from what setup.cfg says
    regenerate = "regenerate: .venv/bin/python scripts/lib/constraints.py > conf/constraints.txt"
    assert pins == resolved, f"conf/constraints.txt differs from this venv's stack; {regenerate}"
    assert "hai-cluster" not in pins
