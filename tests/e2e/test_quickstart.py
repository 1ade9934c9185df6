"""The README's first command: a one-machine cluster that runs the example job to COMPLETED."""
import os
import subprocess
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_quickstart_runs_the_example_job():
    d = tempfile.mkdtemp(prefix="hai-qs-", dir="/tmp")
    env = {**os.environ, "HAI_DEV_DIR": d}
    try:
        proc = subprocess.run([str(REPO / "scripts" / "quickstart")], cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        out = proc.stdout
        assert "Submitted batch job 1" in out
        assert "COMPLETED" in out.split("== hacct -j 1")[1]
        assert "rank 0 of 2" in out and "rank 1 of 2" in out and "CUDA_VISIBLE_DEVICES=0,1" in out
    finally:
        subprocess.run([str(REPO / ".venv" / "bin" / "hai-dev"), "down", "--dir", d], capture_output=True)
        subprocess.run(["rm", "-rf", d])
