"""hai_cluster.job, the library training code imports: each behaviour runs in a fresh subprocess
(the library keeps per-process state and installs a real signal handler), with real signals and a
real control dir whose notices are written by the agent's own code (spool.write_notice)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from hai_cluster import job as job_library  # importing it here changes nothing in this process
from hai_cluster.agent import spool
from hai_cluster.core.jobenv import job_environment

pytestmark = pytest.mark.timeout(120)


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HAI_", "SLURM_", "TRAIN_LOOP", "TORCH_TRAIN"))}
    env.update(extra)
    return env


def py(code: str, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env or clean_env(),
                          capture_output=True, text=True, timeout=60)
    if check and proc.returncode != 0:
        raise AssertionError(f"rc={proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


def start(code: str, env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_line(proc: subprocess.Popen, expected: str) -> None:
    line = proc.stdout.readline()  # the test's timeout bounds this
    if line.strip() != expected:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"expected {expected!r}, got {line!r}\n{out}\n{err}")


def job_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    control = tmp_path / "control"
    control.mkdir(exist_ok=True)
    return clean_env(HAI_JOB_ID="42", HAI_RESTART_COUNT="3", HAI_CONTROL_DIR=str(control),
                     HAI_CHECKPOINT_DIR=str(tmp_path / "ckpt"), **extra)


WAIT_FOR_STOP = """
        deadline = time.monotonic() + 60
        while not job.should_checkpoint():
            if time.monotonic() > deadline:
                sys.exit(3)
            time.sleep(0.01)
"""  # indented as the code it is pasted into


# -- import, handler ------------------------------------------------------------------------------

def test_import_is_light_and_has_no_side_effects():
    out = py("""
        import signal, sys
        before = set(sys.modules)
        import hai_cluster.job as job
        new = sorted(set(sys.modules) - before)
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        print(" ".join(new))
    """).stdout.split()
    assert "hai_cluster.job" in out
    foreign = [m for m in out if m.split(".")[0] not in sys.stdlib_module_names
               and m.split(".")[0] != "hai_cluster"]
    assert foreign == []
    assert not {"numpy", "torch", "typing", "asyncio", "subprocess"} & set(out)
    assert [m for m in out if m.startswith("hai_cluster")] == ["hai_cluster", "hai_cluster.job"]


def test_a_process_that_never_calls_it_keeps_the_default_action():
    proc = start("""
        import time, hai_cluster.job
        print("ready", flush=True)
        time.sleep(60)
    """, clean_env())
    wait_line(proc, "ready")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == -signal.SIGTERM


def test_first_call_installs_the_handler_for_the_jobs_signal():
    out = py("""
        import signal
        from hai_cluster import job
        assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL
        job.restart_count()
        print(signal.getsignal(signal.SIGUSR1) is job._on_signal,
              signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, job.preempt_signal())
    """, clean_env(HAI_PREEMPT_SIGNAL=str(int(signal.SIGUSR1)))).stdout.split()
    assert out == ["True", "True", str(int(signal.SIGUSR1))]


@pytest.mark.parametrize("sig", [None, signal.SIGUSR1])
def test_the_signal_sets_should_checkpoint(tmp_path, sig):
    env = job_env(tmp_path) if sig is None else job_env(tmp_path, HAI_PREEMPT_SIGNAL=str(int(sig)))
    proc = start("""
        import sys, time
        from hai_cluster import job
        assert job.should_checkpoint() is False
        print("ready", flush=True)
    """ + WAIT_FOR_STOP + """
        print(job.should_checkpoint(), job.reason(), job.preempted(), job.cancelled(), job.deadline())
    """, env)
    wait_line(proc, "ready")
    proc.send_signal(sig or signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    # no notice in the control dir: a bare signal (the --signal warning before a time limit)
    assert out.split() == ["True", "signal", "False", "False", "None"]


def test_a_handler_installed_before_is_still_called():
    proc = start("""
        import signal, sys, time
        got = []
        signal.signal(signal.SIGTERM, lambda s, f: got.append(s))
        from hai_cluster import job
        job.install()
        print("ready", flush=True)
    """ + WAIT_FOR_STOP + """
        print(got)
    """, clean_env())
    wait_line(proc, "ready")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.strip() == f"[{int(signal.SIGTERM)}]"


def test_first_call_from_another_thread_installs_later_from_the_main_thread():
    out = py("""
        import signal, threading
        from hai_cluster import job
        t = threading.Thread(target=job.should_checkpoint)
        t.start(); t.join()
        print(signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, end=" ")
        job.should_checkpoint()
        print(signal.getsignal(signal.SIGTERM) is job._on_signal)
    """).stdout.split()
    assert out == ["True", "True"]


# -- notices ---------------------------------------------------------------------------------------

def test_a_notice_sets_should_checkpoint_at_most_every_recheck_interval(tmp_path):
    """The clock is the library's own (job._clock), replaced: no sleeping, no timing."""
    env = job_env(tmp_path)
    out = py(f"""
        from hai_cluster import job
        from hai_cluster.agent import spool
        now = [100.0]
        job._clock = lambda: now[0]
        seen = [job.should_checkpoint()]           # looks at the files: none yet
        spool.write_notice({env['HAI_CONTROL_DIR']!r}, "preempt", 15, 60, 1000.0)
        for t in (100.1, 100.49):
            now[0] = t
            seen.append(job.should_checkpoint())   # the rate limit: no look yet
        now[0] = 100.0 + job.NOTICE_RECHECK
        seen.append(job.should_checkpoint())       # looks again: the notice is there
        now[0] = 100.6
        seen.append(job.should_checkpoint())       # and it stays
        print(seen)
    """, env).stdout.strip()
    assert out == "[False, False, False, True, True]"


def test_notice_queries_are_not_rate_limited(tmp_path):
    env = job_env(tmp_path)
    out = py(f"""
        from hai_cluster import job
        from hai_cluster.agent import spool
        job._clock = lambda: 5.0
        a = job.should_checkpoint()
        spool.write_notice({env['HAI_CONTROL_DIR']!r}, "requeue", 15, 60, 1000.0)
        print(a, job.should_checkpoint(), job.preempted(), job.should_checkpoint())
    """, env).stdout.split()
    # preempted() read the file at once; from then on should_checkpoint() knows too
    assert out == ["False", "False", "True", "True"]


@pytest.mark.parametrize("reason,kind", [("preempt", "preempt"), ("requeue", "preempt"),
                                         ("cancel", "terminate"), ("timeout", "terminate"),
                                         ("node_fail", "terminate")])
def test_preempted_versus_cancelled(tmp_path, reason, kind):
    env = job_env(tmp_path)
    path = spool.write_notice(env["HAI_CONTROL_DIR"], reason, 10, 30, 1000.0)
    assert path.name == kind and oct(path.stat().st_mode & 0o777) == "0o644"
    out = py("""
        import json
        from hai_cluster import job
        print(json.dumps([job.should_checkpoint(), job.preempted(), job.cancelled(), job.reason(),
                          job.deadline(), job.notice()]))
    """, env).stdout
    should, preempted, cancelled, why, deadline, notice = json.loads(out)
    assert should is True and why == reason and deadline == 1030.0
    assert (preempted, cancelled) == ((True, False) if kind == "preempt" else (False, True))
    assert notice == {"kind": kind, "reason": reason, "signal": 10, "grace": 30,
                      "deadline": 1030.0, "time": 1000.0}


def test_signal_and_notice_together_as_the_agent_sends_them(tmp_path):
    """The shepherd's order: notice first, then the signal; the handler's reader finds both."""
    env = job_env(tmp_path)
    proc = start("""
        import sys, time
        from hai_cluster import job
        job.install()
        print("ready", flush=True)
    """ + WAIT_FOR_STOP + """
        print(job.reason(), job.preempted(), job.time_left() is not None)
    """, env)
    wait_line(proc, "ready")
    spool.write_notice(env["HAI_CONTROL_DIR"], "preempt", 15, 60, time.time())
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.split() == ["preempt", "True", "True"]


# -- files -----------------------------------------------------------------------------------------

def test_atomic_write_forms_and_checkpoint_round_trip(tmp_path):
    env = job_env(tmp_path)
    out = py("""
        import json, os
        from hai_cluster import job
        d = job.checkpoint_dir()
        assert d.is_dir() and oct(d.stat().st_mode & 0o777) == "0o700"
        print(job.load_checkpoint(default="nothing yet"), job.latest_checkpoint())
        state = {"step": 7, "loss": 0.1 + 0.2, "names": ["a", "b"]}
        p = job.save_checkpoint(state)
        assert p == d / "checkpoint.json"
        assert job.load_checkpoint() == state and job.latest_checkpoint() == p
        job.atomic_write(d / "b.bin", b"\\x00\\x01")
        job.atomic_write(d / "s.txt", "h\\u00e9")
        job.atomic_write(d / "c.bin", lambda f: f.write(b"cb"))
        def closes(f):
            f.write(b"closed")
            f.close()
        job.atomic_write(d / "closes.bin", closes)
        print((d / "b.bin").read_bytes() == b"\\x00\\x01", (d / "s.txt").read_text() == "h\\u00e9",
              (d / "c.bin").read_bytes(), (d / "closes.bin").read_bytes())
        os.utime(d / "c.bin", ns=(1, 1))
        os.utime(d / "b.bin", ns=(2, 2))
        print(job.latest_checkpoint("*.bin").name, job.restart_count(), job.job_id(), job.is_hai_job())
        print(sorted(n for n in os.listdir(d) if n.startswith(".")))
    """, env).stdout.splitlines()
    assert out[0] == "nothing yet None"
    assert out[1] == "True True b'cb' b'closed'"
    assert out[2] == "closes.bin 3 42 True"  # the newest .bin, then what the environment says
    assert out[3] == "[]"  # no temp file left behind


def test_atomic_write_failure_keeps_the_old_file(tmp_path):
    target = tmp_path / "state.bin"
    target.write_bytes(b"old")
    proc = py(f"""
        from hai_cluster import job
        def boom(f):
            f.write(b"half")
            raise RuntimeError("disk on fire")
        try:
            job.atomic_write({str(target)!r}, boom)
        except RuntimeError:
            print("raised")
    """)
    assert proc.stdout.strip() == "raised"
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["state.bin"]  # the temp file was removed


def test_a_writer_killed_mid_write_leaves_the_old_file_intact(tmp_path):
    env = job_env(tmp_path)
    ckpt = Path(env["HAI_CHECKPOINT_DIR"])
    ckpt.mkdir()
    (ckpt / "checkpoint.json").write_text(json.dumps({"step": 1}))
    proc = start("""
        import sys, time
        from hai_cluster import job
        def slow(f):
            f.write(b'{"step": 2, "padding": "' + b"x" * 100000)
            f.flush()
            print("half", flush=True)
            time.sleep(60)   # SIGKILLed here
            f.write(b'"}')
        job.atomic_write(job.checkpoint_dir() / "checkpoint.json", slow)
    """, env)
    wait_line(proc, "half")
    proc.kill()
    proc.wait(30)
    assert json.loads((ckpt / "checkpoint.json").read_text()) == {"step": 1}
    leftovers = [n for n in os.listdir(ckpt) if n != "checkpoint.json"]
    assert len(leftovers) == 1 and leftovers[0].startswith(".checkpoint.json.tmp.")
    out = py("""
        from hai_cluster import job
        print(job.load_checkpoint(), job.latest_checkpoint("checkpoint*").name)
    """, env).stdout.strip()
    assert out == "{'step': 1} checkpoint.json"  # the half-written temp file is never picked


def test_outside_a_job_errors_are_clear(tmp_path):
    out = py(f"""
        from hai_cluster import job
        print(job.is_hai_job(), job.job_id(), job.restart_count(), job.control_dir(),
              job.should_checkpoint(), job.preempted(), job.cancelled(), job.deadline())
        for call in (job.checkpoint_dir, job.save_checkpoint):
            try:
                call() if call is job.checkpoint_dir else call({{"a": 1}})
            except job.NotInHaiJob as exc:
                print(type(exc).__name__, "|", exc)
        d = job.checkpoint_dir(fallback={str(tmp_path / "local")!r})
        print(d, d.is_dir(), job.save_checkpoint({{"a": 1}}, directory=d).name)
    """).stdout.splitlines()
    assert out[0] == "False None 0 None False False False None"
    for line in out[1:3]:
        name, message = line.split(" | ")
        assert name == "NotInHaiJob" and issubclass(job_library.NotInHaiJob, RuntimeError)
        assert "HAI_CHECKPOINT_DIR is not set" in message and "fallback=" in message
    assert out[3] == f"{tmp_path / 'local'} True checkpoint.json"


def test_bad_environment_values_fall_back(tmp_path):
    out = py("""
        from hai_cluster import job
        print(job.restart_count(), job.job_id(), job.preempt_signal())
    """, clean_env(HAI_RESTART_COUNT="x", HAI_JOB_ID="y", HAI_PREEMPT_SIGNAL="999")).stdout.split()
    assert out == ["0", "None", str(int(signal.SIGTERM))]


# -- the environment the controller builds ---------------------------------------------------------

JOBENV = dict(job_id=7, job_name="t", user="u", partition=None, nodelist=["n1"], rank=0, node="n1",
              gpus=[], cpus_per_task=1, restart_count=0, checkpoint_dir="/c", submit_dir="/s",
              master_addr="n1", time_limit=None)


def test_jobenv_sets_the_preempt_signal():
    assert job_environment({}, **JOBENV)["HAI_PREEMPT_SIGNAL"] == str(int(signal.SIGTERM))
    assert job_environment({}, **JOBENV, preempt_signal=None)["HAI_PREEMPT_SIGNAL"] == "15"
    env = job_environment({"HAI_PREEMPT_SIGNAL": "2"}, **JOBENV, preempt_signal=int(signal.SIGUSR1))
    assert env["HAI_PREEMPT_SIGNAL"] == str(int(signal.SIGUSR1))
    assert "HAI_CONTROL_DIR" not in env  # the agent adds it: only it knows its spool
