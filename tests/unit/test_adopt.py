"""ssh logins into a job's node: who gets in and into which job (agent/adopt.py), the PAM program's
checks before it asks the agent (agent/adopt_pam.py), and [adopt] in agent.toml. The real path,
sshd, PAM and cgroups, is tests/e2e/test_adopt.py."""
from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from types import SimpleNamespace

import pytest

from hai_cluster.agent import adopt_pam
from hai_cluster.agent.adopt import Adopter, Candidate, Peer, decide, env_text, parent_pid
from hai_cluster.config import AdoptConfig, ConfigError, load_agent_config
from hai_cluster.core.usernames import valid_user_name
from hai_cluster.transport.rpc import RequestError

CFG = AdoptConfig()


def test_root_and_listed_operators_get_in_without_a_job():
    assert decide("root", 0, "n1", CFG, []).action == "allow"
    ops = AdoptConfig(allow_users=("alice",))
    assert decide("alice", 1000, "n1", ops, []).action == "allow"
    assert decide("bob", 1001, "n1", ops, []).action == "deny"


def test_a_user_without_a_job_is_refused_with_a_message_for_them():
    d = decide("bob", 1001, "gpu07", CFG, [])
    assert (d.action, d.key) == ("deny", None)
    assert d.message == "Access denied by hai-cluster: you (bob) have no running job on node gpu07"


def test_the_newest_job_is_chosen_as_slurm_does_or_none_with_multiple_deny():
    jobs = [Candidate((12, 0), 100.0), Candidate((9, 1), 300.0), Candidate((15, 0), 200.0)]
    d = decide("bob", 1001, "n1", CFG, jobs)
    assert (d.action, d.key) == ("adopt", (9, 1))  # started last, whatever its id
    assert decide("bob", 1001, "n1", CFG, jobs[:1]).key == (12, 0)
    strict = decide("bob", 1001, "n1", AdoptConfig(multiple="deny"), jobs)
    assert strict.action == "deny" and "several jobs on node n1 (12, 15, 9)" in strict.message
    assert decide("bob", 1001, "n1", AdoptConfig(multiple="deny"), jobs[:1]).action == "adopt"


def test_env_text_is_sourced_by_sh_with_the_values_intact(tmp_path):
    env = {"HAI_JOB_ID": "7", "CUDA_VISIBLE_DEVICES": "1,3", "HAI_JOB_NAME": "x'; touch pwned; echo '$(id)\n`id`",
           "SECRET_TOKEN": "not for the session", "PATH": "/nowhere"}
    f = tmp_path / "7.0.sh"
    f.write_text(env_text(env))
    out = subprocess.run(["sh", "-c", '. "$1"; printf "%s|%s|%s|%s" "$HAI_JOB_ID" "$CUDA_VISIBLE_DEVICES" '
                          '"$HAI_JOB_NAME" "${SECRET_TOKEN-unset}"', "sh", str(f)],
                         capture_output=True, text=True, cwd=tmp_path, check=True).stdout
    assert out == f"7|1,3|{env['HAI_JOB_NAME']}|unset"
    assert not (tmp_path / "pwned").exists()


def test_parent_pid_reads_past_a_command_name_with_parentheses_and_spaces(tmp_path):
    assert parent_pid(os.getpid()) == os.getppid()
    odd = tmp_path / "a) 1 2 (b"
    shutil.copy(shutil.which("sleep"), odd)
    proc = subprocess.Popen([str(odd), "30"])
    try:
        assert parent_pid(proc.pid) == os.getpid()
    finally:
        proc.kill()
        proc.wait()


def adopter() -> Adopter:
    # no runs: these requests are refused or denied before any run is looked at
    return Adopter(AdoptConfig(), "n1", SimpleNamespace(runs={}))


@pytest.mark.parametrize("body, why", [
    ({"user": "bob", "pid": 1}, "unknown field(s): pid"),
    ({}, "lacks field(s): user"),
    ("bob", "must be a map"),
    ({"user": "bob;rm"}, "adopt.user must be a user name, got 'bob;rm'"),
    ({"user": "x" * 5000}, "adopt.user must be a user name"),
    ({"user": 5}, "adopt.user must be a user name, got 5"),
])
def test_a_bad_request_is_refused_with_what_was_wrong(body, why):
    from hai_cluster.protocol.runspec import SpecError
    with pytest.raises((RequestError, SpecError), match=why.replace("(", r"\(").replace(")", r"\)")):
        adopter().adopt(body, Peer(pid=os.getpid(), uid=0))


def test_only_root_may_ask():
    with pytest.raises(RequestError, match="only root may ask"):
        adopter().adopt({"user": "root"}, Peer(pid=os.getpid(), uid=1000))


def test_an_unknown_user_is_denied_and_root_allowed_by_the_agent():
    assert adopter().adopt({"user": "hai-no-such-user"}, Peer(os.getpid(), 0))["action"] == "deny"
    assert adopter().adopt({"user": "root"}, Peer(os.getpid(), 0))["action"] == "allow"


def test_the_agent_table_serves_adopt_to_the_connection_peer():
    """adopt is in the agent's table (deny by default: only listed methods exist), outside the
    controller's epoch gate, and answers bad input as a RequestError."""
    from hai_cluster.agent.service import build_table
    agent = SimpleNamespace(adopter=adopter(), cfg=SimpleNamespace(spool="/nonexistent-spool", name="n1"),
                            runs=SimpleNamespace())
    table = build_table(agent)
    assert "adopt" in table.methods
    reply = asyncio.run(table.dispatch("adopt", {"user": "root"}, Peer(os.getpid(), 0)))
    assert reply["action"] == "allow"
    with pytest.raises(RequestError, match="unknown field"):
        asyncio.run(table.dispatch("adopt", {"user": "root", "epoch": 3}, Peer(os.getpid(), 0)))


PAM = {"PAM_TYPE": "account", "PAM_SERVICE": "sshd"}


def test_the_pam_program_does_nothing_outside_sshd_s_account_phase(tmp_path):
    nowhere = str(tmp_path / "no.sock")
    assert adopt_pam.decide({**PAM, "PAM_TYPE": "open_session", "PAM_USER": "bob"}, nowhere, {"sshd"}, 1) == (0, "")
    assert adopt_pam.decide({**PAM, "PAM_SERVICE": "su", "PAM_USER": "bob"}, nowhere, {"sshd"}, 1) == (0, "")


def test_the_pam_program_lets_root_in_without_the_agent_and_refuses_others_without_it(tmp_path):
    nowhere = str(tmp_path / "no.sock")
    assert adopt_pam.decide({**PAM, "PAM_USER": "root"}, nowhere, {"sshd"}, 1) == (0, "")
    code, msg = adopt_pam.decide({**PAM, "PAM_USER": "haitest"}, nowhere, {"sshd"}, 1)
    assert code == 1 and msg == ("Access denied by hai-cluster: cannot ask this node's hai-agent: "
                                f"nothing answers at {nowhere} (is hai-agent running?)")
    code, msg = adopt_pam.decide({**PAM, "PAM_USER": "-oProxyCommand=x"}, nowhere, {"sshd"}, 1)
    assert code == 1 and "'-oProxyCommand=x' is not a user name" in msg
    assert adopt_pam.decide({**PAM, "PAM_USER": "hai-no-such-user"}, nowhere, {"sshd"}, 1)[0] == 1
    assert adopt_pam.decide({**PAM}, nowhere, {"sshd"}, 1)[0] == 1  # no PAM_USER


def test_the_pam_program_s_arguments():
    assert adopt_pam.parse(["--socket", "/run/x.sock", "--service", "sshd", "--service", "login",
                            "--timeout", "3"]) == ("/run/x.sock", {"sshd", "login"}, 3.0)
    assert adopt_pam.parse([]) == ("/run/hai/agent.sock", {"sshd"}, 10.0)
    for bad in (["--socket"], ["--bogus", "1"], ["--timeout", "soon"]):
        with pytest.raises(ValueError):
            adopt_pam.parse(bad)


def test_user_names():
    for ok in ("root", "haitest", "_svc", "a.b-c", "host$", "x" * 32):
        assert valid_user_name(ok), ok
    for bad in ("", "Root", "-o", "a b", "a/b", "x" * 33, "a\n", None, 3):
        assert not valid_user_name(bad), bad


def test_adopt_config(tmp_path):
    p = tmp_path / "agent.toml"
    p.write_text('[agent]\nname = "n1"\n[adopt]\nallow_users = ["ops", "root"]\nmultiple = "deny"\n'
                 'env_dir = "adopt-env"\n')
    cfg = load_agent_config(p).adopt
    assert cfg == AdoptConfig(allow_users=("ops", "root"), multiple="deny", env_dir=str(tmp_path / "adopt-env"))
    assert load_agent_config(_write(tmp_path, "")).adopt == AdoptConfig()
    for text, why in (('allow_users = ["a b"]', "not a user name: 'a b'"),
                      ('multiple = "oldest"', "adopt.multiple must be one of newest, deny"),
                      ('allow = ["x"]', r"unknown key\(s\) in \[adopt\]: allow")):
        with pytest.raises(ConfigError, match=why):
            load_agent_config(_write(tmp_path, f"[adopt]\n{text}\n"))


def _write(tmp_path, text: str):
    p = tmp_path / "a2.toml"
    p.write_text(f'[agent]\nname = "n1"\n{text}')
    return p
