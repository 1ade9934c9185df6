"""Roles from names and groups, and the environment filters (pure parts of docs/SECURITY.md)."""
from __future__ import annotations

from hai_cluster.config import AccessConfig
from hai_cluster.controller.access import ADMIN, OPERATOR, USER, group_names, role_of
from hai_cluster.core.envfilter import helper_env, submitted_env


def test_runtime_as_root_gets_no_loader_hooks():
    env = {"LD_PRELOAD": "/tmp/evil.so", "LD_AUDIT": "x", "BASH_FUNC_ls%%": "() { :; }", "PYTHONPATH": "/x",
           "PATH": "/usr/bin", "NOTIFY_SOCKET": "/run/x", "HOME": "/home/u"}
    assert helper_env(env) == {"PATH": "/usr/bin", "HOME": "/home/u"}
    assert "LD_PRELOAD" in submitted_env(env) and "NOTIFY_SOCKET" not in submitted_env(env)


def test_roles_from_names_and_groups():
    access = AccessConfig(admins=("root", "@wheel"), operators=("alice", "@ops"))
    assert role_of(0, "anyone", set(), access) == ADMIN
    assert role_of(1000, "bob", {"wheel"}, access) == ADMIN
    assert role_of(1001, "alice", set(), access) == OPERATOR
    assert role_of(1002, "carol", {"ops", "users"}, access) == OPERATOR
    assert role_of(1003, "dave", {"users"}, access) == USER
    assert role_of(1004, "ops", set(), access) == USER  # "@ops" is a group, not the user "ops"



def test_group_names_include_the_primary_group():
    assert "root" in group_names("root", 0)
    assert group_names("no-such-user-here", 0) == {"root"}
