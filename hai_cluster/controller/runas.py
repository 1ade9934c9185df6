"""Who the controller runs as: the owner of its store, never root when that is someone else.

Under systemd it starts as the unprivileged user `hai` (User=hai in hai-controller.service;
scripts/install-controller creates the user and gives it /var/lib/hai). Started as root
instead, by hand where systemd does not run, or as an operator's `hai-controller db upgrade`,
it becomes the owner of the store's directory (the SQLite file's, or `state_dir` for
PostgreSQL) before it opens anything there: otherwise the files it creates (the database, its
WAL, the lock) would be root's, and the service could not open them at its next start; and
PostgreSQL's peer authentication sees the same user as under the service. The daemon binds its
socket first (as root, in root's /run/hai), then changes user.

Only the configured user (`[controller] run_as`, default hai) is become: a store directory that
belongs to anyone else (a user who made /tmp/hai first, a home directory named by mistake) is
refused, since the controller's user can act for every user of the cluster.

Nothing changes when the process is not root, when the directory is root's (the daemon says it
stays root), or when it does not exist yet (a development setup: the store is then made by and
for whoever runs it)."""
from __future__ import annotations

import os
import pwd

from sqlalchemy.engine import make_url

from ..config import ControllerConfig


class RunAsError(Exception):
    pass


def store_directory(cfg: ControllerConfig) -> str:
    """The directory whose owner the controller runs as: the SQLite file's, else state_dir."""
    url = make_url(cfg.database)
    if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
        return os.path.dirname(os.path.abspath(url.database))
    return cfg.state_dir


def become_store_owner(cfg: ControllerConfig) -> str | None:
    """As root: switch (uid, gid, groups, HOME) to the owner of store_directory(cfg) when that is
    cfg.run_as, and return its name; change nothing and return None when it is root; refuse any
    other owner. Call it before any thread that must keep root is started: the switch is for the
    whole process, for good."""
    if os.geteuid() != 0:
        return None
    directory = store_directory(cfg)
    try:
        st = os.stat(directory)  # root's configuration names it, in directories root owns
    except FileNotFoundError:
        return None
    if st.st_uid == 0:
        return None
    try:
        pw = pwd.getpwuid(st.st_uid)
    except KeyError:
        raise RunAsError(f"{directory} belongs to uid {st.st_uid}, which has no user name: the controller runs "
                         f"as the owner of its store; give it to the controller's user "
                         f"(chown {cfg.run_as}: {directory})") from None
    if pw.pw_name != cfg.run_as:
        raise RunAsError(f"{directory} belongs to {pw.pw_name}, not to the controller's user {cfg.run_as} "
                         f"([controller] run_as): the controller will not run as {pw.pw_name}; give the "
                         f"directory to {cfg.run_as} (chown -R {cfg.run_as}: {directory}) or set run_as")
    os.setgroups(os.getgrouplist(pw.pw_name, pw.pw_gid))
    os.setresgid(pw.pw_gid, pw.pw_gid, pw.pw_gid)
    os.setresuid(pw.pw_uid, pw.pw_uid, pw.pw_uid)
    os.environ.update(HOME=pw.pw_dir, USER=pw.pw_name, LOGNAME=pw.pw_name)
    return pw.pw_name
