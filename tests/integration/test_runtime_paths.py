"""The container runtimes' handling of paths a user controls, piece by piece, as root with the
real test user and the real runtimes (docs/SECURITY.md, "Paths the root side opens for a job"):

- the runtime's error message is read from the job's error file as the user, only from a regular
  file, never through a symlink, never waiting on a FIFO, only its tail;
- bwrap's setup status comes through a pipe the shepherd holds, not a file the user can write;
- an image tarball is opened as the user and read only if it is a regular file;
- unpacking stops at the caps (bytes, entries, extended headers, tarball size), never follows a
  link (symlinks, hard links to symlinks, members that replace a symlink), skips device nodes;
- the image cache evicts the least recently used images that no run holds, and only those;
- what the cache unpacks is exactly what it hashed: a tarball its user rewrites between the
  reads is refused, never cached under the hash of what it was (another user's image);
- an unpack is bounded in time, CPU and disk (the third audit): a member of an unknown type or
  data on a non-regular member is refused (the audit's bzip2 bomb, at once), the decompressed
  stream is capped, a cancel or the time budget ends a slow unpack, and a sparse tarball or an
  archive of zeros never fills the cache's file system (a small tmpfs);
- an image name that is an option is refused at submission and by the podman runtime.

The races themselves (a path flipped while jobs start) are end to end:
tests/e2e/test_security_containers.py."""
from __future__ import annotations

import bz2
import contextlib
import functools
import gzip
import io
import json
import os
import stat
import subprocess
import tarfile
import threading
import time
from pathlib import Path

import pytest

from hai_cluster.agent import spool
from hai_cluster.agent.isolation import NodeIsolation
from hai_cluster.protocol.runspec import RunSpec
from hai_cluster.agent.runtimes import Context, Launch, RuntimeRefused, common
from hai_cluster.agent.runtimes.bwrap import Bwrap
from hai_cluster.agent.runtimes.cache import ImageLimits, acquire, evict
from hai_cluster.agent.runtimes.common import image_rootfs, tool_error
from hai_cluster.agent.runtimes.rootfs import RootfsError
from hai_cluster.config import ConfigError, load_agent_config
from hai_cluster.core.jobscript import JobScriptError, parse_submission

from .agent_helpers import Sandbox, client, need_root, run, run_to_end
from .test_agent_containers import fake_gpu_nodes, isolation_agent, podman_installed

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def context(box: Sandbox, **spec) -> Context:
    """A runtime Context for a run of the test user's, with its run dir in the sandbox."""
    run_dir = box.base / "run"
    run_dir.mkdir(mode=0o711, exist_ok=True)
    wire = {**box.spec("#!/bin/sh\n"), **spec}
    rs = RunSpec.from_wire(wire)
    node = NodeIsolation(node="n", image_cache=str(box.base / "cache"))
    return Context(spec=rs, run_dir=run_dir, node=node, groups=[box.user.pw_gid], env={},
                   script=str(run_dir / "script"), control=str(run_dir / "control"), cgroup_path=None)


def root_only_file(box: Sandbox, text: str) -> Path:
    d = box.base / "root-only"
    d.mkdir(mode=0o700, exist_ok=True)
    f = d / "secret"
    f.write_text(text)
    return f


def within(seconds: float, fn, unblock=None):
    """fn()'s result, or a failed test if it does not return in time (unblock() then frees it)."""
    out: dict = {}
    t = threading.Thread(target=lambda: out.setdefault("value", fn()), daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        if unblock is not None:
            unblock()
        t.join(10)
        pytest.fail(f"still blocked after {seconds} s")
    return out.get("value")


def _open_writer(path: Path) -> None:
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass


# -- the runtime's error message, from the job's file --

def test_the_runtimes_error_is_read_as_the_user_from_a_regular_file_only(box):
    out = box.work / "job.out"
    ctx = context(box, stdout=str(out))
    os.symlink(root_only_file(box, "bwrap: TOPSECRET\n"), out)
    assert within(10, lambda: tool_error(ctx, "bwrap:")) == f"see {out}"  # not the root-only file
    out.unlink()
    os.mkfifo(out)
    os.chown(out, box.user.pw_uid, box.user.pw_gid)
    assert within(10, lambda: tool_error(ctx, "bwrap:"), lambda: _open_writer(out)) == f"see {out}"
    out.unlink()
    # a file the user cannot read, even their own name for it: read as the user, not as root
    secret = box.work / "unreadable"
    secret.write_text("bwrap: TOPSECRET\n")
    os.chmod(secret, 0o600)
    os.link(secret, out)
    assert tool_error(ctx, "bwrap:") == f"see {out}"
    out.unlink()
    # the usual case: the tool's last message, from the end of a (large, sparse) file
    with open(out, "wb") as f:
        f.write(b"bwrap: an early line\n")
        f.seek(8 * 2**30)
        f.write(b"\njob output\nbwrap: Can't find source path /x: No such file or directory\n")
    os.chown(out, box.user.pw_uid, box.user.pw_gid)
    assert within(5, lambda: tool_error(ctx, "bwrap:", strip=True)) == \
        " Can't find source path /x: No such file or directory"


def _bwrap_status(box: Sandbox, argv: list[str], out: Path) -> tuple[int, Launch]:
    """Real bwrap, as the user, its stderr into `out` and its status into a pipe, as a Launch of
    the bwrap runtime has them; its wait status."""
    r, w = os.pipe()
    os.set_blocking(r, False)
    with open(out, "ab") as err:
        proc = subprocess.Popen(["bwrap", "--json-status-fd", str(w), *argv], pass_fds=(w,), stderr=err,
                                stdout=err, user=box.user.pw_uid, group=box.user.pw_gid, extra_groups=[])
    os.close(w)
    proc.wait(30)
    status = (proc.returncode & 0xff) << 8 if proc.returncode >= 0 else -proc.returncode
    return status, Launch(argv=[], env={}, status_fd=r)


def test_a_bwrap_setup_failure_comes_from_its_status_pipe_not_from_a_file(box):
    out = box.work / "job.out"
    out.touch()
    os.chown(out, box.user.pw_uid, box.user.pw_gid)
    ctx = context(box, stdout=str(out))
    # a sandbox that cannot be set up: bwrap's own message, from the user's file
    status, launch = _bwrap_status(box, ["--ro-bind", "/", "/", "--bind", "/nonexistent", "/x", "true"], out)
    assert Bwrap().after_exit(ctx, launch, status) == \
        "bwrap could not set up the container: bwrap: Can't find source path /nonexistent: No such file or directory"
    # a job that exits 1 is the job's failure, whatever the user writes where a status file was
    status, launch = _bwrap_status(box, ["--ro-bind", "/", "/", "sh", "-c", "exit 1"], out)
    assert os.WEXITSTATUS(status) == 1
    assert Bwrap().after_exit(ctx, launch, status) is None
    # bytes the job added to the pipe (through /proc/PID/fd, as the user) cannot hide bwrap's record
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.write(w, b'{"junk": ')
    os.write(w, b'{ "exit-code": 1 }\n')
    assert Bwrap().after_exit(ctx, Launch(argv=[], env={}, status_fd=r), 1 << 8) is None
    os.close(w)


def test_a_bwrap_job_leaves_no_file_of_the_users_in_its_run_dir(box):
    """The status went to a file in the run dir, chowned to the user: who could write a fake."""
    devices = fake_gpu_nodes(box.base / "fakedev", 2)
    agent = isolation_agent(box, "pathnode", f'device_dir = "{devices}"\n').start()
    try:
        spec = box.spec("#!/bin/sh\nexit 1\n", runtime="bwrap")

        ended = run_to_end(agent, spec)
        assert ended["exit_code"] == 1 and ended["reason"] is None, ended
        from hai_cluster.agent import spool
        rd = spool.runs_dir(box.spool) / spool.run_dir_name(spec["job_id"], 0)
        mine = [p.name for p in rd.rglob("*") if p.lstat().st_uid == box.user.pw_uid]
        assert mine == [spool.SCRIPT], mine
    finally:
        agent.stop()


def test_a_real_bwrap_setup_failure_still_names_its_reason(box):
    """GPU device nodes bwrap (as the user) cannot reach: bwrap fails before the job runs."""
    hidden = box.base / "hidden"
    hidden.mkdir(mode=0o700)
    devices = fake_gpu_nodes(hidden / "dev", 2)
    agent = isolation_agent(box, "pathnode2", f'device_dir = "{devices}"\n').start()
    try:
        spec = box.spec("#!/bin/sh\necho ran\n", runtime="bwrap", gpus=[1])

        ended = run_to_end(agent, spec)
        assert ended["reason"] == "launch_failed", ended
        assert ended["message"].startswith("bwrap could not set up the container: bwrap: "), ended
        assert f"{devices}/nvidia1" in ended["message"], ended
    finally:
        agent.stop()


# -- image tarballs --

def test_an_image_that_is_a_fifo_or_a_device_is_refused_without_waiting(box):
    fifo = box.work / "image.tar"
    os.mkfifo(fifo)
    os.chown(fifo, box.user.pw_uid, box.user.pw_gid)
    ctx = context(box, runtime="runc", container_image=str(fifo))

    def attempt(c):
        try:
            image_rootfs(c)
        except RuntimeRefused as exc:
            return str(exc)
        return "accepted"
    assert within(10, lambda: attempt(ctx), lambda: _open_writer(fifo)) == \
        f"container image {fifo}: neither a directory nor a regular file"
    assert within(10, lambda: attempt(context(box, runtime="runc", container_image="/dev/zero"))) == \
        "container image /dev/zero: neither a directory nor a regular file"


def tar_bytes(members, fmt=tarfile.PAX_FORMAT, compress=False) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
        for info, data in members:
            tf.addfile(info, io.BytesIO(data) if data is not None else None)
    raw = buf.getvalue()
    return gzip.compress(raw, 1) if compress else raw


def memfd(data: bytes) -> int:
    fd = os.memfd_create("image")
    os.write(fd, data)
    return fd


def member(name, kind=tarfile.REGTYPE, data=b"", mode=0o644, link="", size=None):
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.linkname = kind, mode, link
    info.size = (len(data) if size is None else size) if kind == tarfile.REGTYPE else 0
    return info, data if kind == tarfile.REGTYPE else None


class Zeros(io.RawIOBase):
    """`size` zero bytes, read lazily (a member's content without holding it in memory)."""

    def __init__(self, size: int) -> None:
        self.left = size

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        n = min(len(b), self.left)
        b[:n] = bytes(n)
        self.left -= n
        return n


def test_unpacking_stops_at_its_caps_and_leaves_nothing(tmp_path):
    cache = str(tmp_path / "cache")
    limits = ImageLimits(max_bytes=1 << 20, max_entries=10)
    many = tar_bytes([member(f"f{i}") for i in range(11)])
    with pytest.raises(RootfsError, match=r"more than 10 entries \(isolation.image_max_entries\)"):
        acquire(memfd(many), "many.tar", cache, limits)
    # a gzip bomb: 64 MiB of zeros in a small file, refused when the header says so
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tf:
        tf.addfile(member("zeros", size=64 << 20)[0], io.BufferedReader(Zeros(64 << 20)))
    assert len(buf.getvalue()) < 2 << 20
    with pytest.raises(RootfsError, match=r"unpacks to more than 1048576 bytes \(isolation.image_max_bytes\)"):
        acquire(memfd(buf.getvalue()), "bomb.tar.gz", cache, limits)
    # an extended header tarfile would hold in memory whole
    big_pax = tarfile.TarInfo("f")
    big_pax.pax_headers = {"comment": "x" * (200 * 1024)}
    with pytest.raises(RootfsError, match="an extended header of"):
        acquire(memfd(tar_bytes([(big_pax, b"")])), "pax.tar", cache, limits)
    # a tarball larger than anything it may unpack to is not even read
    with pytest.raises(RootfsError, match="the tarball is"):
        acquire(memfd(bytes(limits.max_tarball() + 1)), "huge.tar", cache, limits)
    assert os.listdir(cache) == []  # no image, no lock file, no half-unpacked dir


def test_unpacking_never_follows_a_link(tmp_path):
    need_root()  # ownership from the archive
    outside = tmp_path / "outside"
    outside.mkdir()
    target = outside / "victim"
    target.write_text("untouched")
    image = acquire(memfd(tar_bytes([
        member("bin", tarfile.DIRTYPE, mode=0o2775),
        member("bin/ln", tarfile.SYMTYPE, link=str(target)),
        member("bin/hard", tarfile.LNKTYPE, link="bin/ln"),  # a hard link to the symlink itself
        member("bin/ln", data=b"replaced"),  # replaces the symlink: written to a new file
        member("dev/sda", tarfile.BLKTYPE), member("dev/tty9", tarfile.CHRTYPE), member("fifo", tarfile.FIFOTYPE),
    ])), "ok.tar", str(tmp_path / "cache"))
    root = Path(image.path)
    assert target.read_text() == "untouched"
    assert (root / "bin/ln").read_text() == "replaced" and not (root / "bin/ln").is_symlink()
    assert os.readlink(root / "bin/hard") == str(target)  # still only a symlink, inside the container
    assert stat.S_IMODE((root / "bin").stat().st_mode) == 0o775  # no setgid dir
    assert not (root / "dev/sda").exists() and not (root / "dev/tty9").exists() and not (root / "fifo").exists()
    os.close(image.lock)
    for members in ([member("d", tarfile.SYMTYPE, link=str(outside)), member("h", tarfile.LNKTYPE, link="d/victim")],
                    [member("d", tarfile.SYMTYPE, link=str(outside)), member("d/new", data=b"x")],
                    [member("h", tarfile.LNKTYPE, link="../outside/victim")]):
        with pytest.raises(RootfsError):
            acquire(memfd(tar_bytes(members)), "evil.tar", str(tmp_path / "cache"))
    assert sorted(os.listdir(outside)) == ["victim"] and target.stat().st_nlink == 1


# -- bounded unpacks (the third audit: H1, CPU and time; H2, disk) --

@functools.cache
def bz2_zeros() -> bytes:
    """100 MiB of zeros in one bzip2 stream of 113 bytes."""
    return bz2.compress(bytes(100 << 20), 9)


def bz2_bomb(kind: bytes, size: int, streams: int) -> bytes:
    """The audit's bomb: one member of type `kind` whose header claims `size` bytes, then
    `streams` bzip2 streams of 100 MiB of zeros each (a tar stream of zeros, all read to skip it)."""
    info = tarfile.TarInfo("bomb")
    info.type, info.size = kind, size
    return bz2.compress(info.tobuf(format=tarfile.GNU_FORMAT)) + bz2_zeros() * streams + bz2.compress(bytes(10240))


def test_the_audits_bzip2_bomb_is_refused_at_once(tmp_path):
    """11 MB on disk, ~10 TB decompressed: a member of the unknown type 'Z' claiming 2^50 bytes,
    which tarfile skipped by decompressing all of it (a root shepherd at 100 % CPU for hours,
    uncancellable). Here 1000 streams, 100 GiB: minutes of CPU before the fix."""
    cache = str(tmp_path / "cache")
    limits = ImageLimits(64 << 30, 500_000, 256 << 30, 600)  # the defaults
    bomb = bz2_bomb(b"Z", 2**50, 1000)
    assert len(bomb) < 200_000

    def refused(data: bytes) -> str:
        try:
            acquire(memfd(data), "bomb.tar.bz2", cache, limits)
        except RootfsError as exc:
            return str(exc)
        return "accepted"
    started = time.monotonic()
    assert within(20, lambda: refused(bomb)) == "archive member 'bomb' is of an unknown type b'Z'"
    assert time.monotonic() - started < 5
    # data on what is not a regular file: refused too, whatever tarfile would do with it
    for kind in (tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.CHRTYPE, tarfile.FIFOTYPE):
        assert within(20, lambda: refused(bz2_bomb(kind, 2**40, 10))) == \
            "archive member 'bomb' has 1099511627776 bytes of data but is not a regular file"
    # an unknown type in a plain tarball, with no data at all
    info = tarfile.TarInfo("odd")
    info.type = b"V"
    with pytest.raises(RootfsError, match=r"archive member 'odd' is of an unknown type b'V'"):
        acquire(memfd(tar_bytes([(info, None), member("ok", data=b"x")], fmt=tarfile.GNU_FORMAT)), "odd.tar", cache)
    assert os.listdir(cache) == []


def test_the_decompressed_stream_is_capped(tmp_path):
    """What no member's size counts (its extended headers, under MAX_HEADER each) still counts
    against the stream's cap: the contents, and 1.5 KiB of headers a member, whatever the ratio."""
    cache = str(tmp_path / "cache")
    limits = ImageLimits(max_bytes=64 << 10, max_entries=10)
    members = []
    for i in range(10):
        info, data = member(f"f{i}", data=b"x")
        info.pax_headers = {"comment": "x" * 60_000}
        members.append((info, data))
    tarball = gzip.compress(tar_bytes(members))  # 600 KB of headers for 10 bytes
    assert len(tarball) < limits.max_tarball()  # small enough to be read
    with pytest.raises(RootfsError, match=r"it decompresses to more than 146432 bytes"):
        acquire(memfd(tarball), "headers.tar.gz", cache, limits)
    assert os.listdir(cache) == []


def test_what_tarfile_holds_in_memory_before_a_members_data_is_bounded(tmp_path):
    """A GNU sparse map is read whole before the member's data (old GNU: 512-byte extension
    blocks; pax 1.0: a line per number), and kept at 5 to 20 times its size; global headers are
    kept for the rest of the archive: each is bounded, whatever the caps on the contents."""
    cache = str(tmp_path / "cache")
    # old GNU sparse: the extension blocks of a map of 100 000 extents (21 a block)
    info = tarfile.TarInfo("sparse")
    info.type, info.size = tarfile.GNUTYPE_SPARSE, 0
    header = bytearray(info.tobuf(format=tarfile.GNU_FORMAT))
    header[482] = 1  # isextended
    header[148:156] = b"%06o\0 " % (sum(header[:148]) + sum(header[156:]) + 8 * 32)
    block = bytearray(512)
    for i in range(21):
        block[i * 24:(i + 1) * 24] = b"%011o\0%011o\0" % ((i + 1) * 4096, 512)
    block[504] = 1
    gnu = bytes(header) + bytes(block) * 5000 + bytes(block[:504]) + bytes(8) + bytes(1024)
    # pax GNU.sparse 1.0: a map of 10 million numbers at the start of the member's data
    pax = tarfile.TarInfo("f")
    pax.pax_headers = {"GNU.sparse.major": "1", "GNU.sparse.minor": "0", "GNU.sparse.name": "f",
                       "GNU.sparse.realsize": "4096"}
    numbers = b"5000000\n" + b"0\n" * 10_000_000
    pax.size = len(numbers) + 512
    one_oh = tar_bytes([(pax, numbers + b"x" * 512)])
    for name, data in (("gnu.tar", gnu), ("pax.tar.gz", gzip.compress(one_oh, 1))):
        with pytest.raises(RootfsError, match=r"the headers of a member take more than 282624 bytes"):
            acquire(memfd(data), name, cache, ImageLimits(64 << 30, 500_000))
    # global headers: 64 KiB in all (git archive writes one of 52 bytes)
    headers = tarfile.TarInfo._create_pax_generic_header({"comment": "x" * 30_000}, tarfile.XGLTYPE, "utf-8")
    with pytest.raises(RootfsError, match="global extended headers of more than 65536 bytes"):
        acquire(memfd(b"".join(headers + member(f"f{i}")[0].tobuf(tarfile.USTAR_FORMAT) for i in range(3))
                      + bytes(1024)), "global.tar", cache)
    # what tarfile's parsers raise on a damaged header is a refusal too, not a crash
    with pytest.raises(RootfsError, match="cannot unpack bad.tar: "):
        acquire(memfd(tar_bytes([(pax, b"5\n" + b"1" * (pax.size - 2))])), "bad.tar", cache)
    assert os.listdir(cache) == []


def slow_image(gib: int) -> bytes:
    """A tarball that takes a while to unpack (a regular member of `gib` GiB of zeros, bzip2'd:
    ~2.5 s a GiB here, and no disk: zeros are left as holes)."""
    return bz2_bomb(tarfile.REGTYPE, gib * 10 * (100 << 20), gib * 10)


def test_a_cancel_or_the_time_budget_ends_a_slow_unpack(box):
    """The shepherd unpacks before its supervise loop, where a SIGTERM does nothing: the agent's
    terminate.json (written before it signals) is what the unpack looks at, every few MiB."""
    image = box.work / "slow.tar.bz2"
    image.write_bytes(slow_image(6))
    os.chown(image, box.user.pw_uid, box.user.pw_gid)
    ctx = context(box, runtime="runc", container_image=str(image))
    request = ctx.run_dir / spool.TERMINATE
    cache = Path(ctx.node.image_cache)

    def attempt() -> tuple[str, float]:
        started = time.monotonic()
        try:
            image_rootfs(ctx)
        except RuntimeRefused as exc:
            return str(exc), time.monotonic() - started
        return "accepted", time.monotonic() - started

    def terminate(reason: str, after: float) -> threading.Timer:
        timer = threading.Timer(after, lambda: spool.write_json_atomic(request, {"reason": reason, "time": 0}))
        timer.start()
        return timer

    try:
        terminate("cancel", 1.0)
        message, took = within(60, attempt)
        assert message == f"container image {image}: the run was cancelled while its image was unpacked"
        assert took < 3, took  # the whole unpack takes ~15 s
        assert [n for n in os.listdir(cache) if not n.endswith(".lock")] == []
        # a preempt lets it go on (the run then starts and is preempted as usual; a refused launch
        # would fail the job): here the time budget ends it
        request.unlink()
        terminate("preempt", 0.5).join()
        with pytest.raises(RootfsError, match=r"unpacking it took more than 2 s \(isolation.image_unpack_timeout\)"):
            fd = os.open(image, os.O_RDONLY)
            try:
                acquire(fd, str(image), str(cache), ImageLimits(unpack_timeout=2),
                        cancelled=lambda: common._cancel_requested(ctx))
            finally:
                os.close(fd)
        assert [n for n in os.listdir(cache) if not n.endswith(".lock")] == []
    finally:
        if request.exists():
            request.unlink()


@contextlib.contextmanager
def watched_tmpfs(mnt: Path, size: str = "64m"):
    """`mnt` as a tmpfs of `size`; yields a one-item list: the most of it used while it was open."""
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(mnt)], check=True)
    peak, stop = [0], threading.Event()

    def watch():
        while not stop.is_set():
            st = os.statvfs(mnt)
            peak[0] = max(peak[0], (st.f_blocks - st.f_bfree) * st.f_frsize)
            time.sleep(0.002)
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield peak
    finally:
        stop.set()
        watcher.join()
        if subprocess.run(["umount", str(mnt)]).returncode != 0:  # a failed test's fd still open there
            subprocess.run(["umount", "-l", str(mnt)], check=True)


@pytest.fixture
def small_fs(tmp_path):
    """A 64 MiB tmpfs for the image cache, and the most of it that was ever used while the test ran."""
    need_root()
    mnt = tmp_path / "small"
    mnt.mkdir()
    with watched_tmpfs(mnt) as peak:
        yield mnt, peak


def test_a_sparse_tarball_never_fills_the_image_cache(tmp_path, small_fs):
    """`truncate -s 2G` costs the user no disk; before the fix the cache copied it, as root, into
    the spool (which filled, and the node drained). No copy now, and zeros stay holes."""
    mnt, peak = small_fs
    cache = str(mnt / "cache")
    sparse = tmp_path / "sparse.tar"
    subprocess.run(["truncate", "-s", "2G", str(sparse)], check=True)
    fd = os.open(sparse, os.O_RDONLY)
    try:
        with pytest.raises(RootfsError, match="the archive has no members"):
            acquire(fd, "sparse.tar", cache, ImageLimits(64 << 30, 500_000, 256 << 30, 600))
    finally:
        os.close(fd)
    assert peak[0] < 1 << 20, peak  # nothing but the cache's own dirs
    # a real header before the holes: a member of 1.5 GiB of zeros, a hole in the cache as well,
    # counted at its full size against image_max_bytes
    info = tarfile.TarInfo("zeros")
    info.size = 3 << 29
    with open(sparse, "wb") as f:
        f.write(info.tobuf(format=tarfile.GNU_FORMAT))
        f.truncate(512 + info.size + 10240)
    fd = os.open(sparse, os.O_RDONLY)
    try:
        with pytest.raises(RootfsError, match=r"it unpacks to more than 1073741824 bytes"):
            acquire(fd, "sparse.tar", cache, ImageLimits(1 << 30, 500_000))
        image = acquire(fd, "sparse.tar", cache)
    finally:
        os.close(fd)
    st = os.stat(Path(image.path) / "zeros")
    assert st.st_size == 3 << 29 and st.st_blocks == 0
    assert json.loads(Path(f"{image.path}.lock").read_text())["bytes"] == 3 << 29
    os.close(image.lock)
    assert peak[0] < 1 << 20, peak


def test_an_unpack_stops_before_the_cache_fills(tmp_path, small_fs):
    """Real data (not zeros) that would fill the file system: the unpack stops while a fifth of a
    small one (5 %, at least 1 GiB, of a big one) is still free, and leaves nothing."""
    mnt, peak = small_fs
    cache = str(mnt / "cache")
    ones = 200 << 20
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tf:
        tf.addfile(member("ones", size=ones)[0], io.BufferedReader(Ones(ones)))
    with pytest.raises(RootfsError, match=r"the image cache's file system \(.*\) is nearly full: \d+ bytes free, "
                                          r"and an unpack leaves at least 13421772"):
        acquire(memfd(buf.getvalue()), "ones.tar.gz", cache, ImageLimits(64 << 30, 500_000, 256 << 30, 600))
    assert os.listdir(cache) == []
    assert (64 << 20) - peak[0] > 8 << 20, peak  # never near full (it stops by 51.2 MiB, + a few MiB)
    st = os.statvfs(mnt)
    assert (st.f_blocks - st.f_bfree) * st.f_frsize < 1 << 20


def test_a_nearly_full_cache_makes_room_from_the_images_no_run_holds(tmp_path, small_fs):
    """The cache's file system, not only image_cache_max_bytes, decides when unused images go:
    a cache allowed more than its disk still takes new images while old ones are unused."""
    mnt, _ = small_fs
    cache = str(mnt / "cache")

    def image(tag: str, size: int) -> int:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tf:
            tf.addfile(member("tag", data=tag.encode())[0], io.BytesIO(tag.encode()))
            tf.addfile(member("ones", size=size)[0], io.BufferedReader(Ones(size)))
        return memfd(buf.getvalue())
    old = acquire(image("old", 40 << 20), "old.tar.gz", cache)
    (mnt / "other").write_bytes(b"\1" * (12 << 20))  # what else is on that disk: 12 MiB free are left
    with pytest.raises(RootfsError, match="is nearly full"):  # the old image is in use: it stays
        acquire(image("new", 1 << 20), "new.tar.gz", cache)
    assert os.path.isdir(old.path)
    os.close(old.lock)  # its run ended
    new = acquire(image("new", 1 << 20), "new.tar.gz", cache)
    assert not os.path.exists(old.path) and Path(new.path, "tag").read_text() == "new"
    os.close(new.lock)


class Ones(Zeros):
    def readinto(self, b) -> int:
        n = min(len(b), self.left)
        b[:n] = b"\1" * n
        self.left -= n
        return n


# -- the image cache --

def image_of(tag: str, size: int) -> int:
    return memfd(tar_bytes([member("tag", data=tag.encode()), member("blob", data=bytes(size))]))


def test_the_cache_evicts_the_least_recently_used_images_no_run_holds(tmp_path):
    cache = str(tmp_path / "cache")
    limits = ImageLimits(cache_max_bytes=250_000)
    a = acquire(image_of("a", 100_000), "a.tar", cache, limits)  # held: a run uses it
    b = acquire(image_of("b", 100_000), "b.tar", cache, limits)
    os.close(b.lock)  # its run ended
    for path, when in ((a.path, 1000), (b.path, 2000)):  # a is the older use
        os.utime(f"{path}.lock", (when, when))
    c = acquire(image_of("c", 100_000), "c.tar", cache, limits)
    assert os.path.isdir(a.path) and os.path.isdir(c.path)  # a is older, but in use
    assert not os.path.exists(b.path) and not os.path.exists(f"{b.path}.lock")
    assert json.loads(Path(f"{c.path}.lock").read_text())["bytes"] == 100_001
    os.close(a.lock)
    os.close(c.lock)
    os.utime(f"{c.path}.lock", (3000, 3000))
    d = acquire(image_of("d", 100_000), "d.tar", cache, limits)  # now a, the least recent, goes
    assert not os.path.exists(a.path) and os.path.isdir(c.path) and os.path.isdir(d.path)
    # a cache hit is a use: it moves the image to the back of the queue
    again = acquire(image_of("c", 100_000), "c.tar", cache, limits)
    assert again.path == c.path and os.stat(f"{c.path}.lock").st_mtime > time.time() - 60
    os.close(again.lock)
    os.close(d.lock)


def _tagged(tag: bytes) -> bytes:
    """An image whose /tag holds `tag`: the user's rewrite changes only those bytes, not the size."""
    return tar_bytes([member("tag", data=tag), member("bin", tarfile.DIRTYPE), member("bin/tool", data=b"x" * 5000)])


def test_what_is_unpacked_is_exactly_what_was_hashed(tmp_path, monkeypatch):
    """The cache is keyed by the tarball's hash and shared by every user: a user who rewrites their
    copy of another user's image once the hash has read it (the audit timed it with mincore) must
    never put their bytes under that image's hash (issue 18, H2)."""
    import hashlib

    from hai_cluster.agent.runtimes import cache as cache_mod
    good, evil = _tagged(b"GOOD"), _tagged(b"EVIL")
    assert len(good) == len(evil)
    digest = hashlib.sha256(good).hexdigest()
    cache = str(tmp_path / "cache")
    users = tmp_path / "image.tar"  # the user's file, rewritten in place (same inode, same size)

    def rewrite(data: bytes):
        def at(fn):
            def hooked(*args, **kw):
                if not done:
                    done.append(1)
                    with open(users, "r+b") as f:
                        f.write(data)
                return fn(*args, **kw)
            return hooked
        return at

    # 1. rewritten after the hash, before the unpack reads it: refused, nothing cached
    for data in (evil, good + b"\0" * 512):  # other bytes; more bytes (the reads stop at the size)
        users.write_bytes(good)
        done: list = []
        monkeypatch.setattr(cache_mod, "_lock", rewrite(data)(cache_mod._lock))
        fd = os.open(users, os.O_RDONLY)
        with pytest.raises(RootfsError, match="the image changed while it was read"):
            acquire(fd, "image.tar", cache)
        os.close(fd)
        monkeypatch.undo()
        assert done and os.listdir(cache) == []  # no image, no lock file, no copy
    # 2. rewritten once the unpack has begun, before it read the bytes: it reads the user's file
    # itself, once (no copy: the third audit's H2), and what it read is not what it hashed
    users.write_bytes(good)
    done = []
    seen: list = []

    def extract(*args):
        seen.append(sorted(n for n in os.listdir(cache) if not n.endswith(".lock")))
        return real_extract(*args)
    real_extract = cache_mod.extract
    monkeypatch.setattr(cache_mod, "extract", rewrite(evil)(extract))
    fd = os.open(users, os.O_RDONLY)
    with pytest.raises(RootfsError, match="the image changed while it was read"):
        acquire(fd, "image.tar", cache)
    os.close(fd)
    monkeypatch.undo()
    assert done and len(seen) == 1 and [n.startswith(".unpack-") for n in seen[0]] == [True], seen  # no copy
    assert os.listdir(cache) == []  # the EVIL it unpacked is gone, and never had the name of the GOOD
    # 3. rewritten after the unpack read it all: what was unpacked is what was hashed, GOOD
    users.write_bytes(good)
    done = []
    monkeypatch.setattr(cache_mod, "_record", rewrite(evil)(cache_mod._record))
    fd = os.open(users, os.O_RDONLY)
    image = acquire(fd, "image.tar", cache)
    os.close(fd)
    monkeypatch.undo()
    assert done and users.read_bytes() == evil
    assert image.path == os.path.join(cache, digest)
    assert Path(image.path, "tag").read_bytes() == b"GOOD"
    assert sorted(os.listdir(cache)) == sorted([digest, f"{digest}.lock"])
    os.close(image.lock)
    # another user's job with the untouched tarball gets the image it hashed
    again = acquire(memfd(good), "theirs.tar", cache)
    assert again.path == image.path and Path(again.path, "tag").read_bytes() == b"GOOD"
    os.close(again.lock)


# Flips a few bytes of a file between two values until the stop file appears; run as the user.
FLIPPER = r"""
import os, sys, time
path, offset, a, b, stop = sys.argv[1], int(sys.argv[2]), sys.argv[3].encode(), sys.argv[4].encode(), sys.argv[5]
fd, n = os.open(path, os.O_WRONLY), 0
while not os.path.exists(stop):
    for data in (a, b):
        os.pwrite(fd, data, offset)
        time.sleep(0.0002)
    n += 1
print(n, flush=True)
"""
GOOD, EVIL = "GOOD-IMAGE-1f3a", "EVIL-IMAGE-1f3a"


def test_a_tarball_rewritten_while_its_users_jobs_start_never_reaches_another_users_job(box):
    """The audit's attack end to end, with a real agent and runc: the test user copies a tarball
    that another user uses and flips its bytes in a loop while their own jobs start; the other
    user's jobs, with the untouched root-owned tarball, must always get its real content. The
    cache keeps one image (image_cache_max_bytes = 1), so the shared image is unpacked again and
    again, each time by whoever comes first."""
    import hashlib

    from tests.e2e.harness import OTHER_USER, ensure_user

    from .test_agent_containers import busybox_rootfs
    images = box.base / "images"
    images.mkdir(mode=0o755)
    rootfs = busybox_rootfs(images / "rootfs")
    shared = images / "shared.tar"  # root's, 0644: the other user's image
    with tarfile.open(shared, "w") as tf:
        tf.addfile(member("tag", data=f"{GOOD}\n".encode())[0], io.BytesIO(f"{GOOD}\n".encode()))
        tf.add(rootfs, arcname=".")
    data = shared.read_bytes()
    offset = data.index(GOOD.encode())
    mine = box.work / "mine.tar"  # the test user's copy, which they may write
    mine.write_bytes(data)
    os.chown(mine, box.user.pw_uid, box.user.pw_gid)
    other = ensure_user(OTHER_USER)
    theirs = box.base / "other"
    theirs.mkdir()
    os.chown(theirs, other.pw_uid, other.pw_gid)
    agent = isolation_agent(box, "cachenode", "image_cache_max_bytes = 1\n").start()
    stop = box.base / "stop-flipper"
    flipper = subprocess.Popen(["/usr/bin/python3", "-c", FLIPPER, str(mine), str(offset), EVIL, GOOD, str(stop)],
                               user=box.user.pw_uid, group=box.user.pw_gid, extra_groups=[],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    cached = box.spool / "images" / hashlib.sha256(data).hexdigest() / "tag"
    script = "#!/bin/sh\ncat /tag\n"

    def job(spec):
        async def body():
            async with client(agent) as c:
                st = (await c.call("start_run", {"spec": spec}))["status"]
                return st if st["state"] == "ended" else await c.exited(spec["job_id"], timeout=60)
        ended = run(body())
        out = Path(spec["stdout"])
        return ended, out.read_text() if out.exists() else ""

    victims, poisoned, refused = [], [], 0
    try:
        for cycle in range(24):  # until the race showed up a few times, without and with our check
            if cycle >= 8 and refused >= 2:
                break
            for _ in range(3):  # the user's jobs, in a row: one of them may be first to unpack it
                ended, out = job(box.spec(script, runtime="runc", container_image=str(mine)))
                refused += "the image changed while it was read" in (ended.get("message") or "")
                if cached.exists() and cached.read_text() != f"{GOOD}\n":
                    poisoned.append(cached.read_text())
            spec = box.spec(script, runtime="runc", container_image=str(shared), user=OTHER_USER,
                            uid=other.pw_uid, gid=other.pw_gid, workdir=str(theirs))
            spec["stdout"] = str(theirs / f"job-{spec['job_id']}.out")
            victims.append(job(spec))
    finally:
        stop.touch()
        out, err = flipper.communicate(timeout=30)
        agent.stop()
    assert flipper.returncode == 0 and int(out) > 1000, (out, err)  # it did flip, many times
    assert not poisoned, (f"the shared image held the test user's bytes after {len(poisoned)} of their jobs; "
                          f"the other user's jobs printed {sorted({out for _, out in victims})}")
    assert all(ended["exit_code"] == 0 and out == f"{GOOD}\n" for ended, out in victims), victims
    assert refused, "no start saw the tarball change: the race never happened"


def test_the_cache_counts_images_from_before_it_kept_sizes_and_clears_crashed_unpacks(tmp_path):
    cache = tmp_path / "cache"
    old = cache / ("0" * 64)
    (old / "bin").mkdir(parents=True)
    (old / "bin" / "tool").write_bytes(bytes(300_000))
    dead = subprocess.Popen(["true"])
    dead.wait()
    (cache / f".unpack-0123456789abcdef-{dead.pid}").mkdir()
    (cache / f".unpack-0123456789abcdef-{os.getpid()}-x").mkdir()  # not a pid: left alone
    evict(str(cache), 250_000)
    assert not old.exists()  # 300 000 bytes, counted by walking it, over the limit, held by nobody
    assert sorted(os.listdir(cache)) == [f".unpack-0123456789abcdef-{os.getpid()}-x"]


def test_the_cache_limits_are_agent_config(tmp_path):
    path = tmp_path / "agent.toml"
    path.write_text('[agent]\nname = "n"\n')
    iso = load_agent_config(path).isolation
    assert (iso.image_max_bytes, iso.image_max_entries, iso.image_cache_max_bytes, iso.image_unpack_timeout) == (
        64 * 2**30, 500_000, 256 * 2**30, 600.0)
    path.write_text('[agent]\nname = "n"\n[isolation]\nimage_max_bytes = 1000\nimage_cache_max_bytes = 0\n'
                    'image_unpack_timeout = 30\n')
    cfg = load_agent_config(path)
    iso = cfg.isolation
    assert (iso.image_max_bytes, iso.image_cache_max_bytes, iso.image_unpack_timeout) == (1000, 0, 30.0)
    # ... and they reach the shepherd, in node.json
    node = NodeIsolation.from_wire(json.loads(NodeIsolation.detect(cfg).wire_json))
    assert (node.image_max_bytes, node.image_cache_max_bytes, node.image_unpack_timeout) == (1000, 0, 30.0)
    for key in ("image_max_entries", "image_unpack_timeout"):
        path.write_text(f'[agent]\nname = "n"\n[isolation]\n{key} = -1\n')
        with pytest.raises(ConfigError, match=f"{key} must be >= 0"):
            load_agent_config(path)


# -- names that would be options --

def test_an_image_name_that_is_an_option_is_refused_at_submission():
    for image in ("--help", "-v", "--rootfs=/", "Busybox", "a b"):
        with pytest.raises(JobScriptError, match="expected an absolute path"):
            parse_submission("#!/bin/sh\ntrue\n", ["--runtime=podman", f"--container-image={image}"],
                             cwd="/home/u", env={})
    for image, kept in (("localhost/torch:2.3", "localhost/torch:2.3"), ("/srv/img.tar", "/srv/img.tar")):
        spec = parse_submission("#!/bin/sh\ntrue\n", ["--runtime=podman", f"--container-image={image}"],
                                cwd="/home/u", env={}).spec
        assert spec.container_image == kept
    # a path for the other runtimes, whatever it looks like
    spec = parse_submission("#!/bin/sh\ntrue\n", ["--runtime=runc", "--container-image=--help"], cwd="/home/u",
                            env={}).spec
    assert spec.container_image == "/home/u/--help"


@pytest.mark.skipif(not podman_installed(), reason="podman is not installed (scripts/test installs it)")
def test_podman_refuses_an_image_name_that_is_an_option(box):
    agent = isolation_agent(box, "pathnode3", "").start()
    try:
        spec = box.spec("#!/bin/sh\necho ran\n", runtime="podman", container_image="--help")

        async def body():
            async with client(agent) as c:
                return (await c.call("start_run", {"spec": spec}))["status"]

        st = run(body())
        assert st["reason"] == "launch_failed", st
        assert st["message"] == "container image '--help' is neither an absolute path nor an image name", st
        assert "Usage" not in Path(spec["stdout"]).read_text() if Path(spec["stdout"]).exists() else True
    finally:
        agent.stop()

