"""Job runs through a real hai-agent: output, environment, exit codes, terminate, grace, time
limits, signals, launch failures, forget. Jobs run as the non-root user haitest."""
from __future__ import annotations

import asyncio
import os
import signal
import stat

import pytest

from hai_cluster.agent import spool
from hai_cluster.transport.rpc import RpcError

from .agent_helpers import client, group_alive, read_when, run, run_to_end

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

LOOP = "while :; do sleep 0.1; done\n"


def key(spec: dict, **more) -> dict:
    return {"job_id": spec["job_id"], "attempt": spec["attempt"], **more}


def test_output_environment_and_exit_code(agent):
    box = agent.box
    script = ("#!/bin/sh\n"
              'echo "hello $GREETING"\n'
              'echo "uid=$(id -u) cwd=$(pwd) args=$*"\n'
              "echo ENV-BEGIN; tr '\\0' '\\n' < /proc/$$/environ; echo ENV-END\n"
              "echo to-stderr >&2\n"
              "exit 3\n")
    spec = box.spec(script, script_args=["a b", "c"])
    spec["environment"]["GREETING"] = "world"

    async def body():
        async with client(agent) as c:
            reply = await c.call("start_run", {"spec": spec})
            assert reply["started"] is True
            assert reply["status"]["state"] == "running" and reply["status"]["pid"] > 0
            ended = await c.exited(spec["job_id"])
            listed = (await c.call("list_runs", {}))["runs"]
            hello = await c.call("hello", {"controller": "test"})
        return ended, listed, hello

    ended, listed, hello = run(body())
    assert ended["state"] == "ended" and ended["exit_code"] == 3
    assert ended["signal"] is None and ended["reason"] is None and ended["killed"] is False
    assert ended["end_time"] >= ended["start_time"]
    assert [r for r in listed if r["job_id"] == spec["job_id"]] == [ended]
    assert ended in hello["runs"]
    out = spec["stdout"]
    text = open(out).read()
    assert "hello world\n" in text
    assert f"uid={box.user.pw_uid} cwd={box.work} args=a b c\n" in text
    assert "to-stderr\n" in text  # stderr None: same file as stdout
    env = text.split("ENV-BEGIN\n")[1].split("ENV-END\n")[0].splitlines()
    # Exactly the spec's environment, plus what the agent adds: the run's control dir, srun's socket.
    control = spool.runs_dir(box.spool) / f"{spec['job_id']}.0" / "control"
    assert sorted(env) == sorted([*(f"{k}={v}" for k, v in spec["environment"].items()),
                                  f"HAI_CONTROL_DIR={control}", f"HAI_STEP_SOCKET={spool.step_socket(box.spool)}"])
    st = os.stat(out)
    assert (st.st_uid, st.st_gid) == (box.user.pw_uid, box.user.pw_gid)


def test_stderr_file_checkpoint_dir_and_append_on_requeue(agent):
    box = agent.box
    ckpt = box.work / "ckpt" / "job"
    spec = box.spec('#!/bin/sh\necho "out $HAI_RESTART_COUNT"; echo "err $HAI_RESTART_COUNT" >&2\n',
                    checkpoint_dir=str(ckpt))
    spec["stderr"] = str(box.work / f"job-{spec['job_id']}.err")

    async def body():
        async with client(agent) as c:
            for attempt in (0, 1):
                s = dict(spec, attempt=attempt, environment={**spec["environment"],
                                                             "HAI_RESTART_COUNT": str(attempt)})
                assert (await c.call("start_run", {"spec": s}))["started"]
                assert (await c.exited(spec["job_id"], attempt))["exit_code"] == 0

    run(body())
    assert open(spec["stdout"]).read() == "out 0\nout 1\n"  # attempt 1 appended
    assert open(spec["stderr"]).read() == "err 0\nerr 1\n"
    st = os.stat(ckpt)
    assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == box.user.pw_uid


def test_start_twice_starts_once(agent):
    box = agent.box
    spec = box.spec("#!/bin/sh\necho started >> count-$HAI_JOB_ID\nexec sleep 60\n")
    count = box.work / f"count-{spec['job_id']}"

    async def body():
        async with client(agent) as c:
            replies = await asyncio.gather(*(c.call("start_run", {"spec": spec}) for _ in range(3)))
            again = await c.call("start_run", {"spec": spec})
            await read_when(count, "started")
            assert (await c.call("terminate_run", key(spec, reason="cancel"))) == {"found": True}
            ended = await c.exited(spec["job_id"])
            return replies + [again], ended

    replies, ended = run(body())
    assert sorted(r["started"] for r in replies) == [False, False, False, True]
    assert len({r["status"]["pid"] for r in replies}) == 1
    assert count.read_text() == "started\n"
    assert ended["reason"] == "cancel"


def test_cancel_ends_the_whole_process_group(agent):
    box = agent.box
    spec = box.spec("#!/bin/sh\nsleep 300 &\necho $! > child-$HAI_JOB_ID\nwait\n")
    child_file = box.work / f"child-{spec['job_id']}"

    async def body():
        async with client(agent) as c:
            pid = (await c.call("start_run", {"spec": spec}))["status"]["pid"]
            child = int(await read_when(child_file, "\n"))
            assert group_alive(pid) and spool.proc_starttime(child) is not None
            assert await c.call("terminate_run", key(spec, reason="cancel")) == {"found": True}
            ended = await c.exited(spec["job_id"])
            again = await c.call("terminate_run", key(spec, reason="cancel"))
            unknown = await c.call("terminate_run", {"job_id": 999999, "attempt": 0, "reason": "cancel"})
            return pid, child, ended, again, unknown

    pid, child, ended, again, unknown = run(body())
    assert ended["reason"] == "cancel" and ended["signal"] == signal.SIGTERM and ended["killed"] is False
    assert ended["exit_code"] is None
    assert again == {"found": True} and unknown == {"found": False}
    assert not group_alive(pid)
    assert spool.proc_starttime(child) is None


def test_job_ignoring_sigterm_is_killed_after_grace(agent):
    box = agent.box
    spec = box.spec("#!/bin/sh\ntrap '' TERM\necho ready > ready-$HAI_JOB_ID\n" + LOOP, grace=1)

    async def body():
        async with client(agent) as c:
            pid = (await c.call("start_run", {"spec": spec}))["status"]["pid"]
            await read_when(box.work / f"ready-{spec['job_id']}", "ready")
            await c.call("terminate_run", key(spec, reason="preempt"))
            return pid, await c.exited(spec["job_id"])

    pid, ended = run(body())
    assert ended["reason"] == "preempt" and ended["killed"] is True
    assert ended["signal"] == signal.SIGKILL
    assert ended["end_time"] - ended["start_time"] >= 1  # the grace was granted
    assert not group_alive(pid)


def test_preempt_sends_the_jobs_signal_and_wakes_a_stopped_job(agent):
    box = agent.box
    spec = box.spec("#!/bin/sh\ntrap 'echo got-usr1; exit 0' USR1\necho ready > ready-$HAI_JOB_ID\n" + LOOP,
                    signal=signal.SIGUSR1, grace=30)

    async def body():
        async with client(agent) as c:
            await c.call("start_run", {"spec": spec})
            await read_when(box.work / f"ready-{spec['job_id']}", "ready")
            # a stopped job cannot run its handler: the terminate must SIGCONT it first
            assert await c.call("signal_run", key(spec, signal=signal.SIGSTOP)) == {"delivered": True}
            await c.call("terminate_run", key(spec, reason="preempt"))
            return await c.exited(spec["job_id"])

    ended = run(body())
    assert ended["reason"] == "preempt" and ended["exit_code"] == 0 and ended["killed"] is False
    assert "got-usr1" in open(spec["stdout"]).read()


def test_time_limit_warns_then_terminates(agent):
    box = agent.box
    spec = box.spec("#!/bin/sh\ntrap 'echo warned' USR1\n" + LOOP, time_limit=2,
                    signal=signal.SIGUSR1, signal_time=1, grace=1)

    ended = run_to_end(agent, spec, timeout=30)
    assert ended["reason"] == "timeout" and ended["signal"] == signal.SIGTERM
    assert ended["end_time"] - ended["start_time"] >= 2
    assert "warned" in open(spec["stdout"]).read()


def test_signal_run_delivers_without_ending(agent):
    box = agent.box
    spec = box.spec("#!/bin/sh\ntrap 'echo usr2' USR2\necho ready > ready-$HAI_JOB_ID\n" + LOOP)

    async def body():
        async with client(agent) as c:
            await c.call("start_run", {"spec": spec})
            await read_when(box.work / f"ready-{spec['job_id']}", "ready")
            assert await c.call("signal_run", key(spec, signal=signal.SIGUSR2)) == {"delivered": True}
            await read_when(spec["stdout"], "usr2")
            runs = (await c.call("list_runs"))["runs"]
            assert [r["state"] for r in runs if r["job_id"] == spec["job_id"]] == ["running"]
            with pytest.raises(RpcError, match="signal number"):
                await c.call("signal_run", key(spec, signal=0))
            await c.call("terminate_run", key(spec, reason="cancel"))
            await c.exited(spec["job_id"])
            return await c.call("signal_run", key(spec, signal=signal.SIGUSR2))

    assert run(body()) == {"delivered": False}


def test_launch_failures_are_reported_with_the_reason(agent):
    box = agent.box
    private = box.base / "root-only"
    private.mkdir(mode=0o700, exist_ok=True)
    cases = [
        (box.spec("#!/bin/sh\ntrue\n", workdir="/nonexistent/dir"),
         "chdir to /nonexistent/dir failed: No such file or directory"),
        # opened after dropping privileges: the user cannot write where root-only files live
        (box.spec("#!/bin/sh\ntrue\n", stdout=str(private / "out")),
         f"opening stdout {private}/out failed: Permission denied"),
        (box.spec("#!/bin/sh\ntrue\n", checkpoint_dir=str(private / "ckpt")),
         f"creating checkpoint dir {private}/ckpt failed: Permission denied"),
        (box.spec("#!/nonexistent/interpreter\n"), "exec of the job script"),
    ]

    async def body():
        async with client(agent) as c:
            out = []
            for spec, _ in cases:
                out.append(await c.call("start_run", {"spec": spec}))
            listed = {r["job_id"]: r for r in (await c.call("list_runs"))["runs"]}
            return out, listed

    replies, listed = run(body())
    for (spec, message), reply in zip(cases, replies):
        st = reply["status"]
        assert reply["started"] is True
        assert st["state"] == "ended" and st["reason"] == "launch_failed", st
        assert message in st["message"]
        assert st["pid"] is None and st["exit_code"] is None
        assert listed[spec["job_id"]] == st
    assert not (private / "out").exists()


def test_forget_run_only_after_the_end(agent):
    box = agent.box
    spec = box.spec("#!/bin/sh\nwhile [ ! -e go-$HAI_JOB_ID ]; do sleep 0.1; done\n")
    run_dir = spool.runs_dir(box.spool) / f"{spec['job_id']}.0"

    async def body():
        async with client(agent) as c:
            await c.call("start_run", {"spec": spec})
            with pytest.raises(RpcError, match="has not ended"):
                await c.call("forget_run", key(spec))
            (box.work / f"go-{spec['job_id']}").touch()
            await c.exited(spec["job_id"])
            assert run_dir.is_dir()
            assert await c.call("forget_run", key(spec)) == {"forgotten": True}
            runs = (await c.call("list_runs"))["runs"]
            again = await c.call("forget_run", key(spec))
            return runs, again

    runs, again = run(body())
    assert spec["job_id"] not in [r["job_id"] for r in runs]
    assert again == {"forgotten": False}
    assert not run_dir.exists()


def test_leftovers_are_killed_when_the_main_process_exits(agent):
    box = agent.box
    # one child stays in the job's process group, one escapes it with setsid
    spec = box.spec("#!/bin/sh\nsleep 300 &\necho $! > in-group-$HAI_JOB_ID\n"
                    "setsid sleep 300 &\necho $! > escaped-$HAI_JOB_ID\nexit 4\n")

    async def body():
        async with client(agent) as c:
            pid = (await c.call("start_run", {"spec": spec}))["status"]["pid"]
            return pid, await c.exited(spec["job_id"])

    pid, ended = run(body())
    assert ended["exit_code"] == 4 and ended["reason"] is None and ended["killed"] is False
    assert not group_alive(pid)
    for name in ("in-group", "escaped"):
        child = int((box.work / f"{name}-{spec['job_id']}").read_text())
        assert spool.proc_starttime(child) is None, f"{name} child {child} survived"
