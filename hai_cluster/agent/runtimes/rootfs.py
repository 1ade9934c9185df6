"""Image rootfs on the node: tarballs unpacked safely (for the cache, cache.py), and the mounts
the job child makes in its own mount namespace: the user's directories at their stage points,
then the overlay that gives a container a root with mount points in it while the image itself
stays untouched.

The image is the user's: the unpacking (as root) never follows a link the archive made (every
path is walked with O_NOFOLLOW from the destination; hard links are made with linkat without
AT_SYMLINK_FOLLOW, to a member already unpacked), drops setuid/setgid bits, skips device nodes
and FIFOs, and stops at a cap on the bytes and entries it unpacks to and on the size of each
extended header (tarfile holds those in memory). Mount points are made the same way, inside an
overlay whose upper layer is a private tmpfs, so nothing is ever written into the user's
directory or the cache.
"""
from __future__ import annotations

import ctypes
import os
import stat
import tarfile
from typing import BinaryIO

CHUNK = 1 << 20
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
MAX_HEADER = 64 * 1024  # a long name or pax header: PATH_MAX-sized names, a few xattrs
_META = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE, tarfile.XGLTYPE,
         tarfile.SOLARIS_XHDTYPE)


class RootfsError(Exception):
    pass


class _CappedHeader(tarfile.TarInfo):
    """tarfile reads a long-name or pax header whole into memory, whatever size it claims: its
    per-member dispatch (_proc_member) refuses a large one first."""

    def _proc_member(self, tf):
        if self.type in _META and self.size > MAX_HEADER:
            raise RootfsError(f"an extended header of {self.size} bytes (at most {MAX_HEADER})")
        return super()._proc_member(tf)


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


def extract(f: BinaryIO, dest: str, max_bytes: int = 0, max_entries: int = 0) -> dict:
    """Unpack the tarball read from `f` into the empty directory `dest`; what it unpacked,
    {"bytes": file contents, "entries": members}. max_bytes/max_entries: 0 = no limit."""
    with tarfile.open(fileobj=f, mode="r:*", tarinfo=_CappedHeader) as tf:
        return _extract(tf, dest, max_bytes, max_entries)


def _members(tf: tarfile.TarFile):
    """The archive's members one by one, without tarfile's list of every member seen so far
    (memory that grows with the entries; nothing here looks back at them)."""
    while (m := tf.next()) is not None:
        tf.members.clear()
        yield m


def _extract(tf: tarfile.TarFile, dest: str, max_bytes: int = 0, max_entries: int = 0) -> dict:
    root = os.open(dest, _DIR_FLAGS)
    dir_modes: list[tuple[list[str], int]] = []
    total = entries = 0
    try:
        for m in _members(tf):
            entries += 1
            if max_entries and entries > max_entries:
                raise RootfsError(f"more than {max_entries} entries (isolation.image_max_entries)")
            if m.isreg():
                total += m.size
                if max_bytes and total > max_bytes:
                    raise RootfsError(f"it unpacks to more than {max_bytes} bytes (isolation.image_max_bytes)")
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
                        while chunk := src.read(CHUNK):  # at most m.size: counted above
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
    return {"bytes": total, "entries": entries}


def unpack_cached(fd: int, name: str, cache: str) -> str:
    """The rootfs dir for the tarball open on `fd`, in the cache, with no limits and without
    holding the lock that keeps it there: for callers that only unpack (image_rootfs uses
    cache.acquire)."""
    from .cache import acquire
    image = acquire(fd, name, cache)
    os.close(image.lock)
    return image.path


# -- in the job child, as root, before the runtime is exec'd --

_CLONE_NEWNS = 0x00020000
_MS_NOSUID, _MS_NODEV, _MS_BIND, _MS_REC, _MS_PRIVATE = 0x2, 0x4, 0x1000, 0x4000, 0x40000


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _mount(libc, source: str, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    if libc.mount(source.encode(), target.encode(), fstype.encode() if fstype else None, flags,
                  data.encode() if data else None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {fstype or source} on {target}: {os.strerror(err)}")


def private_namespace() -> None:
    """A mount namespace of the job child's own: what it mounts vanishes with the job's
    processes, and nothing propagates to the host."""
    libc = _libc()
    if libc.unshare(_CLONE_NEWNS) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare of the mount namespace: {os.strerror(err)}")
    _mount(libc, "none", "/", None, _MS_REC | _MS_PRIVATE, None)


def open_staged(path: str) -> int:
    """As the user (the job child's effective ids), in its own mount namespace (a bind must come
    from a mount of the namespace it is made in): an O_PATH fd of one of the user's directories.
    The user's own symlinks are followed, with the user's permissions: the fd is something the
    user could reach, whatever the path pointed to a moment before or after."""
    return os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)


def assemble(plan, fds: list[int]) -> None:
    """As root, in the namespace of private_namespace(): bind each staged directory (its fd from
    open_staged) at its stage point, then mount the image overlay and create its mount points."""
    libc = _libc()
    for staged, fd in zip(plan.staged, fds):
        flags = _MS_BIND | (_MS_REC if staged.recursive else 0)
        _mount(libc, f"/proc/self/fd/{fd}", staged.stage, None, flags, None)
        os.close(fd)
    if plan.overlay is not None:
        _overlay(libc, plan.overlay)


def _overlay(libc, ov) -> None:
    _mount(libc, "tmpfs", ov.scratch, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0700")
    for d in ("upper", "work"):
        os.mkdir(os.path.join(ov.scratch, d), 0o755)
    _mount(libc, "overlay", ov.root, "overlay", _MS_NOSUID | _MS_NODEV,
           f"lowerdir={ov.lower},upperdir={ov.scratch}/upper,workdir={ov.scratch}/work")
    root = os.open(ov.root, _DIR_FLAGS)
    try:
        for d in ov.dirs:
            os.close(_walk(root, _parts(d), create=True))
        for f in ov.files:
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
