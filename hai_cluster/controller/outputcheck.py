"""Refuse at submission an -o/-e path its user plainly cannot write (sbatch would only fail the
run later): the controller shares the submit host's file system view (hsubmit reaches it over a
Unix socket), so the mode bits it reads there are the ones the job's user will meet.

Only a definite "no" refuses: a directory this host does not have (it may exist on the nodes), a
part of the path made by a pattern (%N, %j ...), a path the controller cannot look into (a
user's private directory, now that it runs as its own user hai; root-squashed NFS; /tmp, which
hai-controller.service makes private to it): all are left to the run, which reports "opening
stdout PATH failed: ..." if it must. A file or directory with a POSIX ACL is left to the run
too: its mode bits do not tell. (The unit shows it home directories read-only, not hidden: an
inaccessible /home would read as mode 000 and refuse everyone.)

The controller may run as root (by hand, older installs), so it looks only where the user could:
down the path one directory at a time, each searchable by the user before the next is looked
at, and never through a symbolic link (left to the run, which opens the file as the user).
Otherwise the answer told whether a path exists inside a directory the user may not search
(eleventh audit)."""
from __future__ import annotations

import os
import posixpath
import stat
from collections import OrderedDict

from ..core.patterns import DEFAULT_OUTPUT

_W, _X = 2, 1  # the "other" permission bits; shifted for the owner and the group


def _has_acl(path: str) -> bool:
    try:
        return "system.posix_acl_access" in os.listxattr(path)
    except OSError:
        return False


def _may(st: os.stat_result, uid: int, gids: set[int], bits: int) -> bool:
    if uid == st.st_uid:
        mode = st.st_mode >> 6
    elif st.st_gid in gids:
        mode = st.st_mode >> 3
    else:
        mode = st.st_mode
    return mode & bits == bits


def output_problem(option: str, pattern: str | None, workdir: str, uid: int, gids: set[int]) -> str | None:
    """Why the user (uid, with group ids gids) cannot write where `pattern` points, or None."""
    given = pattern
    pattern = DEFAULT_OUTPUT if pattern is None else pattern
    if uid == 0 or pattern.lower() == "none":
        return None
    literal = "\\" in pattern  # a backslash turns the %-letters off (core.patterns)
    path = posixpath.normpath(posixpath.join(workdir, pattern.replace("\\", "")))
    directory, name = posixpath.split(path)
    chain, complete = ["/"], True
    for part in (p for p in directory.split("/") if p):
        if not literal and "%" in part:
            complete = False
            break
        chain.append(posixpath.join(chain[-1], part))
    shown = f"{option} {given}" if given is not None else f"the default output {DEFAULT_OUTPUT}"
    for d in chain:  # each one is looked at only once the user may search the one above it
        try:
            st = os.lstat(d)
        except OSError:
            return None
        if not stat.S_ISDIR(st.st_mode):  # a symbolic link (or not a directory): the run will tell
            return None
        if not _may(st, uid, gids, _X) and not _has_acl(d):
            return f"{shown}: cannot write in {directory}: Permission denied"
    if not complete:
        return None
    target = None
    if literal or "%" not in name:
        try:
            target = os.lstat(path)  # an existing file needs no write access to its directory
        except OSError:
            pass
    if target is None:
        if not _may(st, uid, gids, _W) and not _has_acl(chain[-1]):
            return f"{shown}: cannot write in {directory}: Permission denied"
        return None
    if stat.S_ISREG(target.st_mode) and not _may(target, uid, gids, _W) and not _has_acl(path):
        return f"{shown}: cannot write {path}: Permission denied"
    return None


def outputs_problem(stdout: str | None, stderr: str | None, workdir: str, user: str, uid: int,
                    gid: int) -> str | None:
    """output_problem for a job's -o and -e (without -e, stderr goes to the -o file)."""
    try:
        gids = set(os.getgrouplist(user, gid))
    except OSError:
        gids = {gid}
    for option, pattern in (("-o", stdout), ("-e", stderr)):
        if option == "-e" and pattern is None:
            continue
        problem = output_problem(option, pattern, workdir, uid, gids)
        if problem:
            return problem
    return None


class RecentlyWritable:
    """Output locations (patterns, workdir, user) found writable less than `ttl` seconds ago.

    A burst of submissions from one directory asks the same question each time, and the answer
    costs a hop to a thread (a hung mount must not stall the event loop): 1.2 ms of a 7 ms
    submission under load. Only a yes is remembered: a no is checked again, so a user who fixed
    the permissions is not refused from memory; a yes that went stale is what sbatch does
    anyway, and the run reports "opening stdout ... failed"."""

    def __init__(self, ttl: float = 1.0, size: int = 4096) -> None:
        self.ttl, self.size = ttl, size
        self._seen: OrderedDict[tuple, float] = OrderedDict()

    def fresh(self, key: tuple, now: float) -> bool:
        seen = self._seen.get(key)
        return seen is not None and now - seen < self.ttl

    def note(self, key: tuple, now: float) -> None:
        self._seen[key] = now
        self._seen.move_to_end(key)
        while len(self._seen) > self.size:
            self._seen.popitem(last=False)
