"""The program sshd's PAM stack runs on a node (pam_exec, account phase, as root): may PAM_USER
log in here, and into which job? The node's agent decides and adopts the session (agent/adopt.py).

    account required pam_exec.so quiet stdout /opt/hai-cluster/venv/bin/python -I -m hai_cluster.agent.adopt_pam --socket /run/hai/agent.sock

(`scripts/install-node --adopt` writes that line.) Exit 0 lets the user in; 1 refuses, and what
this prints (pam_exec's `stdout`) is shown to the ssh user. Root is let in without asking the
agent, so that a node whose agent is down can still be reached; everyone else is refused when
the agent cannot be asked. Outside the sshd service (or an other --service) and outside the
account phase it does nothing. A Python program, not C: it starts in ~20 ms (docs/OPERATIONS.md),
once per login, and imports only the standard library and the client side of the protocol.
"""
from __future__ import annotations

import os
import pwd
import sys

from ..cli.client import ClientError, ControllerClient, ReplyLost, Unreachable
from ..core.usernames import valid_user_name
from ..paths import DEFAULT_AGENT_SOCKET
from ..protocol import minipack

USAGE = "usage: adopt_pam [--socket PATH] [--service NAME]... [--timeout SECONDS]"
DENIED = "Access denied by hai-cluster"


def parse(argv: list[str]) -> tuple[str, set[str], float]:
    socket, services, timeout = DEFAULT_AGENT_SOCKET, set(), 10.0
    it = iter(argv)
    for arg in it:
        value = next(it, None)
        if value is None or arg not in ("--socket", "--service", "--timeout"):
            raise ValueError(USAGE)
        if arg == "--socket":
            socket = value
        elif arg == "--service":
            services.add(value)
        else:
            timeout = float(value)
    return socket, services or {"sshd"}, timeout


def decide(env: dict[str, str], socket: str, services: set[str], timeout: float) -> tuple[int, str]:
    """(exit status, message for the user)."""
    if env.get("PAM_TYPE") != "account" or env.get("PAM_SERVICE") not in services:
        return 0, ""
    user = env.get("PAM_USER", "")
    if not valid_user_name(user):
        return 1, f"{DENIED}: {user[:40]!r} is not a user name"
    try:
        if pwd.getpwnam(user).pw_uid == 0:
            return 0, ""
    except KeyError:
        return 1, f"{DENIED}: no user {user} here"
    client = ControllerClient(socket, timeout=timeout, wire=minipack)
    try:
        reply = client.call("adopt", {"user": user})
    except Unreachable:  # the client's own texts speak of the controller, whose client it is
        return 1, f"{DENIED}: cannot ask this node's hai-agent: nothing answers at {socket} (is hai-agent running?)"
    except ReplyLost:
        return 1, f"{DENIED}: this node's hai-agent gave no answer (within {timeout:g} s)"
    except ClientError as exc:  # the agent refused the request
        return 1, f"{DENIED}: this node's hai-agent refused: {str(exc)[:200]}"
    finally:
        client.close()
    if not isinstance(reply, dict) or reply.get("action") not in ("allow", "adopt", "deny"):
        return 1, f"{DENIED}: unexpected answer from this node's hai-agent"
    if reply["action"] == "deny":
        return 1, str(reply.get("message") or DENIED)[:500]
    return 0, ""


def main() -> int:
    try:
        socket, services, timeout = parse(sys.argv[1:])
    except ValueError as exc:
        print(f"{DENIED}: the PAM line is wrong: {exc}")
        return 1
    code, message = decide(dict(os.environ), socket, services, timeout)
    if message:
        print(message, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
