"""Who may do what: the caller's role, from the uid the kernel reported for the socket peer.

Three roles, from the controller config (`[access] admins`, `operators`; entries are user names or
`@group` for every member of a Unix group, primary group included):
- user: submits jobs, and cancels, signals, holds, releases and requeues its own;
- operator: also holds, releases, requeues and preempts anyone's job, drains and resumes nodes;
- admin: everything, including other users' jobs, node state down, accounts and limits.
uid 0 is always an admin. Every refusal says `Access/permission denied` and what was refused, and
is logged with the uid.
"""
from __future__ import annotations

import grp
import logging
import os
import pwd
from dataclasses import dataclass, field
from typing import Any

from ..config import AccessConfig
from ..core.usertext import printable
from ..logsetup import LogBudget
from ..transport.rpc import RequestError

log = logging.getLogger("hai.access")

USER, OPERATOR, ADMIN = "user", "operator", "admin"


@dataclass(frozen=True)
class Caller:
    uid: int
    gid: int
    pid: int
    user: str
    role: str = USER
    # The connection it came on (client_steps.ClientLink): where its steps' output is pushed
    link: Any = field(default=None, compare=False, repr=False)

    @property
    def admin(self) -> bool:
        return self.role == ADMIN

    @property
    def operator(self) -> bool:
        """Operators and admins: may act on anyone's job (hold, requeue, preempt) and drain nodes."""
        return self.role in (OPERATOR, ADMIN)


def group_names(user: str, gid: int, *, unnamed_as_ids: bool = False) -> set[str]:
    """The Unix groups of `user` (its primary group `gid` included); empty when unknown. A group id
    without a name is left out, or given as its number with `unnamed_as_ids`."""
    try:
        gids = os.getgrouplist(user, gid)
    except (OSError, KeyError):
        gids = [gid] if gid >= 0 else []
    names = set()
    for g in gids:
        try:
            names.add(grp.getgrgid(g).gr_name)
        except KeyError:
            if unnamed_as_ids:
                names.add(str(g))
    return names


def matches(entries: tuple[str, ...], user: str, groups: set[str]) -> bool:
    return any(e[1:] in groups if e.startswith("@") else e == user for e in entries)


def role_of(uid: int, user: str, groups: set[str], access: AccessConfig) -> str:
    if uid == 0 or matches(access.admins, user, groups):
        return ADMIN
    if matches(access.operators, user, groups):
        return OPERATOR
    return USER


def caller_from_creds(pid: int, uid: int, gid: int, access: AccessConfig) -> Caller:
    try:
        pw = pwd.getpwuid(uid)
        user, primary = pw.pw_name, pw.pw_gid
    except KeyError:
        user, primary = str(uid), gid
    groups = group_names(user, primary) if access.admins or access.operators else set()
    return Caller(uid=uid, gid=gid, pid=pid, user=user, role=role_of(uid, user, groups, access))


MAX_LOGGED = 300  # characters of a denial's text in the log; the caller gets it whole
# Denials logged a minute: a refused request sent in a loop must not fill the disk (eleventh
# audit: 1.5 GB of log in 10 s); the rest are counted.
_denials = LogBudget(log, 120, "access denial(s)")


def deny(caller: Caller, what: str) -> RequestError:
    """The refusal to raise (or whose text to report), logged with the caller's uid."""
    if _denials.allow():
        log.warning("denied uid=%d (%s, %s) pid=%d: %s", caller.uid, caller.user, caller.role, caller.pid,
                    printable(what)[:MAX_LOGGED])
    return RequestError(f"Access/permission denied: {what}")


def may_act_on(caller: Caller, owner: str, *, operators: bool) -> bool:
    """The job's owner may; so may admins, and operators where `operators` says so."""
    return owner == caller.user or caller.admin or (operators and caller.operator)
