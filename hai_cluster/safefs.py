"""Files in directories that other users might reach, for code that may run as root (hai-dev, the
agent's MPS directories).

A path is never trusted twice: a directory is opened component by component from `/` with
O_NOFOLLOW, and everything after that is done relative to its fd, so a symlink or a directory
swapped in between a check and a use is refused, not followed. The checks are OpenSSH's
StrictModes: each ancestor must be owned by root or the caller and not writable by anyone else
unless it is sticky (/tmp: others may add entries there but never rename or remove ours), and the
directory itself must be the caller's and writable by nobody else. Files are created
O_CREAT|O_EXCL|O_NOFOLLOW (0600, directories 0700): a name someone planted (a FIFO, a symlink, a
file with their content) makes the creation fail instead of being written through or read back.
Files read back are opened O_NOFOLLOW|O_NONBLOCK (a FIFO cannot hang the reader) and must be
regular, the caller's, and small.
"""
from __future__ import annotations

import os
import pwd
import stat

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
READ_LIMIT = 1 << 20


class UnsafePath(OSError):
    """A path that is not safe to use; the message says which and why."""


def _owner(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _check_ancestor(st: os.stat_result, path: str) -> None:
    uid = os.geteuid()
    if st.st_uid not in (0, uid):
        raise UnsafePath(f"{path} is owned by {_owner(st.st_uid)}, who could replace what is in it")
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        raise UnsafePath(f"{path} is writable by others (mode {stat.S_IMODE(st.st_mode):04o}) "
                         f"and not sticky: they could replace what is in it")


def _check_private(st: os.stat_result, path: str) -> None:
    if st.st_uid != os.geteuid():
        raise UnsafePath(f"{path} is owned by {_owner(st.st_uid)}, not by you")
    if st.st_mode & 0o022:
        raise UnsafePath(f"{path} is writable by others (mode {stat.S_IMODE(st.st_mode):04o})")


def _open_dir_at(dir_fd: int | None, name: str, path: str) -> int:
    try:
        return os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise UnsafePath(f"{path} is a symlink or not a directory ({exc.strerror})") from None


def _check_links(path: str) -> None:
    """A symlink on the way is followed only if root or the caller made it: another user's, say
    /tmp/x -> /root/.ssh, would point the tool at a directory of their choosing."""
    parts = [p for p in path.split("/") if p]
    for i in range(1, len(parts) + 1):
        prefix = "/" + "/".join(parts[:i])
        try:
            st = os.lstat(prefix)
        except (FileNotFoundError, NotADirectoryError):
            return  # the walk that follows says what is wrong
        if stat.S_ISLNK(st.st_mode) and st.st_uid not in (0, os.geteuid()):
            raise UnsafePath(f"{prefix} is a symlink owned by {_owner(st.st_uid)}")


def open_private_dir(path: str | os.PathLike, create: bool = True) -> tuple[int, str]:
    """(fd, real path) of a directory only the caller controls, created (0700, with any missing
    parents) when it is missing and `create` is set. Raises UnsafePath, or FileNotFoundError."""
    _check_links(os.path.abspath(path))
    real = os.path.realpath(path)  # then walked with O_NOFOLLOW: a link swapped in meanwhile is refused
    fd = os.open("/", DIR_FLAGS)
    try:
        _check_ancestor(os.fstat(fd), "/")
        parts = [p for p in real.split("/") if p]
        for i, part in enumerate(parts):
            sub = "/" + "/".join(parts[:i + 1])
            try:
                nfd = _open_dir_at(fd, part, sub)
            except FileNotFoundError:
                if not create:
                    raise FileNotFoundError(f"{sub}: no such directory") from None
                try:
                    os.mkdir(part, 0o700, dir_fd=fd)
                except FileExistsError:  # made meanwhile by someone: the checks below judge it
                    pass
                nfd = _open_dir_at(fd, part, sub)
            os.close(fd)
            fd = nfd
            (_check_private if i == len(parts) - 1 else _check_ancestor)(os.fstat(fd), sub)
        if not parts:
            _check_private(os.fstat(fd), "/")
        return fd, real
    except BaseException:
        os.close(fd)
        raise


def open_private_subdir(dir_fd: int, name: str, path: str, create: bool = False) -> int:
    """A directory in a private directory, held to the same rule (the caller's, 0700 if new)."""
    try:
        fd = _open_dir_at(dir_fd, name, path)
    except FileNotFoundError:
        if not create:
            raise
        os.mkdir(name, 0o700, dir_fd=dir_fd)
        fd = _open_dir_at(dir_fd, name, path)
    try:
        _check_private(os.fstat(fd), path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def create_file(dir_fd: int, name: str, data: bytes = b"", mode: int = 0o600, replace: bool = False) -> int:
    """Create `name` in the directory, exclusively; returns its fd, open for writing, after writing
    `data`. `replace` first unlinks an old entry of that name (only sound in a private directory,
    where nobody else made it)."""
    if replace:
        try:
            os.unlink(name, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode,
                 dir_fd=dir_fd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_file(dir_fd: int, name: str, data: bytes, mode: int = 0o600, replace: bool = False) -> None:
    os.close(create_file(dir_fd, name, data, mode, replace))


def read_file(dir_fd: int, name: str, path: str, limit: int = READ_LIMIT, owner: int | None = None) -> bytes | None:
    """The content of a regular file of the caller's (or of `owner`), at most `limit` bytes; None
    if it is missing."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC,
                     dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UnsafePath(f"{path} cannot be opened safely ({exc.strerror}: a symlink?)") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePath(f"{path} is not a regular file")
        if st.st_uid != (os.geteuid() if owner is None else owner):
            raise UnsafePath(f"{path} is owned by {_owner(st.st_uid)}, not by "
                             f"{'you' if owner is None else _owner(owner)}")
        if st.st_size > limit:
            raise UnsafePath(f"{path} is larger than {limit} bytes")
        data = b""
        while chunk := os.read(fd, limit + 1 - len(data)):
            data += chunk
            if len(data) > limit:
                break
        if len(data) > limit:
            raise UnsafePath(f"{path} is larger than {limit} bytes")
        return data
    finally:
        os.close(fd)


# ---- root below a directory of its own, in which users own subdirectories (the agent) ------------

def open_dir(dir_fd: int, name: str, path: str) -> int:
    """`name` in the directory `dir_fd`, a real directory (not a symlink), as an fd."""
    return _open_dir_at(dir_fd, name, path)


def ensure_dir(dir_fd: int, name: str, path: str, *, mode: int, uid: int, gid: int, adopt: int | None = None) -> int:
    """The directory `name` in `dir_fd` (a directory only the caller writes), made if missing,
    owned by uid:gid with `mode` (set with fchown/fchmod on its fd); its fd.

    An entry that is not a directory (a symlink, a FIFO, a file) is removed and made again: only
    whoever could write `dir_fd` put it there. An existing directory owned by someone other than
    root, the caller, uid or `adopt` (whose it was before) is refused: it is not ours to give."""
    for _ in range(3):
        try:
            os.mkdir(name, mode, dir_fd=dir_fd)
        except FileExistsError:
            pass
        try:
            fd = _open_dir_at(dir_fd, name, path)
        except FileNotFoundError:
            continue  # removed in between: make it again
        except UnsafePath:
            os.unlink(name, dir_fd=dir_fd)
            continue
        try:
            st = os.fstat(fd)
            if st.st_uid not in (0, os.geteuid(), uid, adopt):
                raise UnsafePath(f"{path} is owned by {_owner(st.st_uid)}, not by {_owner(uid)}")
            if os.geteuid() == 0 and (st.st_uid, st.st_gid) != (uid, gid):
                os.fchown(fd, uid, gid)
            if stat.S_IMODE(st.st_mode) != mode:
                os.fchmod(fd, mode)
            return fd
        except BaseException:
            os.close(fd)
            raise
    raise UnsafePath(f"{path} keeps changing")


def exists(dir_fd: int, name: str) -> bool:
    """Whether `name` is in `dir_fd`, whatever it is (the link itself, not its target)."""
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        return True
    except FileNotFoundError:
        return False
