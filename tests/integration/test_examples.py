"""The examples in examples/: their job scripts parse, and each training loop, preempted the way the
agent does it (notice in $HAI_CONTROL_DIR, then the signal), checkpoints and resumes exactly.

The agent path itself (as a real user, through a real shepherd) is tests/integration/
test_agent_preempt.py; here the examples run as plain subprocesses, so no root is needed.
torch_train.py needs torch, which is not a dependency of hai-cluster: scripts/test installs its CPU
build (scripts/lib/setup.sh: ensure_ml_clients); that test is skipped where torch is not importable.
"""
from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hai_cluster.agent import spool
from hai_cluster.core.jobscript import parse_submission

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


def env_for(tmp: Path, restart: int, job_id: int = 77) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HAI_", "SLURM_"))}
    control = tmp / f"control.{restart}"  # one per run, as the agent makes them
    control.mkdir(exist_ok=True)
    env.update(HAI_JOB_ID=str(job_id), HAI_RESTART_COUNT=str(restart), HAI_CONTROL_DIR=str(control),
               HAI_CHECKPOINT_DIR=str(tmp / "ckpt"), HAI_PREEMPT_SIGNAL=str(int(signal.SIGTERM)))
    return env


def log_lines(ckpt: Path) -> list[str]:
    try:
        return (ckpt / "steps.log").read_text().splitlines()
    except FileNotFoundError:
        return []


def wait_steps(proc: subprocess.Popen, ckpt: Path, n: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while len(log_lines(ckpt)) < n:
        if proc.poll() is not None:
            raise AssertionError(f"the job ended before step {n}: {proc.communicate()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"the job did not reach step {n}: {proc.communicate()}")
        time.sleep(0.05)


def preempt(proc: subprocess.Popen, env: dict[str, str], grace: float = 60) -> str:
    """What the shepherd does: the notice first, then the signal; the job must leave in its grace."""
    spool.write_notice(env["HAI_CONTROL_DIR"], "preempt", int(signal.SIGTERM), grace, time.time())
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=grace)
    assert proc.returncode == 0, err
    return out


def run_to_end(argv: list[str], env: dict[str, str]) -> str:
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.parametrize("name", ["train_loop.sh", "torch_train.sh", "hello.sh"])
def test_job_scripts_parse(name, tmp_path):
    path = EXAMPLES / name
    assert os.access(path, os.X_OK)
    sub = parse_submission(path.read_text(), [], cwd=str(tmp_path), env={"PATH": "/usr/bin"},
                           script_name=name)
    assert sub.spec.time_limit is not None
    if name != "hello.sh":
        assert sub.spec.grace >= 30 and sub.spec.requeue is not False


def test_train_loop_preempted_and_resumed(tmp_path):
    ckpt, total = tmp_path / "ckpt", 300
    script = str(EXAMPLES / "train_loop.py")
    env0 = env_for(tmp_path, 0)
    proc = subprocess.Popen([sys.executable, script, str(total), "0.05", "7"], env=env0,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_steps(proc, ckpt, 5)
    out0 = preempt(proc, env0)
    assert "told to stop: reason=preempt preempted=True" in out0
    k = len(log_lines(ckpt))
    out1 = run_to_end([sys.executable, script, str(total), "0", "7"], env_for(tmp_path, 1))
    assert f"resuming after step {k} " in out1
    assert log_lines(ckpt) == ([f"run=0 step={s}" for s in range(1, k + 1)]
                               + [f"run=1 step={s}" for s in range(k + 1, total + 1)])
    spec = importlib.util.spec_from_file_location("train_loop_example", script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert out1.rstrip().endswith(f"done: steps={total} value={mod.expected_value(total)} runs=2")


def _torch_importable() -> bool:
    probe = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(not _torch_importable(),
                    reason=f"torch is not importable by {sys.executable} (not a dependency of "
                           "hai-cluster; `pip install torch` to run this example test)")
def test_torch_train_resumes_exactly(tmp_path):
    total, every = 200, 25
    script = str(EXAMPLES / "torch_train.py")

    # one run, never interrupted
    whole = tmp_path / "whole"
    whole.mkdir()
    done_whole = run_to_end([sys.executable, script, str(total), "0", str(every)], env_for(whole, 0))
    final_whole = done_whole.strip().splitlines()[-1]
    assert final_whole.startswith(f"done: steps={total} loss=")

    # the same job preempted mid-way (slow steps, so it is surely mid-way), then resumed
    cut = tmp_path / "cut"
    cut.mkdir()
    env0 = env_for(cut, 0)
    proc = subprocess.Popen([sys.executable, script, str(total), "0.05", str(every)], env=env0,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_steps(proc, cut / "ckpt", every + 5)  # past a periodic checkpoint
    out0 = preempt(proc, env0)
    assert "told to stop: reason=preempt" in out0
    k = len(log_lines(cut / "ckpt"))
    assert every + 5 <= k < total
    done_cut = run_to_end([sys.executable, script, str(total), "0", str(every)], env_for(cut, 1))
    assert f"resuming after step {k} " in done_cut

    # same final loss and weights, bit for bit, and the same loss at every step
    assert done_cut.strip().splitlines()[-1] == final_whole.replace("runs=1", "runs=2")
    whole_steps = [line.split(" ", 1)[1] for line in log_lines(whole / "ckpt")]
    cut_lines = log_lines(cut / "ckpt")
    assert [line.split(" ", 1)[1] for line in cut_lines] == whole_steps
    assert [line.split(" ", 1)[0] for line in cut_lines] == ["run=0"] * k + ["run=1"] * (total - k)
