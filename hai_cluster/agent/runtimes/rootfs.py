"""Image rootfs on the node: tarballs unpacked safely into a cache, and the overlay that gives a
container a root with mount points in it while the image itself stays untouched.

The image is the user's: the unpacking (as root) never follows a link the archive made (every
path is walked with O_NOFOLLOW from the destination), drops setuid/setgid bits and skips device
nodes; mount points are made the same way, inside an overlay whose upper layer is a private
tmpfs, so nothing is ever written into the user's directory or the cache.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import stat
import tarfile

CHUNK = 1 << 20
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


class RootfsError(Exception):
    pass


def _parts(name: str) -> list[str]:
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise RootfsError(f"archive member {name!r} has a '..' component")
    return parts


def _walk(root: int, parts: list[str], create: bool, mode: int = 0o755) -> int:
    """An fd of the directory root/parts, never through a symlink; missing dirs are made if asked."""
    fd = os.dup(root)
    try:
        for p in parts:
            try:
                nfd = os.open(p, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise RootfsError(f"{'/'.join(parts)} does not exist") from None
                os.mkdir(p, mode, dir_fd=fd)
                nfd = os.open(p, _DIR_FLAGS, dir_fd=fd)
            except OSError:  # ELOOP, ENOTDIR: a symlink or a file on the way
                raise RootfsError(f"/{'/'.join(parts)} goes through a symlink or a file") from None
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


def _clear(parent: int, name: str) -> None:
    """Remove a non-directory entry a later archive member replaces (tar semantics)."""
    try:
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=parent)


def _extract(tf: tarfile.TarFile, dest: str) -> None:
    root = os.open(dest, _DIR_FLAGS)
    dir_modes: list[tuple[list[str], int]] = []
    try:
        for m in tf:
            parts = _parts(m.name)
            if not parts:
                continue
            parent = _walk(root, parts[:-1], create=True)
            name = parts[-1]
            try:
                if m.isdir():
                    try:
                        os.mkdir(name, 0o700, dir_fd=parent)
                    except FileExistsError:
                        os.close(_walk(parent, [name], create=False))  # must be a real dir
                    dir_modes.append((parts, m.mode & 0o1777))
                    continue
                _clear(parent, name)
                if m.isreg():
                    src = tf.extractfile(m)
                    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600,
                                 dir_fd=parent)
                    try:
                        while chunk := src.read(CHUNK):
                            os.write(fd, chunk)
                        os.fchown(fd, m.uid, m.gid)
                        os.fchmod(fd, m.mode & 0o777)  # no setuid/setgid from a user's archive
                    finally:
                        os.close(fd)
                elif m.issym():
                    os.symlink(m.linkname, name, dir_fd=parent)  # resolved inside the container only
                    os.chown(name, m.uid, m.gid, dir_fd=parent, follow_symlinks=False)
                elif m.islnk():
                    target = _parts(m.linkname)
                    if not target:
                        raise RootfsError(f"hard link {m.name!r} to nothing")
                    tdir = _walk(root, target[:-1], create=False)
                    try:
                        os.link(target[-1], name, src_dir_fd=tdir, dst_dir_fd=parent, follow_symlinks=False)
                    finally:
                        os.close(tdir)
                # device nodes, fifos: skipped (a container gets its /dev from the runtime)
            finally:
                os.close(parent)
        for parts, mode in reversed(dir_modes):  # last: the dirs had to stay writable until now
            fd = _walk(root, parts, create=False)
            try:
                os.fchmod(fd, mode)
            finally:
                os.close(fd)
    finally:
        os.close(root)


def unpack_cached(fd: int, name: str, cache: str) -> str:
    """The rootfs dir for the tarball open on `fd`: <cache>/<sha256 of its bytes>, unpacked there
    the first time. Concurrent runs of one image race harmlessly: the first rename wins."""
    digest = hashlib.sha256()
    os.lseek(fd, 0, os.SEEK_SET)
    while chunk := os.read(fd, CHUNK):
        digest.update(chunk)
    os.makedirs(cache, 0o700, exist_ok=True)
    final = os.path.join(cache, digest.hexdigest())
    if os.path.isdir(final):
        return final
    tmp = os.path.join(cache, f".unpack-{digest.hexdigest()[:16]}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.mkdir(tmp, 0o755)
    os.lseek(fd, 0, os.SEEK_SET)
    try:
        with os.fdopen(os.dup(fd), "rb") as f, tarfile.open(fileobj=f, mode="r:*") as tf:
            _extract(tf, tmp)
        os.chmod(tmp, 0o755)
        try:
            os.rename(tmp, final)
        except OSError:
            if not os.path.isdir(final):
                raise
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise RootfsError(f"cannot unpack {name}: {exc}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


# -- in the job child, as root, before the runtime is exec'd --

_CLONE_NEWNS = 0x00020000
_MS_NOSUID, _MS_NODEV, _MS_REC, _MS_PRIVATE = 0x2, 0x4, 0x4000, 0x40000


def _mount(libc, source: str, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    if libc.mount(source.encode(), target.encode(), fstype.encode() if fstype else None, flags,
                  data.encode() if data else None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {fstype or source} on {target}: {os.strerror(err)}")


def assemble(plan) -> None:
    """Mount the image overlay of a MountPlan in a new, private mount namespace (it vanishes with
    the job's processes) and create its mount points."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(_CLONE_NEWNS) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare of the mount namespace: {os.strerror(err)}")
    _mount(libc, "none", "/", None, _MS_REC | _MS_PRIVATE, None)  # nothing propagates to the host
    _mount(libc, "tmpfs", plan.scratch, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0700")
    for d in ("upper", "work"):
        os.mkdir(os.path.join(plan.scratch, d), 0o755)
    _mount(libc, "overlay", plan.root, "overlay", _MS_NOSUID | _MS_NODEV,
           f"lowerdir={plan.lower},upperdir={plan.scratch}/upper,workdir={plan.scratch}/work")
    root = os.open(plan.root, _DIR_FLAGS)
    try:
        for d in plan.dirs:
            os.close(_walk(root, _parts(d), create=True))
        for f in plan.files:
            parts = _parts(f)
            parent = _walk(root, parts[:-1], create=True)
            try:
                os.close(os.open(parts[-1], os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644, dir_fd=parent))
            finally:
                os.close(parent)
    except RootfsError as exc:
        raise OSError(0, f"a mount point in the image: {exc}") from None
    finally:
        os.close(root)
