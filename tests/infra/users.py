"""The test users and groups (haitest, haiother, ...): made on first use, once per machine.

Test processes run in parallel (pytest-xdist workers, other checkouts' runs): two `useradd`s at
once make one fail ("cannot lock /etc/passwd"), and a user made by whichever test came first
would get that test's shell. So every change to the account files goes through here, under one
machine-wide lock, and every test user gets the same home and shell (bash: interactive jobs and
`srun --pty` start the user's shell).
"""
from __future__ import annotations

import fcntl
import grp
import os
import pwd
import subprocess
from contextlib import contextmanager

LOCK = "/run/hai-test-users.lock"
SHELL = "/bin/bash"


@contextmanager
def _accounts_lock():
    fd = os.open(LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _run(argv: list[str]) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")


def ensure_user(name: str) -> pwd.struct_passwd:
    """The user `name`, made (with a home and bash) if it does not exist yet."""
    try:
        return pwd.getpwnam(name)
    except KeyError:
        pass
    with _accounts_lock():
        try:  # made by another test process while we waited for the lock
            return pwd.getpwnam(name)
        except KeyError:
            _run(["useradd", "--create-home", "--shell", SHELL, name])
        return pwd.getpwnam(name)


def ensure_group_member(user: str, group: str) -> None:
    """The group `group` exists and `user` (made if needed) is in it."""
    ensure_user(user)
    try:
        if user in grp.getgrnam(group).gr_mem:
            return
    except KeyError:
        pass
    with _accounts_lock():
        try:
            members = grp.getgrnam(group).gr_mem
        except KeyError:
            _run(["groupadd", group])
            members = []
        if user not in members:
            _run(["usermod", "-a", "-G", group, user])
