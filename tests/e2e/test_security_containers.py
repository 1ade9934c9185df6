"""Containers versus a hostile user, end to end: real daemons, jobs submitted by the unprivileged
test user, who also works on the node outside the job (as a local user may) to swap the paths the
root side uses. None of it may reach a file or directory the user cannot reach by themselves, and
the root side must never hang on what the user puts at a path.

- the job's output file swapped for a symlink to a root-only file, or for a FIFO, while a fake
  setup failure is staged: the Reason must not show the file, the shepherd must not hang
  (docs/SECURITY.md, "Paths the root side opens for a job");
- a checkpoint dir or an image dir flipped (renameat2 RENAME_EXCHANGE, in a loop) between the
  user's own directory and a symlink to a directory under a root-only parent while jobs start:
  no job may ever see or write the protected directory;
- an image name that would be an option of podman is refused at submission;
- a tarball image cannot hold a root shepherd or fill the node's disk (the third audit): the
  audit's bzip2 bomb fails at once, a cancel ends a slow unpack, and a sparse `truncate -s 2G`
  file fails without the image cache (a 64 MiB tmpfs here) ever getting near full."""
from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from hai_cluster.agent import spool
from tests.integration.test_agent_containers import busybox_rootfs, podman_installed
from tests.integration.test_runtime_paths import bz2_bomb, slow_image, watched_tmpfs

from .harness import TEST_USER, Cluster, ensure_user, start_local_cluster, user_dir, wait_for

pytestmark = pytest.mark.timeout(600)
need_podman = pytest.mark.skipif(not podman_installed(), reason="podman is not installed (scripts/test installs it)")
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL")
SECRET = "bwrap: TOPSECRET-5b1e"  # a line tool_error would quote as the runtime's own message
JOBS_PER_BATCH = 12  # before the fix, 2 to 6 jobs of 12 got the protected directory here
MAX_JOBS_PER_RACE = 48

# Swaps two names in one atomic step, as fast as it can, until the stop file appears. Run as the
# user, with the system's python (the venv may not be readable by the user).
FLIPPER = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
a, b, stop = (p.encode() for p in sys.argv[1:4])
AT_FDCWD, RENAME_EXCHANGE = -100, 2
n = 0
while not os.path.exists(stop):
    for _ in range(200):
        if libc.renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE) != 0:
            sys.exit(f"renameat2: {os.strerror(ctypes.get_errno())}")
        n += 1
print(n, flush=True)
"""


@pytest.fixture(scope="module")
def cluster():
    c = start_local_cluster(gpus=2)
    yield c
    c.close()


@pytest.fixture(scope="module")
def protected(cluster):
    """A root-only directory (0700) with, inside, what a leak would show: a world-writable dir
    holding a secret file, and a busybox rootfs whose /secret names itself."""
    top = cluster.workdir / "root-only"
    top.mkdir(mode=0o700)
    inner = top / "inner"
    inner.mkdir()
    os.chmod(inner, 0o777)
    (inner / "secret").write_text(f"{SECRET}\n")
    os.chmod(inner / "secret", 0o644)
    rootfs = busybox_rootfs(top / "rootfs")
    (rootfs / "secret").write_text("PROTECTED-ROOTFS\n")
    (top / "file").write_text(f"{SECRET}\n")
    os.chmod(top, 0o700)
    return top


def as_user(*argv: str, **kw) -> subprocess.CompletedProcess:
    pw = ensure_user(TEST_USER)
    return subprocess.run(list(argv), user=pw.pw_uid, group=pw.pw_gid, extra_groups=[], capture_output=True,
                          text=True, timeout=60, **kw)


def run_dir(cluster: Cluster, job_id: int) -> Path:
    return cluster.workdir / "spool" / "runs" / f"{job_id}.0"


def shown(cluster: Cluster, job_id: int) -> str:
    return cluster.cli("hcontrol", "show", "job", str(job_id)).stdout


# -- finding 5: the output path the shepherd reads a runtime's error from --

@pytest.mark.parametrize("swap", ["symlink", "fifo"])
def test_a_swapped_output_file_is_never_opened_as_root_and_a_setup_failure_cannot_be_faked(
        cluster, protected, swap):
    d = user_dir(cluster.workdir, TEST_USER) / f"swap-{swap}"
    d.mkdir()
    pw = ensure_user(TEST_USER)
    os.chown(d, pw.pw_uid, pw.pw_gid)
    job_id = cluster.submit("--runtime=bwrap", "-o", "out.txt", "--wrap",
                            "echo ready > ready; while [ ! -e go ]; do sleep 0.1; done; exit 1", cwd=d)
    wait_for(lambda: (d / "ready").exists(), 60, what="the job to start")
    out, status = d / "out.txt", run_dir(cluster, job_id) / "bwrap-status.json"
    replace = f"ln -s {protected / 'file'} {out}" if swap == "symlink" else f"mkfifo {out}"
    # Outside the job, as the user: stage a "setup failure" (a bwrap status without the job's exit
    # code, where the user can write one), swap the output file, let the job exit 1.
    done = as_user("sh", "-c", f"( : > {status} ) 2>/dev/null; rm -f {out} && {replace} && touch {d / 'go'}")
    try:
        assert done.returncode == 0, done.stderr
        job = cluster.wait_state(job_id, *ENDED, timeout=30)  # a shepherd stuck on a FIFO: CG for ever
    finally:
        cluster.cli("hcancel", str(job_id), check=False)  # a failed test must not hold the node
        if swap == "fifo":  # unblock a shepherd stuck opening it, so the cluster can stop
            try:
                os.close(os.open(out, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
    text = shown(cluster, job_id)
    assert "TOPSECRET" not in text, text
    assert job["state"] == "FAILED" and "could not set up" not in text, text  # the job's own exit 1


# -- finding 6: bind sources and the overlay's lower dir, flipped while jobs start --

def _flip(cluster: Cluster, name: str, real: Path, decoy_target: Path):
    """`real` (the user's) and a symlink to `decoy_target`, swapped in a loop by the user."""
    pw = ensure_user(TEST_USER)
    decoy = real.parent / f"{real.name}.decoy"
    os.symlink(decoy_target, decoy)
    os.lchown(decoy, pw.pw_uid, pw.pw_gid)
    stop = cluster.workdir / f"stop-{name}"
    proc = subprocess.Popen(["/usr/bin/python3", "-c", FLIPPER, str(real), str(decoy), str(stop)],
                            user=pw.pw_uid, group=pw.pw_gid, extra_groups=[], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    return proc, stop


def _race(cluster: Cluster, name: str, real: Path, decoy_target: Path, submit_args) -> list[tuple[dict, str]]:
    """Jobs started while `real` flips; each job's record and output."""
    work = user_dir(cluster.workdir, TEST_USER) / f"race-{name}"
    work.mkdir()
    pw = ensure_user(TEST_USER)
    os.chown(work, pw.pw_uid, pw.pw_gid)
    flipper, stop = _flip(cluster, name, real, decoy_target)
    try:
        time.sleep(0.2)
        assert flipper.poll() is None, flipper.communicate()
        jobs: list[dict] = []
        # batches until a few jobs got past every check into their container: most starts fail
        # on the decoy (the user's own open of it is refused), which proves nothing by itself
        while len(jobs) < MAX_JOBS_PER_RACE and sum("RAN" in _out(work, i) for i in range(len(jobs))) < 2:
            first = len(jobs)
            ids = [cluster.submit(*submit_args(i), "-o", f"out-{i}.txt", cwd=work)
                   for i in range(first, first + JOBS_PER_BATCH)]
            jobs += [cluster.wait_state(j, *ENDED, timeout=180) for j in ids]
    finally:
        stop.touch()
        out, err = flipper.communicate(timeout=30)
    assert flipper.returncode == 0 and int(out) > 1000, (out, err)  # it did flip, many times
    # where it stopped: put the user's directory back under its name
    if real.is_symlink():
        os.rename(real, real.parent / "tmp-swap")
        os.rename(real.parent / f"{real.name}.decoy", real)
        os.rename(real.parent / "tmp-swap", real.parent / f"{real.name}.decoy")
    return [(job, _out(work, i)) for i, job in enumerate(jobs)]


def _out(work: Path, i: int) -> str:
    path = work / f"out-{i}.txt"
    return path.read_text() if path.exists() else ""


def _assert_none_got_in(results, leak: str, protected: Path) -> None:
    leaked = [(job["id"], out) for job, out in results if leak in out]
    assert not leaked, f"jobs that reached the protected directory: {leaked}"
    assert sorted(os.listdir(protected / "inner")) == ["secret"], os.listdir(protected / "inner")
    ran = [job for job, out in results if "RAN" in out]
    assert ran, f"no job ran at all: {[(j['state'], j.get('reason')) for j, _ in results]}"


@pytest.mark.parametrize("runtime", ["runc", pytest.param("podman", marks=need_podman)])
def test_a_checkpoint_dir_flipped_to_a_protected_dir_is_never_bound(cluster, protected, runtime):
    base = user_dir(cluster.workdir, TEST_USER)
    image = base / f"img-ckpt-{runtime}"
    if not image.exists():
        busybox_rootfs(image)
    flip = base / f"flip-ckpt-{runtime}"
    flip.mkdir()
    real = flip / "ckpt"
    real.mkdir()
    pw = ensure_user(TEST_USER)
    for p in (flip, real):
        os.chown(p, pw.pw_uid, pw.pw_gid)
    script = ('cat "$HAI_CHECKPOINT_DIR/secret" 2>/dev/null; touch "$HAI_CHECKPOINT_DIR/pwned-$HAI_JOB_ID" '
              "2>/dev/null; echo RAN")
    results = _race(cluster, f"ckpt-{runtime}", real, protected / "inner",
                    lambda i: (f"--runtime={runtime}", f"--container-image={image}", f"--checkpoint-dir={real}",
                               "--wrap", script))
    _assert_none_got_in(results, "TOPSECRET", protected)


@pytest.mark.parametrize("runtime", ["bwrap", "runc", pytest.param("podman", marks=need_podman)])
def test_an_image_dir_flipped_to_a_protected_rootfs_is_never_the_containers_root(cluster, protected, runtime):
    base = user_dir(cluster.workdir, TEST_USER)
    flip = base / f"flip-img-{runtime}"
    flip.mkdir()
    pw = ensure_user(TEST_USER)
    os.chown(flip, pw.pw_uid, pw.pw_gid)
    real = busybox_rootfs(flip / "img")
    results = _race(cluster, f"img-{runtime}", real, protected / "rootfs",
                    lambda i: (f"--runtime={runtime}", f"--container-image={real}", "--wrap",
                               "cat /secret 2>/dev/null; echo RAN"))
    _assert_none_got_in(results, "PROTECTED-ROOTFS", protected)


# -- finding 8: no user string reaches a tool as an option --

def test_an_image_name_that_is_an_option_is_refused_at_submission(cluster):
    for image in ("--help", "-v", "--rootfs=/"):
        proc = cluster.cli("hsubmit", "--runtime=podman", f"--container-image={image}", "--wrap", "true",
                           check=False)
        assert proc.returncode != 0, proc.stdout
        assert "container-image" in proc.stderr and "absolute path" in proc.stderr, proc.stderr


# -- the third audit: what root unpacks from a tarball image (H1: CPU and time; H2: disk) --

@pytest.fixture(scope="module")
def image_cluster():
    """A cluster whose image cache is a 64 MiB tmpfs of its own, and the most of it ever used."""
    cache = Path(tempfile.mkdtemp(prefix="hai-imgcache-", dir="/tmp"))
    try:
        with watched_tmpfs(cache) as peak:
            c = start_local_cluster(gpus=1, node="imgnode",
                                    agent_toml=f'[isolation]\nimage_cache = "{cache / "images"}"\n')
            try:
                yield c, cache, peak
            finally:
                c.close()
    finally:
        os.rmdir(cache)


def users_image(cluster: Cluster, name: str, data: bytes | None = None) -> Path:
    d = user_dir(cluster.workdir, TEST_USER)
    path = d / name
    if data is not None:
        path.write_bytes(data)
        pw = ensure_user(TEST_USER)
        os.chown(path, pw.pw_uid, pw.pw_gid)
    return path


def shepherd_gone(cluster: Cluster, job_id: int) -> bool:
    rec = spool.read_json(run_dir(cluster, job_id) / spool.SHEPHERD) or {}
    return not spool.same_process(rec.get("pid"), rec.get("starttime"))


def test_the_audits_bzip2_bomb_fails_at_once_and_leaves_no_shepherd_spinning(image_cluster):
    cluster, cache, _ = image_cluster
    image = users_image(cluster, "bomb.tar.bz2", bz2_bomb(b"Z", 2**50, 1000))  # 100 GiB of zeros in 113 KB
    started = time.monotonic()
    job_id = cluster.submit("--runtime=runc", f"--container-image={image}", "--wrap", "echo RAN",
                            cwd=image.parent)
    try:
        job = cluster.wait_state(job_id, *ENDED, timeout=60)  # before the fix: a shepherd at 100 % for minutes
    finally:
        cluster.cli("hcancel", str(job_id), check=False)
    assert time.monotonic() - started < 30
    assert job["state"] == "FAILED", job
    text = shown(cluster, job_id)
    assert f"container image {image}: archive member 'bomb' is of an unknown type b'Z'" in text, text
    wait_for(lambda: shepherd_gone(cluster, job_id), 10, what="the shepherd to exit")
    assert not [n for n in os.listdir(cache / "images") if n.startswith(".unpack-")]


def test_a_cancel_ends_a_slow_unpack(image_cluster):
    """The shepherd unpacks before it supervises the job; a SIGTERM does nothing then. The agent's
    terminate request does: the job is CANCELLED in seconds, not when the unpack is done."""
    cluster, cache, peak = image_cluster
    image = users_image(cluster, "slow.tar.bz2", slow_image(16))  # ~40 s to unpack here, in 20 KB
    job_id = cluster.submit("--runtime=runc", f"--container-image={image}", "--wrap", "echo RAN",
                            cwd=image.parent)
    try:
        wait_for(lambda: (cache / "images").is_dir() and any(
            n.startswith(".unpack-") for n in os.listdir(cache / "images")), 60, what="the unpack to begin")
        cancelled = time.monotonic()
        cluster.cli("hcancel", str(job_id))
        job = cluster.wait_state(job_id, *ENDED, timeout=60)
        took = time.monotonic() - cancelled
    finally:
        cluster.cli("hcancel", str(job_id), check=False)
    assert job["state"] == "CANCELLED" and took < 10, (job, took)
    # the job shows "cancelled by" its user; the run's own end is in the agent's log
    ended = f"launch_failed: container image {image}: the run was cancelled while its image was unpacked"
    assert ended in (cluster.workdir / "agent.log").read_text()
    wait_for(lambda: shepherd_gone(cluster, job_id), 10, what="the shepherd to exit")
    assert not [n for n in os.listdir(cache / "images") if n.startswith(".unpack-")]
    assert peak[0] < 8 << 20, peak  # 16 GiB of zeros unpacked as holes, and no copy


def test_a_sparse_file_as_image_fails_without_filling_the_cache(image_cluster):
    """`truncate -s 2G` costs the user nothing; before the fix root copied it into the cache, and
    a spool so filled drained the node (other users' runs could not write their status)."""
    cluster, cache, peak = image_cluster
    image = users_image(cluster, "sparse.tar")
    made = as_user("truncate", "-s", "2G", str(image))
    assert made.returncode == 0, made.stderr
    job_id = cluster.submit("--runtime=runc", f"--container-image={image}", "--wrap", "echo RAN",
                            cwd=image.parent)
    try:
        job = cluster.wait_state(job_id, *ENDED, timeout=120)
    finally:
        cluster.cli("hcancel", str(job_id), check=False)
    assert job["state"] == "FAILED", job
    assert f"container image {image}: the archive has no members" in shown(cluster, job_id)
    assert peak[0] < 8 << 20, peak  # nowhere near the 64 MiB (the copy took it all, then ENOSPC)
    st = os.statvfs(cache)
    assert (st.f_blocks - st.f_bfree) * st.f_frsize < 1 << 20
