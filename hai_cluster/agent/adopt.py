"""ssh logins into a job's node, as Slurm's pam_slurm_adopt does them.

sshd runs `hai_cluster.agent.adopt_pam` through pam_exec in its PAM account phase, as root, in
the connection's privileged sshd process (the one that forks the user's session). That program
asks this agent, over its root-only socket, whether PAM_USER may log in:
- root and the users in [adopt] allow_users: yes, and nothing changes;
- a user with a running job here: yes, and the calling program's parent (that sshd process,
  found from the connection's SO_PEERCRED pid, never from the request) joins the job's run
  cgroup in every hierarchy. The session and all it starts are then charged to the job, held to
  its limits, and killed with it: the run's end kills its whole cgroup;
- anyone else: no, with a message sshd shows the user.
Several jobs of the user here: the newest (latest start) one, Slurm's default; [adopt] multiple =
"deny" refuses instead. PAM cannot take environment variables from pam_exec, so the agent writes
the job's GPU variables (CUDA_VISIBLE_DEVICES, ...) into <env_dir>/<job>.<attempt>.sh, the user's,
0400, which the profile.d snippet install-node puts in place sources in login shells.
"""
from __future__ import annotations

import logging
import os
import pwd
import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

from .. import safefs
from ..config.agent import AdoptConfig
from ..core.usernames import valid_user_name
from ..protocol.runspec import check_keys
from ..transport.rpc import RequestError
from . import contain, spool
from .cgroups import RunCgroup
from .gpushare import SHARE_ENV

if TYPE_CHECKING:
    from .runs import RunTable

log = logging.getLogger(__name__)

# What an adopted session gets of the job's environment: which job, where, and which GPUs
ENV_KEYS = ("HAI_JOB_ID", "HAI_JOB_NAME", "HAI_NODELIST", "HAI_GPUS_ON_NODE", "SLURM_JOB_ID", "SLURM_JOBID",
            "SLURM_JOB_NAME", "SLURM_JOB_NODELIST", "CUDA_DEVICE_ORDER", "NVIDIA_VISIBLE_DEVICES",
            *SHARE_ENV)  # a GPU share's: its card's UUID or MIG instance, its MPS daemon and limits


@dataclass(frozen=True)
class Peer:
    """Who is on the other end of an agent connection (SO_PEERCRED), the RPC handlers' context."""
    pid: int
    uid: int

    def __str__(self) -> str:
        return f"pid {self.pid} uid {self.uid}"


@dataclass(frozen=True)
class Candidate:
    """A running job of the user on this node."""
    key: tuple[int, int]  # (job, attempt)
    start_time: float


@dataclass(frozen=True)
class Decision:
    action: str  # "allow" (no job needed), "adopt" (into `key`'s cgroup), "deny"
    message: str  # for the ssh user (deny) or the log
    key: tuple[int, int] | None = None


def decide(user: str, uid: int, node: str, cfg: AdoptConfig, jobs: Iterable[Candidate]) -> Decision:
    """Pure: who gets in, and into which job."""
    if uid == 0 or user in cfg.allow_users:
        return Decision("allow", f"{user} is {'root' if uid == 0 else 'in [adopt] allow_users'}")
    jobs = sorted(jobs, key=lambda c: (c.start_time, c.key))
    if not jobs:
        return Decision("deny", f"Access denied by hai-cluster: you ({user}) have no running job on node {node}")
    if len(jobs) > 1 and cfg.multiple == "deny":
        ids = ", ".join(str(c.key[0]) for c in jobs)
        return Decision("deny", f"Access denied by hai-cluster: you ({user}) have several jobs on node {node} "
                                f"({ids}) and this node does not choose among them")
    newest = jobs[-1]
    return Decision("adopt", f"{user} adopted into job {newest.key[0]}", newest.key)


def parent_pid(pid: int) -> int:
    """The parent of `pid`, from /proc/PID/stat (field 4, after the command in parentheses)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        data = f.read(4096)
    return int(data[data.rindex(b")") + 2:].split()[1])


def env_text(environment: dict[str, str]) -> str:
    """The job's variables for the session, as shell assignments (values quoted: they are the
    user's own, sourced by the user's own shell)."""
    lines = ["# hai-cluster: the job this ssh session was adopted into (scripts/install-node --adopt)"]
    lines += [f"export {k}={shlex.quote(environment[k])}" for k in ENV_KEYS if k in environment]
    return "\n".join(lines) + "\n"


class Adopter:
    def __init__(self, cfg: AdoptConfig, node: str, runs: "RunTable") -> None:
        self.cfg, self.node, self.runs = cfg, node, runs

    def candidates(self, uid: int) -> list[Candidate]:
        return [Candidate(key, r.status.start_time) for key, r in self.runs.runs.items()
                if r.spec is not None and r.spec.uid == uid and not r.status.ended and r.status.pid is not None]

    def adopt(self, body: object, peer: Peer) -> dict:
        if peer.uid != 0:  # the socket is root's; an agent run as another user adopts nothing
            raise RequestError("adopt: only root may ask (sshd's pam_exec runs as root)")
        check_keys("adopt body", body, ("user",))
        user = body["user"]
        if not valid_user_name(user):
            raise RequestError(f"adopt.user must be a user name, got {user!r:.60}")
        try:
            pw = pwd.getpwnam(user)
        except KeyError:
            return self._reply(Decision("deny", f"Access denied by hai-cluster: no user {user} on node {self.node}"))
        decision = decide(user, pw.pw_uid, self.node, self.cfg, self.candidates(pw.pw_uid))
        if decision.action != "adopt":
            return self._reply(decision)
        try:
            self._move(decision.key, peer.pid)
        except AdoptError as exc:
            return self._reply(Decision("deny", f"Access denied by hai-cluster: job {decision.key[0]} on node "
                                                f"{self.node}: {exc}"))
        self._write_env(decision.key, pw)
        return self._reply(decision)

    def _reply(self, d: Decision) -> dict:
        log.info("adopt %s: %s", d.action, d.message)
        return {"action": d.action, "message": d.message, "job_id": d.key[0] if d.key else None}

    def _move(self, key: tuple[int, int], caller: int) -> None:
        """The caller's parent (the connection's sshd process) into the run's cgroups."""
        run = self.runs.runs[key]
        rec = contain._read_record(run.dir).get("cgroup")
        if not rec:
            raise AdoptError("this node runs jobs without cgroups, so a login cannot be tied to the job")
        try:
            target = parent_pid(caller)
        except (OSError, ValueError, IndexError) as exc:
            raise AdoptError(f"cannot find the ssh session's process: {exc}") from None
        if target <= 1 or target == os.getpid():  # the caller's parent died (reparented), or is us
            raise AdoptError(f"the ssh session's process is gone (caller {caller}'s parent is {target})")
        cg = RunCgroup.from_record(rec)
        for procs in cg.procs_files():
            try:
                fd = os.open(procs, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                try:
                    os.write(fd, str(target).encode())
                finally:
                    os.close(fd)
            except OSError as exc:
                raise AdoptError(f"cannot move the session into {procs}: {exc.strerror}") from None
        try:  # the caller still waits on our answer: its parent cannot have changed unless it died
            still = parent_pid(caller) == target
        except (OSError, ValueError, IndexError):
            still = False
        if not still:
            raise AdoptError("the ssh session's process went away while it was adopted")
        log.info("adopt: sshd process %d (parent of %d) into job %s.%s's cgroup %s", target, caller, *key, cg.path)

    def _env_dir(self, create: bool) -> int | None:
        """An fd of [adopt] env_dir, made root's 0711 if missing; None if it is absent, or is
        not root's alone (then nothing is written or removed there)."""
        try:
            if create:
                os.makedirs(self.cfg.env_dir, 0o711, exist_ok=True)
            dfd = os.open(self.cfg.env_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            if create:
                log.warning("adopt: no env file directory %s: %s", self.cfg.env_dir, exc)
            return None
        st = os.fstat(dfd)
        if st.st_uid != 0 or st.st_mode & 0o022:
            log.warning("adopt: %s is not root's alone: no env files there", self.cfg.env_dir)
            os.close(dfd)
            return None
        return dfd

    def _write_env(self, key: tuple[int, int], pw: pwd.struct_passwd) -> None:
        """<env_dir>/<job>.<attempt>.sh, the user's, 0400: written beside and renamed over, in a
        directory of root's (nothing there is the user's to swap)."""
        spec = self.runs.runs[key].spec
        name = spool.run_dir_name(*key)
        dfd = self._env_dir(create=True)
        if dfd is None:
            return
        try:
            tmp = f".{name}.sh.new"
            fd = safefs.create_file(dfd, tmp, env_text(dict(spec.environment)).encode(), 0o400, replace=True)
            try:
                os.fchown(fd, pw.pw_uid, pw.pw_gid)
                os.fchmod(fd, 0o400)
            finally:
                os.close(fd)
            os.replace(tmp, f"{name}.sh", src_dir_fd=dfd, dst_dir_fd=dfd)
        except OSError as exc:
            log.warning("adopt: cannot write the env file of job %s.%s: %s", *key, exc)
        finally:
            os.close(dfd)

    def _remove(self, names: Iterable[str]) -> None:
        dfd = self._env_dir(create=False)
        if dfd is None:
            return
        try:
            for n in names:
                try:
                    os.unlink(n, dir_fd=dfd)
                except OSError:
                    pass
        finally:
            os.close(dfd)

    def ended(self, keys: Iterable[tuple[int, int]]) -> None:
        """Runs that ended: their env files go."""
        names = [f"{spool.run_dir_name(*key)}.sh" for key in keys]
        if names:
            self._remove(names)

    def sweep(self) -> None:
        """At start: env files of runs no longer running (the agent was down when they ended)."""
        try:
            names = os.listdir(self.cfg.env_dir)
        except OSError:
            return
        live = {spool.run_dir_name(*k) for k, r in self.runs.runs.items() if not r.status.ended}
        self._remove(n for n in names if n.endswith(".sh") and n[:-3] not in live)


class AdoptError(Exception):
    """The job was found but the session could not be put into it."""
