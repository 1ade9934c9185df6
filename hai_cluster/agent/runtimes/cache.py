"""The node's image cache: rootfs tarballs unpacked once, keyed by content hash, bounded in size.

    <cache>/<sha256>/       the unpacked rootfs (rootfs.extract: no link followed, caps on the
                            bytes and entries it unpacks to)
    <cache>/<sha256>.lock   flock'ed shared by every run that uses the image, for the run's whole
                            life (the shepherd holds it); its mtime is the image's last use, its
                            content the unpacked size ({"bytes": N, "entries": M})

The cache holds at most `cache_max_bytes` of unpacked file contents: after an unpack, the least
recently used images that no run holds (an exclusive flock that does not block) are removed until
it fits, so it may exceed the limit only by images in use. A lock file is removed with its image,
under the exclusive lock: whoever waited on it finds it unlinked and takes the new one
(_lock checks the inode), so a run never holds the lock of an image it does not use.

The tarball is the user's, who may rewrite it at any moment, and the cache is shared by every
user under its hash: what is unpacked must be exactly the bytes that were hashed (issue 18, H2:
a tarball rewritten between the hash and the unpack put one user's binary into another user's
job). So an image not yet cached is unpacked in one read of the user's file, front to back,
that hashes every byte it passes (and, after the archive's end, the rest of the file), into a
directory of the cache's own (.unpack-*) that becomes the image only if that second hash is
the one the lookup used; else it is removed and the run fails ("the image changed while it was
read"). Every read of the user's file stops at its size when it was opened, and nothing of it
is copied (the third audit, H2: a private copy of a sparse `truncate -s 2G` file filled the
node's spool).

The whole of it (hash, read, unpack) has a time budget (isolation.image_unpack_timeout), stops
when the run is cancelled, and stops before the cache's file system is nearly full
(rootfs.Guard), so that no image holds a root shepherd for hours or fills the spool.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import stat
import tarfile
from dataclasses import dataclass
from typing import Callable

from .rootfs import CHUNK, Guard, RootfsError, extract, stream_cap

DEFAULT_UNPACK_TIMEOUT = 600.0  # = config.IsolationConfig.image_unpack_timeout


@dataclass(frozen=True)
class ImageLimits:
    """isolation.image_max_bytes, image_max_entries, image_cache_max_bytes, image_unpack_timeout
    (their defaults are in config/agent.py); 0 means no limit."""
    max_bytes: int = 0  # one image's unpacked file contents
    max_entries: int = 0  # one image's archive members
    cache_max_bytes: int = 0  # all the cache's images, unpacked
    unpack_timeout: float = 0  # seconds for one acquire's hash, read and unpack together

    def max_tarball(self) -> int:
        """The largest tarball (and decompressed tar stream) an image within the caps can be."""
        return stream_cap(self.max_bytes, self.max_entries)


@dataclass(frozen=True)
class CachedImage:
    path: str  # the rootfs directory
    lock: int  # the shared lock's fd: keep it open while the image is in use


def _is_digest(name: str) -> bool:
    return len(name) == 64 and all(c in "0123456789abcdef" for c in name)


def _lock(cache: str, digest: str, exclusive: bool = False) -> int | None:
    """An fd holding <digest>.lock (shared, waiting for an eviction in progress; exclusive: only
    if nobody holds it, else None). Retried when the file was replaced while we waited."""
    path = os.path.join(cache, f"{digest}.lock")
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB if exclusive else fcntl.LOCK_SH)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        try:
            same = os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)  # an eviction removed it meanwhile


CHANGED = "the image changed while it was read (a tarball must not be written while jobs that use it start)"


class _Hashed:
    """The user's file on `fd`, read once from its start, never past `size` (its size when it
    was opened), every byte read hashed; RootfsError if it is shorter or longer now (it changed)."""

    def __init__(self, fd: int, size: int, guard: Guard) -> None:
        self.fd, self.size, self.guard = fd, size, guard
        self.offset = 0
        self.hash = hashlib.sha256()

    def read(self, n: int = CHUNK) -> bytes:
        n = min(n, CHUNK, self.size - self.offset)
        if n <= 0:
            return b""
        self.guard.check(n)
        chunk = os.pread(self.fd, n, self.offset)
        if not chunk:
            raise RootfsError(CHANGED)
        self.offset += len(chunk)
        self.hash.update(chunk)
        return chunk

    def finish(self) -> str:
        """The digest of the whole file: what is left of it read (and hashed) first."""
        while self.read(CHUNK):
            pass
        if os.pread(self.fd, 1, self.size):
            raise RootfsError(CHANGED)
        return self.hash.hexdigest()


def acquire(fd: int, name: str, cache: str, limits: ImageLimits = ImageLimits(),
            cancelled: Callable[[], bool] | None = None) -> CachedImage:
    """The rootfs dir for the tarball open on `fd` (a regular file), unpacked the first time, and
    the lock that keeps it in the cache. Concurrent unpacks of one image race harmlessly (the
    first rename wins). `cancelled()` true (looked at every few MiB) ends it with
    rootfs.CANCELLED, as its time budget (limits.unpack_timeout) does with its own error."""
    guard = Guard(limits.unpack_timeout, cancelled)
    size = os.fstat(fd).st_size
    if limits.max_tarball() and size > limits.max_tarball():
        raise RootfsError(f"the tarball is {size} bytes, more than an image may unpack to "
                          f"(isolation.image_max_bytes = {limits.max_bytes})")
    digest = _Hashed(fd, size, guard).finish()
    os.makedirs(cache, 0o700, exist_ok=True)
    lock = _lock(cache, digest)
    try:
        final = os.path.join(cache, digest)
        if not os.path.isdir(final):
            _unpack(fd, size, name, cache, digest, limits, lock, guard)
            evict(cache, limits.cache_max_bytes, keep=digest)
        os.utime(lock)  # last use: the eviction order
        return CachedImage(final, lock)
    except BaseException:
        _drop(cache, digest, lock)
        raise


def _drop(cache: str, digest: str, lock: int) -> None:
    """Let go of the lock of an image that could not be unpacked, and remove its lock file if
    nobody else waits on it (the shared lock becomes exclusive only then)."""
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if not os.path.isdir(os.path.join(cache, digest)):
            os.unlink(os.path.join(cache, f"{digest}.lock"))
    except OSError:
        pass
    finally:
        os.close(lock)


def _record(fd: int, counted: dict) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(counted).encode(), 0)


def _unpack(fd: int, size: int, name: str, cache: str, digest: str, limits: ImageLimits, lock: int,
            guard: Guard) -> None:
    tmp = os.path.join(cache, f".unpack-{digest[:16]}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.mkdir(tmp, 0o755)
    try:
        top = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            # now, and every few MiB it writes; short of room, the least recently used images go first
            guard.watch_space(top, cache, lambda has_room: _make_room(cache, digest, has_room))
            source = _Hashed(fd, size, guard)  # the user's file, read once: what it unpacks is what it hashed
            counted = extract(source, tmp, limits.max_bytes, limits.max_entries, guard)
            if source.finish() != digest:
                raise RootfsError(CHANGED)
            os.fchmod(top, 0o755)
        finally:
            os.close(top)
        _record(lock, counted)  # before it is seen
        try:
            os.rename(tmp, os.path.join(cache, digest))
        except OSError:
            if not os.path.isdir(os.path.join(cache, digest)):
                raise
    except (tarfile.TarError, OSError, EOFError, ValueError, IndexError) as exc:  # tarfile's, on bad headers
        raise RootfsError(f"cannot unpack {name}: {exc}") from None
    except RecursionError:  # a chain of thousands of extended headers
        raise RootfsError(f"cannot unpack {name}: too many extended headers in a row") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def evict(cache: str, max_bytes: int, keep: str = "") -> None:
    """Remove least recently used images nobody holds until the cache holds at most max_bytes
    (0: no limit), and what crashed unpacks and evictions left."""
    _remove_leftovers(cache)
    if not max_bytes:
        return
    images = []
    for name in os.listdir(cache):
        if _is_digest(name):
            images.append((_last_use(cache, name), name, _size(cache, name)))
    total = sum(size for _, _, size in images)
    for _, name, size in sorted(images):
        if total <= max_bytes:
            return
        if name != keep and _remove(cache, name):
            total -= size


def _make_room(cache: str, keep: str, has_room: Callable[[], bool]) -> None:
    """The cache's file system is nearly full: remove the least recently used images nobody
    holds until it is not, whatever image_cache_max_bytes allows (a cache larger than its disk)."""
    for _, name in sorted((_last_use(cache, n), n) for n in os.listdir(cache) if _is_digest(n) and n != keep):
        if has_room():
            return
        _remove(cache, name)


def _last_use(cache: str, name: str) -> float:
    for path in (f"{name}.lock", name):
        try:
            return os.stat(os.path.join(cache, path), follow_symlinks=False).st_mtime
        except OSError:
            continue
    return 0.0


def _size(cache: str, name: str) -> int:
    """The image's unpacked bytes, as its lock file records them; counted (and recorded) for an
    image unpacked before the cache kept sizes."""
    path = os.path.join(cache, f"{name}.lock")
    try:
        with open(path, "rb") as f:
            return int(json.loads(f.read(4096))["bytes"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    total = entries = 0
    for root, dirs, files in os.walk(os.path.join(cache, name)):
        entries += len(dirs) + len(files)
        for f in files:
            try:
                st = os.stat(os.path.join(root, f), follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            _record(fd, {"bytes": total, "entries": entries})
        finally:
            os.close(fd)
    except OSError:
        pass
    return total


def _remove(cache: str, name: str) -> bool:
    """Remove one image if no run holds it: renamed away under the exclusive lock (a run that
    waits for the lock then finds no image and unpacks it again), then deleted."""
    lock = _lock(cache, name, exclusive=True)
    if lock is None:
        return False
    trash = os.path.join(cache, f".evict-{name[:16]}-{os.getpid()}")
    try:
        try:
            os.rename(os.path.join(cache, name), trash)
        except FileNotFoundError:
            pass
        os.unlink(os.path.join(cache, f"{name}.lock"))
    finally:
        os.close(lock)
    shutil.rmtree(trash, ignore_errors=True)
    return True


def _remove_leftovers(cache: str) -> None:
    """.unpack-* and .evict-* dirs whose shepherd is gone (it crashed half way), and the .copy-*
    files of the versions that unpacked from a copy."""
    for name in os.listdir(cache):
        if not name.startswith((".unpack-", ".evict-", ".copy-")):
            continue
        pid = name.rsplit("-", 1)[-1]
        if pid.isdigit() and not _alive(int(pid)):
            if name.startswith(".copy-"):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(cache, name))
            else:
                shutil.rmtree(os.path.join(cache, name), ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError as exc:
        return exc.errno == errno.EPERM
    return True


def unpack_cached(fd: int, name: str, cache: str) -> str:
    """The rootfs dir for the tarball open on `fd`, in the cache, with no limits and without
    holding the lock that keeps it there: for callers that only unpack (image_rootfs uses
    cache.acquire)."""
    image = acquire(fd, name, cache)
    os.close(image.lock)
    return image.path
