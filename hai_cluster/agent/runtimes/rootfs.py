"""Image rootfs on the node: tarballs unpacked safely (for the cache, cache.py), and the mounts
the job child makes in its own mount namespace: the user's directories at their stage points,
then the overlay that gives a container a root with mount points in it while the image itself
stays untouched.

The image is the user's: the unpacking (as root) never follows a link the archive made (every
path is walked with O_NOFOLLOW from the destination; hard links are made with linkat without
AT_SYMLINK_FOLLOW, to a member already unpacked), drops setuid/setgid bits, skips device nodes
and FIFOs, and stops at a cap on the bytes and entries it unpacks to and on the size of each
extended header and of all of a member's headers (tarfile holds those in memory). Mount points
are made the same way, inside an overlay whose upper layer is a private tmpfs, so nothing is
ever written into the user's directory or the cache.

The tarball is read once, front to back (tarfile's stream mode, over our own decompression), so
that what the cache hashes as it reads is what was unpacked, and so that no member can make us
read what we do not count (issue 18, third audit, H1: a member of an unknown type that claims
2^50 bytes, which tarfile skips by decompressing it all, in an 11 MB bzip2 file): a member of a
type tarfile does not know is refused, so is data on anything but a regular file, every
member's data counts against max_bytes, and the decompressed stream itself is capped
(stream_cap: the contents plus the headers the entries may need). A Guard ends an unpack that
takes too long, whose run is cancelled, or that would leave the file system it writes to nearly
full; an all-zero chunk of a file is left as a hole, so an archive of zeros (a GNU sparse member
or not, counted at its full size) costs no disk.
"""
from __future__ import annotations

import bz2
import contextlib
import ctypes
import lzma
import os
import stat
import tarfile
import time
import zlib
from typing import BinaryIO, Callable

CHUNK = 1 << 20
_IN = 64 * 1024  # compressed input fed at a time (zlib copies what it has not used yet)
_ZEROS = bytes(CHUNK)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
MAX_HEADER = 64 * 1024  # a long name or pax header: PATH_MAX-sized names, a few xattrs
# all that comes before one member's data: its extended headers in a row, and a GNU sparse map
# (tarfile holds it in memory, at 5 to 20 times its size)
MAX_MEMBER_HEADERS = 4 * MAX_HEADER + 2 * tarfile.RECORDSIZE
_META = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE, tarfile.XGLTYPE,
         tarfile.SOLARIS_XHDTYPE)
# an uncompressed tarball is its contents plus a header block or two and padding per entry,
# and at its end two zero blocks and the rest of a record (what tarfile reads past them)
TAR_OVERHEAD_PER_ENTRY = 1536
TAR_TAIL = 64 * 1024
XZ_MEMLIMIT = 1 << 30  # what an xz stream may make the decoder allocate (xz -9: 65 MiB)
CANCELLED = "the run was cancelled while its image was unpacked"


class RootfsError(Exception):
    pass


def stream_cap(max_bytes: int, max_entries: int) -> int:
    """The most an image within the caps can be as a tar stream (0: no cap, as either limit)."""
    if not max_bytes or not max_entries:
        return 0
    return max_bytes + TAR_OVERHEAD_PER_ENTRY * max_entries + TAR_TAIL


def keep_free(total: int) -> int:
    """What an unpack leaves free of a file system of `total` bytes: 5 %, and at least 1 GiB
    unless that is more than a fifth of it (a small cache of its own)."""
    return max(total // 20, min(1 << 30, total // 5))


class Guard:
    """What ends an unpack early, looked at every few MiB read or written (and at least every
    INTERVAL seconds of work): its deadline (`timeout` seconds from now, 0 = none), a cancel
    (`cancelled()` true), and, once watch_space() named it, the file system it writes to about
    to have less than keep_free() bytes (or 5 % of its inodes) left."""
    EVERY = 4 << 20
    INTERVAL = 0.2

    def __init__(self, timeout: float = 0, cancelled: Callable[[], bool] | None = None) -> None:
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout if timeout else None
        self.cancelled = cancelled
        self.space_fd: int | None = None
        self.where = ""
        self.make_room: Callable[[Callable[[], bool]], None] | None = None
        self._bytes = 0
        self._at = time.monotonic()

    def watch_space(self, fd: int, where: str,
                    make_room: Callable[[Callable[[], bool]], None] | None = None) -> None:
        """From now on, also the free space of the file system `fd` is on (checked at once);
        when it runs short, make_room(has_room) may free some first (the cache's unused images)."""
        self.space_fd, self.where, self.make_room = fd, where, make_room
        self._space()

    def check(self, nbytes: int = 0) -> None:
        self._bytes += nbytes
        now = time.monotonic()
        if self._bytes < self.EVERY and now - self._at < self.INTERVAL:
            return
        self._bytes, self._at = 0, now
        if self.deadline is not None and now > self.deadline:
            raise RootfsError(f"unpacking it took more than {self.timeout:g} s (isolation.image_unpack_timeout)")
        if self.cancelled is not None and self.cancelled():
            raise RootfsError(CANCELLED)
        if self.space_fd is not None:
            self._space()

    def _space(self) -> None:
        why = self._shortage(self.space_fd)
        if why is not None and self.make_room is not None:
            self.make_room(lambda: self._shortage(self.space_fd) is None)
            why = self._shortage(self.space_fd)
        if why is not None:
            raise RootfsError(f"the image cache's file system ({self.where}) is nearly {why}")

    @staticmethod
    def _shortage(fd: int) -> str | None:
        st = os.fstatvfs(fd)
        total, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
        if free < keep_free(total):
            return f"full: {free} bytes free, and an unpack leaves at least {keep_free(total)}"
        if st.f_files and st.f_favail < st.f_files // 20:
            return f"out of inodes: {st.f_favail} of {st.f_files} free, and an unpack leaves 5 %"
        return None


class _CappedHeader(tarfile.TarInfo):
    """tarfile reads a long-name or pax header whole into memory, whatever size it claims, and
    skips the data of a member of a type it does not know by reading (decompressing) all of it,
    whatever size it claims: its per-member dispatch (_proc_member) refuses both first. It also
    holds a GNU sparse map in memory, read before the member's data, and every global header
    to the archive's end: all that one member's headers read is capped (MAX_MEMBER_HEADERS, on
    the stream), and so are the global headers together."""

    def _proc_member(self, tf):
        if self.type in _META and self.size > MAX_HEADER:
            raise RootfsError(f"an extended header of {self.size} bytes (at most {MAX_HEADER})")
        if self.type not in _META and self.type not in tarfile.SUPPORTED_TYPES:
            raise RootfsError(f"archive member {self.name!r} is of an unknown type {self.type!r}")
        if self.type == tarfile.XGLTYPE:  # kept for the rest of the archive (tarfile.pax_headers)
            tf.global_header_bytes = getattr(tf, "global_header_bytes", 0) + self.size
            if tf.global_header_bytes > MAX_HEADER:
                raise RootfsError(f"global extended headers of more than {MAX_HEADER} bytes")
        stream = getattr(tf.fileobj, "fileobj", None)
        if not isinstance(stream, _TarStream):
            return super()._proc_member(tf)
        with stream.headers():  # what tarfile reads before the member's data (and keeps in memory)
            return super()._proc_member(tf)


# (magic, kind) of the compressions tarfile's "r:*" read (gzip, bzip2, xz and .lzma)
_KINDS = ((b"\x1f\x8b", "gzip"), (b"BZh", "bzip2"), (b"\xfd7zXZ\x00", "xz"), (b"\x5d\x00\x00", "lzma"))


def _is_tar_header(block: bytes) -> bool:
    if len(block) < tarfile.BLOCKSIZE:
        return False
    try:
        return tarfile.nti(block[148:156]) in tarfile.calc_chksums(block[:tarfile.BLOCKSIZE])
    except (ValueError, tarfile.HeaderError):
        return False


class _TarStream:
    """The tar stream of a tarball read once, front to back, from `src` (its read(n)): the
    tarball as is, or decompressed (gzip, bzip2, xz, of one stream or several in a row, as pigz,
    pbzip2 or cat make them), a chunk at a time whatever the ratio, and never more than `cap`
    bytes of it (0: no cap). What follows the last compressed stream is not decompressed."""

    def __init__(self, src, cap: int, guard: Guard, max_bytes: int) -> None:
        self.src, self.cap, self.guard, self.max_bytes = src, cap, guard, max_bytes
        self.pending = self._fill(b"", tarfile.BLOCKSIZE)
        self.kind = None
        if not _is_tar_header(self.pending):
            self.kind = next((kind for magic, kind in _KINDS if self.pending.startswith(magic)), None)
        self.dec = self._decompressor() if self.kind else None
        self.ended = False  # the last compressed stream ended
        self.buf, self.pos, self.total = b"", 0, 0
        self.given = 0  # bytes of the tar stream read() returned
        self.header_limit: int | None = None  # no more than that while a member's headers are read

    @contextlib.contextmanager
    def headers(self):
        """While a member's headers are read: at most MAX_MEMBER_HEADERS of the stream (nested
        calls, for the next header of a chain, keep the outer limit)."""
        saved = self.header_limit
        limit = self.given + MAX_MEMBER_HEADERS
        self.header_limit = limit if saved is None else min(saved, limit)
        try:
            yield
        finally:
            self.header_limit = saved

    def _fill(self, data: bytes, n: int) -> bytes:
        while len(data) < n and (more := self.src.read(_IN)):
            data += more
        return data

    def _decompressor(self):
        if self.kind == "gzip":
            return zlib.decompressobj(16 + zlib.MAX_WBITS)
        if self.kind == "bzip2":
            return bz2.BZ2Decompressor()
        return lzma.LZMADecompressor(lzma.FORMAT_XZ if self.kind == "xz" else lzma.FORMAT_ALONE,
                                     memlimit=XZ_MEMLIMIT)

    def read(self, n: int = -1) -> bytes:
        if self.pos >= len(self.buf):
            self.buf, self.pos = self._next(), 0
            if not self.buf:
                return b""
            self.total += len(self.buf)
            if self.cap and self.total > self.cap:
                raise RootfsError(f"it decompresses to more than {self.cap} bytes, more than its contents "
                                  f"(isolation.image_max_bytes = {self.max_bytes}) and their headers can be")
            self.guard.check(len(self.buf))
        out = self.buf[self.pos:] if n < 0 else self.buf[self.pos:self.pos + n]
        self.pos += len(out)
        self.given += len(out)
        if self.header_limit is not None and self.given > self.header_limit:
            raise RootfsError(f"the headers of a member take more than {MAX_MEMBER_HEADERS} bytes "
                              f"(extended headers in a row, or a sparse map)")
        return out

    def _next(self) -> bytes:
        """The next chunk of the tar stream (at most CHUNK bytes), b"" at its end."""
        if self.kind is None:
            if self.pending:
                data, self.pending = self.pending, b""
                return data
            return self.src.read(CHUNK)
        try:
            while not self.ended:
                self.guard.check()
                if self.dec.eof and not self._next_stream():
                    self.ended = True
                    break
                if self.kind == "gzip":
                    out = self.dec.decompress(self._input(), CHUNK)
                    self.pending = self.dec.unconsumed_tail or self.dec.unused_data
                elif self.dec.needs_input:
                    out = self.dec.decompress(self._input(), CHUNK)
                    self.pending = b""
                else:
                    out = self.dec.decompress(b"", CHUNK)
                if out:
                    return out
        except (zlib.error, lzma.LZMAError) as exc:
            raise RootfsError(f"invalid {self.kind} data: {exc}") from None
        return b""

    def _input(self) -> bytes:
        if not self.pending:
            self.pending = self.src.read(_IN)
            if not self.pending:
                raise EOFError("compressed file ended before the end-of-stream marker was reached")
        return self.pending

    def _next_stream(self) -> bool:
        """After the end of one compressed stream: start the next if another follows."""
        rest = self.pending if self.kind == "gzip" else self.dec.unused_data + self.pending
        if self.kind == "xz":  # stream padding: NUL bytes
            while not (rest := rest.lstrip(b"\0")) and (more := self.src.read(_IN)):
                rest = more
        rest = self._fill(rest, 6)
        magic = next(m for m, kind in _KINDS if kind == self.kind)
        if self.kind == "lzma" or not rest.startswith(magic):
            self.pending = b""
            return False  # the end, or bytes that are no stream of ours: not read (the hash reads them)
        self.pending, self.dec = rest, self._decompressor()
        return True


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


def extract(f: BinaryIO, dest: str, max_bytes: int = 0, max_entries: int = 0, guard: Guard | None = None) -> dict:
    """Unpack the tarball read from `f` (its read(n), front to back, once; plain or compressed)
    into the empty directory `dest`; what it unpacked, {"bytes": file contents, "entries":
    members}. max_bytes/max_entries: 0 = no limit. `guard` (a Guard) may end it early."""
    guard = guard or Guard()
    stream = _TarStream(f, stream_cap(max_bytes, max_entries), guard, max_bytes)
    with tarfile.open(fileobj=stream, mode="r|", tarinfo=_CappedHeader) as tf:
        return _extract(tf, dest, max_bytes, max_entries, guard)


def _members(tf: tarfile.TarFile):
    """The archive's members one by one, without tarfile's list of every member seen so far
    (memory that grows with the entries; nothing here looks back at them)."""
    while (m := tf.next()) is not None:
        tf.members.clear()
        yield m


def _write(fd: int, src, size: int, guard: Guard) -> None:
    """The member's `size` bytes from `src` into the new file on `fd`, an all-zero chunk as a hole."""
    left = size
    while left > 0:
        chunk = src.read(min(CHUNK, left))
        if not chunk:
            raise RootfsError("unexpected end of data")
        left -= len(chunk)
        if (chunk == _ZEROS) if len(chunk) == CHUNK else not chunk.lstrip(b"\0"):
            os.lseek(fd, len(chunk), os.SEEK_CUR)
        else:
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view):]
        guard.check(len(chunk))
    os.ftruncate(fd, size)  # a hole at the end too


def _extract(tf: tarfile.TarFile, dest: str, max_bytes: int, max_entries: int, guard: Guard) -> dict:
    root = os.open(dest, _DIR_FLAGS)
    dir_modes: list[tuple[list[str], int]] = []
    total = entries = 0
    try:
        for m in _members(tf):
            guard.check()
            entries += 1
            if max_entries and entries > max_entries:
                raise RootfsError(f"more than {max_entries} entries (isolation.image_max_entries)")
            if m.type not in tarfile.SUPPORTED_TYPES:  # _CappedHeader refused it already
                raise RootfsError(f"archive member {m.name!r} is of an unknown type {m.type!r}")
            if m.size and not m.isreg():
                raise RootfsError(f"archive member {m.name!r} has {m.size} bytes of data but is not a regular file")
            total += m.size  # a GNU sparse member: its full size, holes included
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
                        _write(fd, src, m.size, guard)
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
        if not entries:  # e.g. a file of zeros (`truncate -s 2G`): tarfile reads it as an empty archive
            raise RootfsError("the archive has no members")
        for parts, mode in reversed(dir_modes):  # last: the dirs had to stay writable until now
            fd = _walk(root, parts, create=False)
            try:
                os.fchmod(fd, mode)
            finally:
                os.close(fd)
    finally:
        os.close(root)
    return {"bytes": total, "entries": entries}


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
