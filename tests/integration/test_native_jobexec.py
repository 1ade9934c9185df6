"""hai-jobexec (hai_cluster/native/jobexec.c) against jobproc.exec_job, its reference: the shepherd's
start_job runs each case both ways, as root, for the test user, and the job's view of itself
(ids, groups, umask, cwd, environment, signals, open fds, cgroups) and every launch error must
be the same. Real processes, a real cgroup; nothing is mocked but where start_job looks for the
helper."""
from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from hai_cluster.agent import jobproc, launcher
from hai_cluster.protocol.runspec import RunSpec
from hai_cluster.agent.runtimes import Launch

from .agent_helpers import Sandbox, need_root
from .test_native_hsubmit import build

PROBE = """#!/bin/bash
echo "ids $(id -u) $(id -g) $(id -G)"
echo "umask $(umask)"
echo "cwd $(pwd)"
grep -E '^Sig(Blk|Ign)' /proc/self/status
echo "fds $(ls /proc/$$/fd | sort -n | tr '\\n' ' ')"
echo "sid $(cut -d' ' -f6 /proc/$$/stat) pid $$"
grep -E ':(pids|memory|cpu,cpuacct|cpu):' /proc/$$/cgroup | sed 's/^[0-9]*://'
env | grep -v '^_=' | sort
echo to-stderr >&2
"""


def _built(cflags: str):
    """hai-jobexec built with these flags, in a directory of its own (removed after)."""
    need_root()
    if not shutil.which(os.environ.get("CC") or "cc"):
        pytest.skip("no C compiler")
    d = Path(tempfile.mkdtemp(prefix="hai-jobexec-", dir="/tmp"))
    proc = build(d, CFLAGS=cflags)
    assert proc.returncode == 0, proc.stderr
    yield str(d / "hai-jobexec")
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def helper():
    yield from _built("-O2 -Wall -Wextra -Werror")


@pytest.fixture(scope="module")
def helper_without_close_range():
    """The helper as built where the kernel headers lack close_range (Linux < 5.9)."""
    yield from _built("-O2 -Wall -Wextra -Werror -DHAI_NO_CLOSE_RANGE")


@pytest.fixture()
def box():
    b = Sandbox()
    yield b
    b.cleanup()


def start(box: Sandbox, way: str, helper: str, script: str = PROBE, cgroups=(), keep=(), env=None,
          monkeypatch=None, limits=(), **over) -> tuple[str, int, str, str]:
    """(error written to the pipe, exit code, stdout file, stderr file) of one job started `way`,
    with this run's own paths replaced by RUN and WORK so that the two ways compare."""
    spec = RunSpec.from_wire(box.spec(script, **over))
    run_dir = box.base / f"run-{spec.job_id}"
    launcher.prepare(run_dir, spec)
    launch = Launch(argv=[str(run_dir / "script")], label=f"the job script {run_dir / 'script'}", keep_fds=keep,
                    env=env if env is not None else {"PATH": "/usr/bin:/bin", "HAI_JOB_ID": "7", "A": "b c"})
    monkeypatch.setattr(jobproc, "JOBEXEC", helper if way == "c" else "/nonexistent/hai-jobexec")
    r, w = os.pipe()
    try:
        pid = jobproc.start_job(spec, launch, os.getgrouplist(spec.user, spec.gid), w, list(cgroups), limits)
    finally:
        os.close(w)
    with os.fdopen(r, "rb") as f:
        error = f.read().decode()
    _, status = os.waitpid(pid, 0)

    def read(path):
        try:
            return Path(path).read_text()
        except (OSError, TypeError):
            return ""
    sid_line = f"sid {pid} pid {pid}"  # its own session: the ids differ from one run to the next
    out = read(spec.stdout).replace(sid_line, "sid=pid").replace(str(pid), "PID")
    err = read(spec.stderr) if spec.stderr else ""

    def norm(text: str) -> str:
        return text.replace(str(run_dir), "RUN").replace(f"job-{spec.job_id}", "job-N")
    return norm(error), os.waitstatus_to_exitcode(status), norm(out), norm(err)


def both(box, helper, monkeypatch, **kw):
    c = start(box, "c", helper, monkeypatch=monkeypatch, **kw)
    py = start(box, "py", helper, monkeypatch=monkeypatch, **kw)
    assert c == py
    return c


def test_a_job_sees_the_same_process_either_way(box, helper, monkeypatch):
    error, code, out, _ = both(box, helper, monkeypatch)
    assert (error, code) == ("", 0)
    user = box.user
    assert f"ids {user.pw_uid} {user.pw_gid}" in out and "umask 0022" in out and f"cwd {box.work}" in out
    assert "SigBlk:\t0000000000000000" in out and "SigIgn:\t0000000000000000" in out  # defaults, nothing blocked
    assert "fds 0 1 2 3 255 " in out  # nothing of the shepherd's leaks in (3: the $(...)'s pipe)
    assert "sid=pid" in out
    assert "A=b c\nHAI_JOB_ID=7\n" in out and "to-stderr" in out  # stderr joins stdout without -e


def test_umask_stderr_attempt_and_checkpoint_dir(box, helper, monkeypatch):
    for way in ("c", "py"):
        ckpt = box.work / way / "deep" / "ckpt"
        for attempt, expect_lines in ((0, 1), (1, 2)):  # a requeued run appends to its output
            _, code, out, err = start(box, way, helper, script="#!/bin/sh\numask\necho e >&2\n", umask=0o027,
                                      attempt=attempt, checkpoint_dir=str(ckpt), monkeypatch=monkeypatch,
                                      stdout=str(box.work / f"{way}.out"), stderr=str(box.work / f"{way}.err"))
            assert code == 0 and out.splitlines() == ["0027"] * expect_lines and err == "e\n" * expect_lines
        assert ckpt.is_dir() and ckpt.stat().st_mode & 0o777 == 0o700 and ckpt.stat().st_uid == box.user.pw_uid
        assert (ckpt.parent.stat().st_mode & 0o777) == 0o750  # a parent: 0777 less the job's umask


@pytest.mark.parametrize("over, message", [
    ({"workdir": "/nonexistent/work"}, "chdir to /nonexistent/work failed: No such file or directory"),
    ({"stdout": "/root/forbidden.out"}, "opening stdout /root/forbidden.out failed: Permission denied"),
    ({"stderr": "/proc/nope/e"}, "opening stderr /proc/nope/e failed: No such file or directory"),
    ({"checkpoint_dir": "/root/ckpt"}, "creating checkpoint dir /root/ckpt failed: Permission denied"),
    ({"checkpoint_dir": "/etc/hostname/ckpt"}, "creating checkpoint dir /etc/hostname/ckpt failed: Not a directory"),
    ({"script": "#!/nonexistent/sh\ntrue\n"},
     "exec of the job script RUN/script failed: No such file or directory (interpreter '/nonexistent/sh')"),
    ({"script": "#!/etc/hostname\n"}, "exec of the job script RUN/script failed: Exec format error"),
])
def test_launch_errors_read_the_same(box, helper, monkeypatch, over, message):
    error, code, out, _ = both(box, helper, monkeypatch, **over)
    assert (error, code, out) == (message, 127, "")


def test_the_job_starts_with_the_nodes_resource_limits(box, helper, monkeypatch):
    """[isolation.rlimits], set as root before the job becomes its user (a job may lower them only)."""
    limits = (("nofile", 1024, 4096), ("memlock", 65536, 65536), ("core", 0, -1))
    error, code, out, _ = both(box, helper, monkeypatch, limits=limits,
                               script="#!/bin/sh\ngrep -E 'open files|locked memory|core file' /proc/self/limits\n")
    assert (error, code) == ("", 0)
    rows = {" ".join(line.split()[:-3]): line.split()[-3:-1] for line in out.splitlines()}
    assert rows == {"Max core file size": ["0", "unlimited"], "Max locked memory": ["65536", "65536"],
                    "Max open files": ["1024", "4096"]}
    # above what the kernel allows (fs.nr_open): the launch fails, saying which limit, either way
    error, code, out, _ = both(box, helper, monkeypatch, limits=(("nofile", 10**9, 10**9),))
    assert (error, code, out) == (
        "setting the job's resource limit nofile (1000000000:1000000000) failed: Operation not permitted", 127, "")


def test_the_job_joins_the_run_cgroup_and_keeps_the_runtime_fds(box, helper, monkeypatch):
    hierarchy = Path("/sys/fs/cgroup/pids")
    if not hierarchy.is_dir():
        hierarchy = Path("/sys/fs/cgroup")  # cgroup v2 only
    cg = hierarchy / f"hai-test-jobexec-{os.getpid()}"
    cg.mkdir()
    r, w = os.pipe()
    try:
        script = f"#!/bin/bash\necho kept >&{w}\ncat /proc/self/cgroup\n"  # dash: no fd above 9
        for way in ("c", "py"):
            error, code, out, _ = start(box, way, helper, script=script, cgroups=[str(cg / "cgroup.procs")], keep=(w,),
                                        monkeypatch=monkeypatch)
            assert (error, code) == ("", 0)
            assert f"/{cg.name}\n" in out
            assert os.read(r, 100) == b"kept\n"
        error, code, _, _ = both(box, helper, monkeypatch, cgroups=[str(cg / "gone" / "cgroup.procs")])
        assert (error, code) == (f"joining the cgroup {cg}/gone failed: No such file or directory", 127)
    finally:
        os.close(r)
        os.close(w)
        cg.rmdir()


def test_the_helper_never_runs_with_the_jobs_environment(box, helper, monkeypatch, tmp_path):
    """The job's LD_PRELOAD reaches the job, not the helper, which runs as root: the loader's
    complaint about a library that does not exist comes from the job (its output file), never
    from the helper (whose stderr is the shepherd's, here this test's, caught in a file)."""
    env = {"PATH": "/usr/bin:/bin", "LD_PRELOAD": "/nonexistent/evil.so"}
    caught = tmp_path / "stderr"
    saved = os.dup(2)
    with open(caught, "wb") as f:
        os.dup2(f.fileno(), 2)
    try:
        error, code, out, _ = start(box, "c", helper, script="#!/bin/bash\necho \"$LD_PRELOAD\"\n", env=env,
                                    monkeypatch=monkeypatch)
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    assert (error, code) == ("", 0)
    assert out.count("evil.so") == 2  # the loader's complaint in the job, and the job's echo
    assert "evil.so" not in caught.read_text()


def test_a_helper_of_another_version_refuses_clearly(box, helper, monkeypatch):
    monkeypatch.setattr(jobproc, "JOBEXEC_PROTOCOL", "0")
    error, code, _, _ = start(box, "c", helper, monkeypatch=monkeypatch)
    assert code == 127
    assert error == "preparing the job process (hai-jobexec: another version's protocol) failed: Invalid argument"


def test_inherited_fds_are_closed_without_close_range_too(box, helper, helper_without_close_range, monkeypatch):
    """Inheritable fds of the shepherd (a library's leak), low and far up, never reach the job;
    without close_range the helper closes what /proc/self/fd lists, and keeps the runtime's fd."""
    r, w = os.pipe()
    leaked = [os.dup(r), fcntl.fcntl(r, fcntl.F_DUPFD, 900)]  # free numbers: a fixed one may be taken
    for fd in leaked:
        os.set_inheritable(fd, True)
    try:
        # the job lists its own fds (3: the listing's own directory): not bash's from a child,
        # which could catch bash between the fork of $(...) and its close of the pipe's write end
        script = ("#!/bin/bash\nexec python3 -c \"import os; "
                  "print('fds', *sorted(int(f) for f in os.listdir('/proc/self/fd')))\"\n")
        outs = [start(box, way, path, script=script, keep=(w,), monkeypatch=monkeypatch)
                for way, path in (("c", helper), ("c", helper_without_close_range), ("py", helper))]
        assert outs[0] == outs[1] == outs[2]
        assert outs[0][:2] == ("", 0) and outs[0][2] == f"fds 0 1 2 3 {w}\n", outs
    finally:
        for fd in (*leaked, r, w):
            os.close(fd)
