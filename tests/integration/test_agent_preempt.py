"""The checkpoint protocol through a real hai-agent: the notice in the run's control dir comes
before the signal, examples/train_loop.py (as the user haitest, with hai_cluster.job) checkpoints
and leaves within its grace, its next attempt resumes with no step lost or repeated; a job that
ignores the signal is SIGKILLed after the grace; cancel and timeout leave a terminate notice."""
from __future__ import annotations

import importlib.util
import json
import os
import signal
import stat
import sys
import time
from pathlib import Path

import pytest

from hai_cluster.agent import spool

from .agent_helpers import Sandbox, async_wait_for, client, group_alive, read_when, run, run_to_end

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

REPO = Path(__file__).resolve().parents[2]
TRAIN_LOOP = REPO / "examples" / "train_loop.py"


def train_loop_module():
    spec = importlib.util.spec_from_file_location("train_loop_example", TRAIN_LOOP)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def key(spec: dict, **more) -> dict:
    return {"job_id": spec["job_id"], "attempt": spec["attempt"], **more}


def run_dir(box: Sandbox, spec: dict) -> Path:
    return spool.runs_dir(box.spool) / spool.run_dir_name(spec["job_id"], spec["attempt"])


def job_spec(box: Sandbox, script: str, job_id: int, attempt: int, ckpt: Path, **over) -> dict:
    """A spec as the controller sends it: the job's variables are in its environment."""
    env = {"PATH": "/usr/bin:/bin", "HAI_JOB_ID": str(job_id), "HAI_RESTART_COUNT": str(attempt),
           "HAI_CHECKPOINT_DIR": str(ckpt), "HAI_PREEMPT_SIGNAL": str(int(over.get("signal") or 15))}
    return box.spec(script, job_id=job_id, attempt=attempt, checkpoint_dir=str(ckpt),
                    environment=env, **over)


def train_script(steps: int, step_seconds: float, every: int) -> str:
    # No exec: the shell dies of the SIGTERM at once, and Python must still get its grace period.
    return ("#!/bin/sh\n"
            'echo "control=$HAI_CONTROL_DIR"\n'
            "stat -c 'control-dir %U %a' \"$HAI_CONTROL_DIR\"\n"
            f"{sys.executable} {TRAIN_LOOP} {steps} {step_seconds} {every}\n")


def steps_log(ckpt: Path) -> list[tuple[int, int]]:
    try:
        text = (ckpt / "steps.log").read_text()
    except FileNotFoundError:
        return []
    out = []
    for line in text.splitlines():
        r, s = line.split()
        out.append((int(r.removeprefix("run=")), int(s.removeprefix("step="))))
    return out


async def steps_reach(ckpt: Path, n: int, timeout: float = 60.0) -> None:
    await async_wait_for(lambda: len(steps_log(ckpt)) >= n, timeout, f"{n} steps in {ckpt}/steps.log")


_ids = iter(range(9000, 10000))


def test_preempted_job_checkpoints_in_its_grace_and_resumes_where_it_stopped(agent):
    box = agent.box
    job_id, total = next(_ids), 200
    ckpt = box.work / "ckpt" / str(job_id)
    # slow steps while we preempt it (200 x 0.1 s: it cannot finish first), fast ones after
    first = job_spec(box, train_script(total, 0.1, 7), job_id, 0, ckpt, grace=60)
    second = job_spec(box, train_script(total, 0.002, 7), job_id, 1, ckpt, grace=60)

    async def body():
        async with client(agent) as c:
            pid = (await c.call("start_run", {"spec": first}))["status"]["pid"]
            await steps_reach(ckpt, 10)
            asked = time.time()
            assert await c.call("terminate_run", key(first, reason="preempt")) == {"found": True}
            ended = await c.exited(job_id, 0, timeout=90)
            notices = sorted(os.listdir(run_dir(box, first) / spool.CONTROL))
            notice = json.loads((run_dir(box, first) / spool.CONTROL / "preempt").read_text())
            log_after_first = steps_log(ckpt)
            saved = json.loads((ckpt / "state.json").read_text())
            assert (await c.call("start_run", {"spec": second}))["started"]
            ended2 = await c.exited(job_id, 1, timeout=90)
            return pid, asked, ended, notices, notice, log_after_first, saved, ended2

    pid, asked, ended, notices, notice, first_log, saved, ended2 = run(body())
    out = Path(first["stdout"]).read_text()

    # the run ended by itself within its grace: checkpointed in time
    assert ended["reason"] == "preempt" and ended["killed"] is False, out
    assert ended["signal"] == signal.SIGTERM  # the shell died of it; Python saved and exited 0
    assert not group_alive(pid)
    # the notice, as the job saw it: in $HAI_CONTROL_DIR, before the signal
    control = run_dir(box, first) / spool.CONTROL
    assert f"control={control}\n" in out and "control-dir root 755\n" in out
    assert notices == ["preempt"]
    assert notice["reason"] == "preempt" and notice["signal"] == signal.SIGTERM and notice["grace"] == 60
    assert asked - 5 <= notice["time"] <= time.time() and notice["deadline"] == notice["time"] + 60
    assert (f"told to stop: reason=preempt preempted=True cancelled=False "
            f"deadline={notice['deadline']}") in out
    assert "will be resumed" in out
    st = os.stat(control)
    assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o755

    # the checkpoint holds the last executed step: nothing to repeat
    k = first_log[-1][1]
    assert first_log == [(0, s) for s in range(1, k + 1)]
    assert 10 <= k < total and saved["step"] == k

    # attempt 1 resumed after step k and finished: every step exactly once
    assert ended2["exit_code"] == 0 and ended2["reason"] is None and ended2["killed"] is False
    assert steps_log(ckpt) == first_log + [(1, s) for s in range(k + 1, total + 1)]
    expected = train_loop_module().expected_value(total)
    assert f"run=1 job={job_id} resuming after step {k} " in out + Path(second["stdout"]).read_text()
    assert Path(second["stdout"]).read_text().rstrip().endswith(
        f"done: steps={total} value={expected} runs=2")


def test_a_job_ignoring_the_signal_is_killed_after_its_grace_with_the_notice_present(agent):
    box = agent.box
    job_id = next(_ids)
    ckpt = box.work / "ckpt" / str(job_id)
    script = ("#!/bin/sh\ntrap '' TERM\n"
              "echo ready > ready-$HAI_JOB_ID\n"
              'while [ ! -e "$HAI_CONTROL_DIR/preempt" ]; do sleep 0.1; done\n'
              'cat "$HAI_CONTROL_DIR/preempt" > seen-$HAI_JOB_ID\n'
              "while :; do sleep 0.1; done\n")
    spec = job_spec(box, script, job_id, 0, ckpt, grace=2)

    async def body():
        async with client(agent) as c:
            pid = (await c.call("start_run", {"spec": spec}))["status"]["pid"]
            await read_when(box.work / f"ready-{job_id}", "ready")
            await c.call("terminate_run", key(spec, reason="preempt"))
            return pid, await c.exited(job_id, 0, timeout=60)

    pid, ended = run(body())
    assert ended["reason"] == "preempt" and ended["killed"] is True
    assert ended["signal"] == signal.SIGKILL
    assert ended["end_time"] - ended["start_time"] >= 2  # the grace was granted
    assert not group_alive(pid)
    notice = json.loads((run_dir(box, spec) / spool.CONTROL / "preempt").read_text())
    assert notice["reason"] == "preempt" and notice["grace"] == 2
    seen = json.loads((box.work / f"seen-{job_id}").read_text())  # the job could read it
    assert seen == notice


def test_cancel_leaves_a_terminate_notice_not_a_preempt_one(agent):
    box = agent.box
    job_id = next(_ids)
    ckpt = box.work / "ckpt" / str(job_id)
    spec = job_spec(box, train_script(1000, 0.1, 5), job_id, 0, ckpt, grace=60)

    async def body():
        async with client(agent) as c:
            await c.call("start_run", {"spec": spec})
            await steps_reach(ckpt, 3)
            await c.call("terminate_run", key(spec, reason="cancel"))
            return await c.exited(job_id, 0, timeout=90)

    ended = run(body())
    out = Path(spec["stdout"]).read_text()
    assert ended["reason"] == "cancel" and ended["killed"] is False, out
    control = run_dir(box, spec) / spool.CONTROL
    assert sorted(os.listdir(control)) == ["terminate"]
    notice = json.loads((control / "terminate").read_text())
    assert notice["reason"] == "cancel" and notice["signal"] == signal.SIGTERM
    assert "reason=cancel preempted=False cancelled=True" in out
    assert "will be resumed" not in out


def test_time_limit_leaves_a_terminate_notice(agent):
    box = agent.box
    job_id = next(_ids)
    script = ("#!/bin/sh\n"
              "trap 'cat \"$HAI_CONTROL_DIR/terminate\" > got-$HAI_JOB_ID; exit 0' TERM\n"
              "while :; do sleep 0.1; done\n")
    spec = job_spec(box, script, job_id, 0, box.work / "ckpt" / str(job_id), time_limit=1, grace=30)

    ended = run_to_end(agent, spec)
    assert ended["reason"] == "timeout" and ended["killed"] is False and ended["exit_code"] == 0
    got = json.loads((box.work / f"got-{job_id}").read_text())
    assert got["reason"] == "timeout" and got["signal"] == signal.SIGTERM and got["grace"] == 30
    assert sorted(os.listdir(run_dir(box, spec) / spool.CONTROL)) == ["terminate"]


def test_the_preempt_signal_is_the_jobs_own(agent):
    """--signal=USR1: the notice names it, the job gets it, the library handles it (not SIGTERM)."""
    box = agent.box
    job_id = next(_ids)
    ckpt = box.work / "ckpt" / str(job_id)
    spec = job_spec(box, train_script(1000, 0.1, 50), job_id, 0, ckpt, grace=60,
                    signal=int(signal.SIGUSR1))

    async def body():
        async with client(agent) as c:
            await c.call("start_run", {"spec": spec})
            await steps_reach(ckpt, 3)
            await c.call("terminate_run", key(spec, reason="requeue"))
            return await c.exited(job_id, 0, timeout=90)

    ended = run(body())
    out = Path(spec["stdout"]).read_text()
    assert ended["reason"] == "requeue" and ended["killed"] is False, out
    notice = json.loads((run_dir(box, spec) / spool.CONTROL / "preempt").read_text())
    assert notice["reason"] == "requeue" and notice["signal"] == signal.SIGUSR1
    assert "reason=requeue preempted=True" in out
    assert json.loads((ckpt / "state.json").read_text())["step"] == steps_log(ckpt)[-1][1]
