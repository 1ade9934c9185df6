"""safefs: what it refuses (planted FIFOs, symlinks, files, loose modes) without following or
blocking, and that what it creates is exclusive and private. Other users: tests/e2e/test_security_devtools.py."""
from __future__ import annotations

import os
import stat

import pytest

from hai_cluster import safefs


def test_creates_missing_directories_private_and_reuses_its_own(tmp_path):
    fd, real = safefs.open_private_dir(tmp_path / "a" / "b")
    os.close(fd)
    assert real == str(tmp_path / "a" / "b")
    assert stat.S_IMODE(os.stat(tmp_path / "a").st_mode) == 0o700 == stat.S_IMODE(os.stat(real).st_mode)
    fd, _ = safefs.open_private_dir(real, create=False)
    os.close(fd)
    with pytest.raises(FileNotFoundError):
        safefs.open_private_dir(tmp_path / "missing", create=False)


def test_refuses_loose_modes_and_symlinks_on_the_way(tmp_path):
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o775)
    with pytest.raises(safefs.UnsafePath, match="writable by others"):
        safefs.open_private_dir(loose)
    with pytest.raises(safefs.UnsafePath, match="writable by others .* and not sticky"):
        safefs.open_private_dir(loose / "sub")
    loose.chmod(0o1777)  # sticky, like /tmp: others cannot rename what is in it
    fd, _ = safefs.open_private_dir(loose / "sub")
    os.close(fd)
    (tmp_path / "file").write_text("")
    with pytest.raises(safefs.UnsafePath, match="not a directory"):
        safefs.open_private_dir(tmp_path / "file" / "x")


def test_files_are_created_exclusively_and_read_back_only_if_regular(tmp_path):
    fd, _ = safefs.open_private_dir(tmp_path / "d")
    try:
        safefs.write_file(fd, "a", b"one")
        assert stat.S_IMODE(os.stat(tmp_path / "d" / "a").st_mode) == 0o600
        with pytest.raises(FileExistsError):
            safefs.write_file(fd, "a", b"two")
        safefs.write_file(fd, "a", b"two", replace=True)
        assert safefs.read_file(fd, "a", "a") == b"two"
        assert safefs.read_file(fd, "none", "none") is None

        os.mkfifo(tmp_path / "d" / "fifo")  # neither written through nor waited on
        with pytest.raises(FileExistsError):
            safefs.write_file(fd, "fifo", b"x")
        with pytest.raises(safefs.UnsafePath, match="not a regular file"):
            safefs.read_file(fd, "fifo", "fifo")
        os.symlink(tmp_path / "d" / "a", tmp_path / "d" / "link")
        with pytest.raises(FileExistsError):
            safefs.write_file(fd, "link", b"x")
        with pytest.raises(safefs.UnsafePath, match="cannot be opened safely"):
            safefs.read_file(fd, "link", "link")
        safefs.write_file(fd, "big", b"x" * 101)
        with pytest.raises(safefs.UnsafePath, match="larger than 100 bytes"):
            safefs.read_file(fd, "big", "big", limit=100)
    finally:
        os.close(fd)
