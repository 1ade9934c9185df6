"""The agent's side of fractional GPUs: the share in a RunSpec, and the environment it becomes."""
from __future__ import annotations

import asyncio
import concurrent.futures
import os
import stat
import time
import tracemalloc

import pytest

from hai_cluster.agent.gpushare import ShareError, Shares
from hai_cluster.agent import mps as mps_module
from hai_cluster.agent.mps import MpsControl, MpsError
from hai_cluster.agent.runs import RunTable
from hai_cluster.protocol.runspec import RunSpec, SpecError
from hai_cluster.config import AgentConfig, SharingConfig
from hai_cluster.core.model import GpuInfo

pytestmark = pytest.mark.timeout(30)

BASE = {"job_id": 1, "attempt": 0, "rank": 0, "user": "u", "uid": 1000, "gid": 1000, "script": "#!/bin/sh\n",
        "script_args": [], "workdir": "/tmp", "stdout": "/tmp/o", "stderr": None, "environment": {"A": "1"},
        "time_limit": None, "signal": None, "signal_time": 60, "grace": 60, "checkpoint_dir": None}
SHARE = {"fraction": 0.5, "mem_mb": None, "compute": None, "qos": "burstable"}


def test_share_in_a_run_spec():
    spec = RunSpec.from_wire({**BASE, "gpus": [1], "gpu_share": SHARE})
    assert spec.gpu_share == SHARE and RunSpec.from_wire(spec.to_wire()) == spec
    assert RunSpec.from_wire(BASE).gpu_share is None  # a controller that predates sharing
    for bad, msg in (({**SHARE, "fraction": 2.0}, "below 1"), ({**SHARE, "qos": "gold"}, "QoS"),
                     ({"fraction": 0.5}, "lacks field"), ("half", "must be a map")):
        with pytest.raises(SpecError, match=msg):
            RunSpec.from_wire({**BASE, "gpus": [0], "gpu_share": bad})
    with pytest.raises(SpecError, match="exactly one GPU"):
        RunSpec.from_wire({**BASE, "gpus": [0, 1], "gpu_share": SHARE})


def test_unisolated_share_is_time_slicing_only(tmp_path):
    cfg = AgentConfig(name="n", spool=str(tmp_path), sharing=SharingConfig(gpus=(0,), allow_unisolated=True))
    cards = [GpuInfo(0, "GPU-a", "sim", 40960, shareable=True, isolation="none"),
             GpuInfo(1, "GPU-b", "sim", 40960)]
    shares = Shares(cfg, cards)
    spec = shares.prepare(RunSpec.from_wire({**BASE, "gpus": [0], "gpu_share": SHARE}))
    env = dict(spec.environment)
    assert env == {"A": "1", "CUDA_VISIBLE_DEVICES": "GPU-a", "HAI_GPU_SHARE_MB": "20480",
                   "HAI_GPU_SHARE_COMPUTE": "50", "HAI_GPU_ISOLATION": "none", "HAI_GPU_QOS": "burstable"}
    assert not (tmp_path / "mps").exists()  # no daemon without MPS
    whole = RunSpec.from_wire({**BASE, "gpus": [1]})
    assert shares.prepare(whole) is whole
    with pytest.raises(ShareError, match="GPU 1 is not offered for sharing"):
        shares.prepare(RunSpec.from_wire({**BASE, "gpus": [1], "gpu_share": SHARE}))


def test_mps_that_fails_to_start_refuses_the_run(tmp_path):
    tool = tmp_path / "mps-tool"
    tool.write_text("#!/bin/sh\necho 'no device' >&2\nexit 3\n")
    tool.chmod(0o755)
    cfg = AgentConfig(name="n", spool=str(tmp_path), sharing=SharingConfig(gpus=(0,), mps_control=str(tool)))
    shares = Shares(cfg, [GpuInfo(0, "GPU-a", "sim", 40960, shareable=True, isolation="mps")])
    with pytest.raises(ShareError, match="exited 3: no device"):
        shares.prepare(RunSpec.from_wire({**BASE, "uid": 0, "gid": 0, "gpus": [0], "gpu_share": SHARE}))


def test_a_stale_control_pipe_does_not_count(tmp_path):
    mps = MpsControl("true", str(tmp_path))
    pipe, _ = mps.dirs(0, 1000)
    pipe.mkdir(parents=True)
    assert not mps.running(0, 1000)
    (pipe / "control").touch()
    assert mps.running(0, 1000)  # no pid file: the pipe decides
    pid_file = pipe / "nvidia-cuda-mps-control.pid"
    pid_file.write_text("999999999\n")
    os.chown(pid_file, 1000, 1000)  # the daemon runs as the user
    assert not mps.running(0, 1000)  # that process is gone
    pid_file.write_text(f"{os.getpid()}\n")
    assert mps.running(0, 1000)
    os.chown(pid_file, 0, 0)
    assert not mps.running(0, 1000)  # not the user's: not the daemon's


@pytest.mark.parametrize("swap", ["fifo", "symlink"])
def test_the_pid_file_is_read_without_following_or_blocking(tmp_path, swap):
    """The pipe directory is the user's: a FIFO there would block root's read forever, a symlink
    to /dev/zero would never end. Both count as no daemon, at once."""
    mps = MpsControl("true", str(tmp_path))
    pipe, _ = mps.dirs(0, 1000)
    pipe.mkdir(parents=True)
    (pipe / "control").touch()
    pid_file = pipe / "nvidia-cuda-mps-control.pid"
    if swap == "fifo":
        os.mkfifo(pid_file)
    else:
        pid_file.symlink_to("/dev/zero")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        assert pool.submit(mps.running, 0, 1000).result(timeout=5) is False


def test_mps_dirs_are_made_by_fd_and_an_old_users_base_becomes_roots(tmp_path):
    """An older agent left gpu0-1000/ owned by the user, who replaced log/ with a symlink:
    ensure takes the base back for root, replaces the link with a directory and gives pipe/ and
    log/ to the user; the symlink's target is untouched."""
    victim = tmp_path / "victim"
    victim.mkdir()
    mps = MpsControl("true", str(tmp_path / "mps"))  # runs as uid 1000, which cannot reach tmp_path
    pipe, logs = mps.dirs(0, 1000)
    pipe.mkdir(parents=True)
    os.chown(pipe.parent, 1000, 1000)
    logs.symlink_to(victim)
    mps.ensure(0, "GPU-a", 1000, 1000)
    base = os.stat(pipe.parent)
    assert (base.st_uid, base.st_mode & 0o777) == (0, 0o755)
    for d in (pipe, logs):
        st = os.lstat(d)
        assert stat.S_ISDIR(st.st_mode) and (st.st_uid, st.st_gid, st.st_mode & 0o777) == (1000, 1000, 0o700)
    assert os.stat(victim).st_uid == 0


def test_two_runs_starting_at_once_start_one_mps_daemon(tmp_path):
    """Runs start on the agent's thread pool: two sharing runs of one user on one card, prepared
    at the same moment, must find one daemon between them, not start two."""
    tool = tmp_path / "mps-tool"  # slow to start, like the real one: both would look before it is up
    tool.write_text('#!/bin/sh\necho start >> "$CUDA_MPS_LOG_DIRECTORY/../calls"\nsleep 0.3\n'
                    'touch "$CUDA_MPS_PIPE_DIRECTORY/control"\n')
    tool.chmod(0o755)
    cfg = AgentConfig(name="n", spool=str(tmp_path), sharing=SharingConfig(gpus=(0,), mps_control=str(tool)))
    shares = Shares(cfg, [GpuInfo(0, "GPU-a", "sim", 40960, shareable=True, isolation="mps")])
    spec = RunSpec.from_wire({**BASE, "uid": 0, "gid": 0, "gpus": [0], "gpu_share": SHARE})
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        envs = [f.result().environment for f in [pool.submit(shares.prepare, spec) for _ in range(2)]]
    assert envs[0]["CUDA_MPS_PIPE_DIRECTORY"] == envs[1]["CUDA_MPS_PIPE_DIRECTORY"]
    assert (shares.mps.dirs(0, 0)[0].parent / "calls").read_text() == "start\n"


def _recording_mps(tmp_path):
    """An MPS control stand-in: `-d` creates the control pipe, `quit` removes it; both recorded."""
    tool = tmp_path / "mps-tool"
    tool.write_text('#!/bin/sh\ncalls="$CUDA_MPS_LOG_DIRECTORY/../calls"\n'
                    'if [ "$1" = -d ]; then echo start >> "$calls"; touch "$CUDA_MPS_PIPE_DIRECTORY/control"; exit; fi\n'
                    'read cmd; echo "$cmd" >> "$calls"; [ "$cmd" = quit ] && rm -f "$CUDA_MPS_PIPE_DIRECTORY/control"\n')
    tool.chmod(0o755)
    cfg = AgentConfig(name="n", spool=str(tmp_path), sharing=SharingConfig(gpus=(0,), mps_control=str(tool)))
    return Shares(cfg, [GpuInfo(0, "GPU-a", "sim", 40960, shareable=True, isolation="mps")])


def test_idle_cleanup_spares_a_daemon_that_a_run_got_after_the_live_list_was_taken(tmp_path):
    """The agent takes its list of live runs, then stops idle daemons on a thread. A run prepared
    in between got its daemon without being in that list: the cleanup must not stop it."""
    shares = _recording_mps(tmp_path)
    spec = RunSpec.from_wire({**BASE, "uid": 0, "gid": 0, "gpus": [0], "gpu_share": SHARE})
    before = shares.prepared  # the live list (empty) is taken now
    shares.prepare(spec)
    shares.release_idle([], before)
    assert shares.mps.running(0, 0)
    shares.release_idle([spec], shares.prepared)  # a live user
    assert shares.mps.running(0, 0)
    shares.release_idle([], shares.prepared)  # none: stopped
    assert not shares.mps.running(0, 0)
    assert (shares.mps.dirs(0, 0)[0].parent / "calls").read_text() == "start\nquit\n"


def test_quit_returns_once_the_daemon_is_gone(tmp_path):
    """`quit` is only delivered when the control command returns; a run starting right after
    must not be handed the dying daemon, so quit waits until it is gone."""
    tool = tmp_path / "mps-tool"
    tool.write_text('#!/bin/sh\nif [ "$1" = -d ]; then touch "$CUDA_MPS_PIPE_DIRECTORY/control"; exit; fi\n'
                    'read cmd; (sleep 0.5; rm -f "$CUDA_MPS_PIPE_DIRECTORY/control") >/dev/null 2>&1 &\n')
    tool.chmod(0o755)
    mps = MpsControl(str(tool), str(tmp_path / "mps"))
    mps.ensure(0, "GPU-a", 0, 0)
    assert mps.running(0, 0)
    mps.quit(0, "GPU-a", 0, 0)
    assert not mps.running(0, 0)  # the tool removed it half a second after it returned


def tool(tmp_path, body: str) -> str:
    path = tmp_path / "mps-tool"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def test_the_control_programs_output_is_kept_only_up_to_a_cap(tmp_path, monkeypatch):
    """It runs as the user, who can write into its output pipe without end (fourth audit: the
    agent grew to 6.3 GB in 25 s): the agent keeps OUTPUT_CAP bytes and stops reading."""
    monkeypatch.setattr(mps_module, "TIMEOUT", 3.0)
    flood = MpsControl(tool(tmp_path, "head -c 50000000 /dev/zero\nexit 4\n"), str(tmp_path / "mps"))
    tracemalloc.start()
    try:
        started = time.monotonic()
        with pytest.raises(MpsError, match="did not finish within 3 s"):
            flood.ensure(0, "GPU-a", 0, 0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000 and time.monotonic() - started < 10
    noisy = MpsControl(tool(tmp_path, "printf 'x%.0s' $(seq 20000)\necho; echo 'no device'\nexit 3\n"),
                       str(tmp_path / "mps2"))
    with pytest.raises(MpsError, match=r"exited 3: x{300}$"):  # the first bytes, cut for the message
        noisy.ensure(0, "GPU-a", 0, 0)


def test_a_daemon_that_keeps_the_output_open_does_not_hold_the_call(tmp_path):
    """The call waits for the control program to exit, not for EOF on its output."""
    body = 'if [ "$1" = -d ]; then touch "$CUDA_MPS_PIPE_DIRECTORY/control"; sleep 20 & exit 0; fi\n'
    mps = MpsControl(tool(tmp_path, body), str(tmp_path / "mps"))
    started = time.monotonic()
    mps.ensure(0, "GPU-a", 0, 0)
    assert time.monotonic() - started < 10 and mps.running(0, 0)


def test_a_run_is_in_the_table_while_its_share_is_prepared(tmp_path):
    """The cleanup spares the daemons of the runs in the table, so a run must be there before
    its prepare can get a daemon. A prepare that fails takes the run out again, with its error
    for every caller (a duplicate start included), and leaves no run dir."""
    async def scenario():
        table = RunTable(str(tmp_path), 5.0)
        table.setup()
        spec = RunSpec.from_wire({**BASE, "gpus": [0], "gpu_share": SHARE})
        seen = []

        def prepare(s):
            seen.append(s.key in table.runs)
            time.sleep(0.1)  # the duplicate arrives meanwhile
            raise ShareError("cannot start MPS")
        results = await asyncio.gather(table.start(spec, prepare), table.start(spec, prepare),
                                       return_exceptions=True)
        assert seen == [True]  # prepared once, while in the table
        assert all(isinstance(r, ShareError) for r in results), results
        assert table.runs == {} and list((tmp_path / "runs").iterdir()) == []
    asyncio.run(scenario())


def test_a_mig_share_sees_its_instance_alone(tmp_path):
    cfg = AgentConfig(name="n", spool=str(tmp_path), sharing=SharingConfig(gpus=(0,)))
    layout = (("MIG-x", "3g.40gb", 40960, 42), ("MIG-y", "2g.20gb", 20480, 28))
    shares = Shares(cfg, [GpuInfo(0, "GPU-a", "sim", 81920, shareable=True, isolation="mig", mig=layout)])
    spec = shares.prepare(RunSpec.from_wire({**BASE, "gpus": [0], "gpu_share": {**SHARE, "mig": "MIG-y"}}))
    assert dict(spec.environment) == {"A": "1", "CUDA_VISIBLE_DEVICES": "MIG-y", "HAI_GPU_SHARE_MB": "20480",
                                      "HAI_GPU_SHARE_COMPUTE": "28", "HAI_GPU_ISOLATION": "mig",
                                      "HAI_GPU_MIG_PROFILE": "2g.20gb", "HAI_GPU_QOS": "burstable"}
    assert not (tmp_path / "mps").exists()  # no MPS daemon for MIG
    for bad in ({**SHARE, "mig": "MIG-z"}, SHARE):  # not of this card's layout; none given
        with pytest.raises(ShareError, match="has no MIG instance"):
            shares.prepare(RunSpec.from_wire({**BASE, "gpus": [0], "gpu_share": bad}))
    with pytest.raises(SpecError, match="MIG instance UUID"):
        RunSpec.from_wire({**BASE, "gpus": [0], "gpu_share": {**SHARE, "mig": 3}})


@pytest.mark.parametrize("isolation", ["none", "mig", "mps"])
def test_an_adopted_ssh_session_gets_every_variable_of_the_jobs_share(tmp_path, monkeypatch, isolation):
    """adopt's env file carries what prepare() set (the card's UUID or MIG instance, the MPS pipe
    and limits), so CUDA in the session goes through the job's share, not around it."""
    from hai_cluster.agent.adopt import env_text

    cfg = AgentConfig(name="n", spool=str(tmp_path), sharing=SharingConfig(gpus=(0,), allow_unisolated=True))
    layout = (("MIG-x", "3g.40gb", 40960, 42),)
    shares = Shares(cfg, [GpuInfo(0, "GPU-a", "sim", 81920, shareable=True, isolation=isolation, mig=layout)])
    monkeypatch.setattr(shares.mps, "ensure", lambda card, uuid, uid, gid: tmp_path / "pipe")
    share = {**SHARE, "qos": "best-effort", "compute": 30, **({"mig": "MIG-x"} if isolation == "mig" else {})}
    env = dict(shares.prepare(RunSpec.from_wire({**BASE, "gpus": [0], "gpu_share": share})).environment)
    added = {k: v for k, v in env.items() if k != "A"}
    assert len(added) >= 5 and ("CUDA_MPS_PIPE_DIRECTORY" in added) == (isolation == "mps")
    text = env_text(env)
    for k, v in added.items():
        assert f"export {k}={v}\n" in text, (k, text)
