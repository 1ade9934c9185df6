"""The shepherd's side of isolating one run: its cgroup (limits, membership, OOM, kill) and its
runtime (the launch, the setup failure check, the cleanup).

What must outlive the shepherd goes into the run dir as isolation.json (the cgroup and the cleanup
commands), so the agent can still kill and remove everything of a run whose shepherd died.
"""
from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

from . import devcgroup, runtimes, spool
from .cgroups import RunCgroup
from .isolation import NodeIsolation
from ..protocol.runspec import RunSpec

log = logging.getLogger(__name__)

NODE = "node.json"  # the agent's NodeIsolation when it started the run
RECORD = "isolation.json"
CLEANUP_TIMEOUT = 30.0


class LaunchError(Exception):
    pass


def load_node(run_dir: Path) -> NodeIsolation:
    raw = spool.read_json(run_dir / NODE)
    if raw is None:  # a run dir made by an agent that predates runtimes: plain processes
        return NodeIsolation(node=os.uname().nodename)
    return NodeIsolation.from_wire(raw)


class Containment:
    def __init__(self, spec: RunSpec, run_dir: Path, node: NodeIsolation) -> None:
        self.spec, self.dir, self.node = spec, run_dir, node
        self.runtime = runtimes.get(node.runtime_for(spec))
        self.cgroup: RunCgroup | None = None
        self.ctx: runtimes.Context | None = None
        self.launch: runtimes.Launch | None = None
        self.oom_seen = False
        self.oom_event = False  # the cgroup's OOM eventfd fired (cgroup v1)
        self.recorded: dict | None = None  # what RECORD holds

    def setup(self, groups: list[int], env: dict[str, str], script: str, control: str) -> runtimes.Launch:
        """Make the cgroup (with the limits) and let the runtime build the launch."""
        spec, node = self.spec, self.node
        if node.cgroups is not None:
            self.cgroup = RunCgroup(node.cgroups, spool.run_dir_name(spec.job_id, spec.attempt))
            self.record()  # first: whatever happens next, the agent can find and remove it
            try:
                self.cgroup.create(spec.mem_mb, spec.cpus if node.limit_cpus else None, node.pids_limit or None)
            except OSError as exc:
                raise LaunchError(f"setting up the cgroup {self.cgroup.path} failed: {exc}") from None
        self.ctx = runtimes.Context(spec=spec, run_dir=self.dir, node=node, groups=groups, env=env,
                                    script=script, control=control,
                                    cgroup_path=self.cgroup.path if self.cgroup else None)
        try:
            self.launch = self.runtime.prepare(self.ctx)
        except runtimes.RuntimeRefused as exc:
            raise LaunchError(str(exc)) from None
        except OSError as exc:
            raise LaunchError(f"preparing the {self.runtime.name} runtime failed: {exc}") from None
        self.record()
        if self.cgroup is not None and self.launch.join_cgroup:  # runc, podman: their spec does it
            self.restrict_devices()
        log.info("job %s.%s: runtime %s, cgroup %s, limits mem=%s MiB cpus=%s pids=%s", spec.job_id,
                 spec.attempt, self.runtime.name, self.cgroup.path if self.cgroup else "none",
                 spec.mem_mb, spec.cpus if node.limit_cpus else None, node.pids_limit or None)
        return self.launch

    def restrict_devices(self) -> None:
        """Only the run's own GPUs' device nodes can be opened in its cgroup (ssh sessions adopted
        into it included), whatever CUDA_VISIBLE_DEVICES says."""
        deny = devcgroup.others(self.node.device_dir, self.spec.gpus)
        try:
            done = self.cgroup.restrict_devices(deny)
        except OSError as exc:
            raise LaunchError(f"refusing the other GPUs' device nodes to {self.cgroup.path} failed: {exc}") from None
        if deny and not done:
            log.warning("job %s: this node's cgroups cannot restrict devices: all %d other GPUs stay "
                        "visible", self.spec.job_id, len(deny))

    def record(self) -> None:
        rec = {"runtime": self.runtime.name, "cgroup": self.cgroup.record() if self.cgroup else None,
               "cleanup": self.launch.cleanup if self.launch else [],
               "signal_main": self.signal_main}
        if rec != self.recorded:  # a runtime without cleanup steps leaves the first record as it was
            spool.write_json_atomic(self.dir / RECORD, rec, durable=False)
            self.recorded = rec

    @property
    def signal_main(self) -> bool:
        """Whether the main process may get the job's signals (runtimes.Launch.signal_main)."""
        return self.launch is None or self.launch.signal_main

    def deliver(self, pgid: int, sig: int) -> None:
        deliver(pgid, sig, self.signal_main, self.cgroup, strays=self.runtime.name == "none")

    def warn(self, pgid: int, sig: int) -> None:
        """The --signal warning before the time limit, to whom Slurm's rule sends it (warn_to)."""
        to = self.spec.warn_to
        if to == "steps":
            deliver_to_steps(pgid, sig, self.cgroup)
        elif to == "batch" and self.spec.step_server:
            pass  # no batch shell here: this node runs the step server
        elif to == "batch" and self.signal_main:
            os.kill(pgid, sig)  # the batch shell alone, not its children
        else:  # every process; also B: where the shell is behind a runtime that cannot take signals
            self.deliver(pgid, sig)

    def procs_files(self) -> list[str]:
        if self.cgroup is None or self.launch is None or not self.launch.join_cgroup:
            return []
        return self.cgroup.procs_files()

    def after_fork(self) -> None:
        for fd in self.launch.keep_fds if self.launch else ():
            os.close(fd)  # the child has them; the runtime writes, we read the file later

    # -- while the job runs --

    def alive(self) -> bool:
        return bool(self.cgroup and self.cgroup.members())

    def members(self) -> list[int]:
        """The run's processes in its cgroup (a container's too); none without a cgroup."""
        return self.cgroup.members() if self.cgroup else []

    def oom(self) -> bool:
        """True once the kernel killed a process of the run for memory (checked each wakeup)."""
        if not self.oom_seen and self.cgroup is not None and (self.oom_event or self.cgroup.oom_kills() > 0):
            self.oom_seen = True
            log.warning("job %s.%s: OOM kill in its cgroup (limit %s MiB)", self.spec.job_id,
                        self.spec.attempt, self.spec.mem_mb)
        return self.oom_seen

    def oom_notifier(self) -> int | None:
        """An fd that becomes readable when the run's cgroup runs out of memory (cgroup v1)."""
        return self.cgroup.oom_notifier() if self.cgroup is not None else None

    def oom_notified(self, fd: int) -> None:
        """The notifier's event: oom() says so from now on, if the run's own limit was reached."""
        try:
            os.read(fd, 8)
        except BlockingIOError:
            return
        if self.cgroup is not None and self.cgroup.limit_reached():
            self.oom_event = True

    def oom_message(self) -> str:
        if self.spec.mem_mb is not None:
            return f"job exceeded its memory limit of {self.spec.mem_mb} MiB"
        return "the kernel's OOM killer killed a process of the job (the node ran out of memory)"

    def kill(self) -> None:
        if self.cgroup is not None:
            self.cgroup.kill()

    # -- at the end --

    def decode(self, wait_status: int) -> tuple[int | None, int | None]:
        """(exit_code, signal) of the job: a runtime's exit 128+N means the job died of signal N."""
        if os.WIFSIGNALED(wait_status):
            return None, os.WTERMSIG(wait_status)
        code = os.waitstatus_to_exitcode(wait_status)
        if self.launch is not None and self.launch.signal_exit_codes and 128 < code < 128 + signal.NSIG:
            return None, code - 128
        return code, None

    def setup_failure(self, wait_status: int | None) -> str | None:
        if self.launch is None or self.ctx is None:
            return None
        return self.runtime.after_exit(self.ctx, self.launch, wait_status)

    def usage(self) -> tuple[float | None, int | None]:
        """(CPU seconds, peak memory bytes) the run's cgroup was charged; read before teardown."""
        return self.cgroup.usage() if self.cgroup is not None else (None, None)

    def teardown(self) -> None:
        """The runtime's cleanup (runc delete), then the cgroup; the job's processes are gone."""
        _teardown(self.cgroup, self.launch.cleanup if self.launch else [])


def deliver(pgid: int, sig: int, signal_main: bool, cgroup: RunCgroup | None, strays: bool = False) -> None:
    """Send a signal to the job's process group (pgid = its main process), sparing the main
    process itself if its runtime cannot take it. With `strays` (plain processes: in a container
    the runtime passes signals on, and its own processes in the cgroup must not get them), a
    process that left the group (a launcher's `setsid` helper) but stays in the job's cgroup gets
    it too. Raises ProcessLookupError if nobody got it."""
    if signal_main or sig == signal.SIGKILL:
        got = False
        try:
            os.killpg(pgid, sig)
            got = True
        except ProcessLookupError:
            pass
        if (_signal_strays(pgid, sig, cgroup) if strays else 0) == 0 and not got:
            raise ProcessLookupError(pgid)
        return
    frozen = cgroup is not None and cgroup.freeze(True)  # nothing forks between listing and kill
    try:
        targets = [p for p in spool.group_members(pgid) if p != pgid]
        for p in targets:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
    finally:
        if frozen:
            cgroup.freeze(False)
    if not targets:
        raise ProcessLookupError(pgid)


def _signal_strays(pgid: int, sig: int, cgroup: RunCgroup | None) -> int:
    """Signal the members of the job's cgroup outside its process group (the group had it from
    killpg: none gets it twice); how many got it."""
    sent = 0
    for p in cgroup.members() if cgroup is not None else ():
        try:
            if os.getpgid(p) != pgid:
                os.kill(p, sig)
                sent += 1
        except ProcessLookupError:
            pass
    return sent


STEP_MARK = b"SLURM_STEP_ID="  # in every step task's environment (core.steps), not the batch shell's


def deliver_to_steps(pgid: int, sig: int, cgroup: RunCgroup | None) -> int:
    """Send a signal to the job steps' tasks alone (Slurm's --signal without B:): the job's
    processes whose environment, as they were started, names a step. srun, the step server and
    the batch shell are spared. How many got it."""
    frozen = cgroup is not None and cgroup.freeze(True)
    sent = 0
    try:
        for p in sorted(_members(pgid, cgroup)):
            try:
                with open(f"/proc/{p}/environ", "rb") as f:
                    env = f.read(1 << 20)
            except OSError:
                continue
            if env.startswith(STEP_MARK) or b"\0" + STEP_MARK in env:
                try:
                    os.kill(p, sig)
                    sent += 1
                except ProcessLookupError:
                    pass
    finally:
        if frozen:
            cgroup.freeze(False)
    return sent


def members_recorded(run_dir: Path, pgid: int) -> set[int]:
    """The run's live processes, from what the shepherd recorded: its process group and cgroup
    (a container's processes may have left the group)."""
    rec = _read_record(run_dir)
    return _members(pgid, RunCgroup.from_record(rec["cgroup"]) if rec.get("cgroup") else None)


def _members(pgid: int, cgroup: RunCgroup | None) -> set[int]:
    return set(spool.group_members(pgid)) | set(cgroup.members() if cgroup else ())


def deliver_recorded(run_dir: Path, pgid: int, sig: int) -> None:
    """deliver() for the agent (signal_run), from what the shepherd recorded."""
    rec = _read_record(run_dir)
    cg = RunCgroup.from_record(rec["cgroup"]) if rec.get("cgroup") else None
    deliver(pgid, sig, rec.get("signal_main", True), cg, strays=rec.get("runtime") == "none")


def _read_record(run_dir: Path) -> dict:
    try:
        rec = spool.read_json(run_dir / RECORD)
    except ValueError:
        rec = None
    return rec if isinstance(rec, dict) else {}


def teardown_recorded(run_dir: Path) -> None:
    """Kill and remove what isolation.json names. Also used by the agent for a run whose shepherd
    died; every step is idempotent."""
    rec = _read_record(run_dir)
    _teardown(RunCgroup.from_record(rec["cgroup"]) if rec.get("cgroup") else None, rec.get("cleanup") or [])


def _teardown(cg: RunCgroup | None, cleanup: list[list[str]]) -> None:
    import subprocess  # only containers have cleanup commands: keep the shepherd's start lean
    if cg is not None:
        cg.kill()
    for argv in cleanup:
        try:
            proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  timeout=CLEANUP_TIMEOUT)
            if proc.returncode != 0:
                log.warning("%s exited %d: %s", " ".join(argv), proc.returncode, proc.stderr.strip())
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.warning("%s failed: %s", " ".join(argv), exc)
    if cg is not None:
        cg.remove()
