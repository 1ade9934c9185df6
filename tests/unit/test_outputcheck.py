"""The submission-time check of -o/-e paths against the mode bits the job's user will meet."""
from __future__ import annotations

import os
import shutil
import struct
import tempfile
from pathlib import Path

import pytest

from hai_cluster.controller.outputcheck import output_problem

UID, GID = 4242, 4343  # nobody on this machine owns these: only the "other" bits apply


@pytest.fixture
def tmp_path():
    """A directory every user can reach (pytest's own sit below a root-only one)."""
    d = Path(tempfile.mkdtemp(prefix="hai-outcheck-", dir="/tmp"))
    yield d
    shutil.rmtree(d)


def test_a_directory_the_user_cannot_write_is_refused(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o755)
    os.chmod(tmp_path, 0o755)
    assert output_problem("-o", str(locked / "x.out"), "/", UID, {GID}) == \
        f"-o {locked}/x.out: cannot write in {locked}: Permission denied"
    assert output_problem("-o", "x.out", str(locked), UID, {GID}) is not None  # relative: in the workdir
    assert output_problem("-o", None, str(locked), UID, {GID}) == \
        f"the default output slurm-%j.out: cannot write in {locked}: Permission denied"
    os.chmod(locked, 0o777)
    assert output_problem("-o", str(locked / "x-%j.out"), "/", UID, {GID}) is None


def test_group_bits_count_for_the_user_s_groups(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chown(shared, 0, GID)
    os.chmod(shared, 0o775)
    os.chmod(tmp_path, 0o755)
    assert output_problem("-e", str(shared / "e"), "/", UID, {GID}) is None
    assert output_problem("-e", str(shared / "e"), "/", UID, {GID + 1}) is not None


def test_an_unsearchable_parent_is_refused_and_an_existing_file_needs_only_its_own_bits(tmp_path):
    os.chmod(tmp_path, 0o700)
    assert "cannot write in" in output_problem("-o", str(tmp_path / "sub" / "x"), "/", UID, {GID})
    os.chmod(tmp_path, 0o755)
    target = tmp_path / "existing"
    target.write_text("")
    os.chmod(target, 0o666)  # the directory is root's 0755: the file itself is writable
    assert output_problem("-o", str(target), "/", UID, {GID}) is None
    os.chmod(target, 0o644)
    assert output_problem("-o", str(target), "/", UID, {GID}) == \
        f"-o {target}: cannot write {target}: Permission denied"


def test_what_cannot_be_known_here_is_left_to_the_run(tmp_path):
    os.chmod(tmp_path, 0o1777)
    for pattern in ("none", "NONE", "/dev/null", "/no/such/dir/x", f"{tmp_path}/%u/x", f"{tmp_path}/node-%N"):
        assert output_problem("-o", pattern, "/", UID, {GID}) is None, pattern
    assert output_problem("-o", "/root/x", "/", 0, {0}) is None  # root writes anywhere


def test_what_lies_behind_a_directory_the_user_cannot_search_or_a_link_stays_unknown(tmp_path):
    """Eleventh audit: the check ran as root through the user's symbolic links and inside
    directories the user may not search, so refused-or-accepted told whether a path existed
    there (a root-only file, another user's private project). Both answers are the same now."""
    os.chmod(tmp_path, 0o755)
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    (private / "secretproj").mkdir()
    (private / "secret.txt").write_text("")
    home = tmp_path / "home"
    home.mkdir(mode=0o777)
    answers = set()
    for name in ("secretproj", "nothere"):
        link = home / f"l-{name}"
        link.symlink_to(private / name)
        answers.add(output_problem("-o", f"{link}/out", "/", UID, {GID}))
    for name in ("secret.txt", "nothere.txt"):
        link = home / f"f-{name}"
        link.symlink_to(private / name)
        answers.add(output_problem("-o", str(link), "/", UID, {GID}))
    assert answers == {None}  # left to the run, which opens the file as the user
    inside = {output_problem("-o", str(private / n / "out"), "/", UID, {GID}) for n in ("secretproj", "nothere")}
    assert inside == {f"-o {private}/{n}/out: cannot write in {private}/{n}: Permission denied"
                      for n in ("secretproj", "nothere")}  # refused alike: the user may not search private


def _grant_by_acl(path: Path, uid: int) -> None:
    """A POSIX access ACL giving `uid` rwx (user::rwx user:uid:rwx group::--- mask::rwx other::---)."""
    entries = [(0x01, 7, 0xFFFFFFFF), (0x02, 7, uid), (0x04, 0, 0xFFFFFFFF), (0x10, 7, 0xFFFFFFFF),
               (0x20, 0, 0xFFFFFFFF)]
    os.setxattr(path, "system.posix_acl_access",
                struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries))


def test_a_directory_granted_by_an_acl_is_left_to_the_run(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o700)
    os.chmod(tmp_path, 0o755)
    assert output_problem("-o", str(shared / "x.out"), "/", UID, {GID}) is not None  # mode bits alone say no
    try:
        _grant_by_acl(shared, UID)
    except OSError as exc:
        pytest.skip(f"this file system takes no POSIX ACLs: {exc}")
    assert output_problem("-o", str(shared / "x.out"), "/", UID, {GID}) is None


def test_recently_writable_remembers_a_yes_for_its_ttl_and_no_more():
    from hai_cluster.controller.outputcheck import RecentlyWritable

    seen = RecentlyWritable(ttl=1.0, size=2)
    a, b, c = ("a.out", None, "/w", "u", 1, 1), ("b.out", None, "/w", "u", 1, 1), ("a.out", None, "/w", "v", 2, 2)
    assert not seen.fresh(a, 100.0)  # never checked: check it
    seen.note(a, 100.0)
    assert seen.fresh(a, 100.9) and not seen.fresh(a, 101.0)  # stale after ttl: checked again
    assert not seen.fresh(c, 100.5)  # another user's yes is not this one's
    seen.note(b, 100.1)
    seen.note(c, 100.2)  # size 2: the oldest goes
    assert not seen.fresh(a, 100.3) and seen.fresh(b, 100.3) and seen.fresh(c, 100.3)
