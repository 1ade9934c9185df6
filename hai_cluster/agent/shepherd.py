"""One shepherd per job run (like slurmstepd): `python -m hai_cluster.agent.shepherd RUN_DIR`.

The agent starts it (starter.py): forked by the shepherd zygote (zygote.py), which has imported
this module already and names its child as above, or by exec. It calls setsid (and when exec'd,
forks around it) so that it is not the agent's child and outlives the agent (SIGKILL, restart,
systemd with KillMode=process). It starts the job (jobproc.start_job), tells the agent over the
pipe named by $HAI_REPORT_FD (or handed over by the zygote) whether the job started, then
supervises it alone: time limit, terminate requests, cleanup of the process group, and the final
status.json.

Terminate requests: the agent writes terminate.json and sends SIGUSR1. The signal only wakes us;
the file is the request, and it is re-read every CONTROL_RECHECK seconds, so a signal lost in an
agent crash between the write and the kill costs at most that delay.

The checkpoint protocol (DESIGN.md, "Preemption and checkpoints"): on a terminate we FIRST leave a
notice in the run's control dir ($HAI_CONTROL_DIR in the job; `control/preempt` for preempt and
requeue, "checkpoint and leave, you will be resumed"; `control/terminate` for cancel, timeout and
node_fail), THEN send SIGCONT and the signal to the job's process group, so a job that handles the
signal always finds the notice (hai_cluster.job reads it). After the grace period, SIGKILL; the
final status says whether that was needed (`killed`).

Isolation (contain.py): before the fork, the run gets its cgroup (limits from the spec) and its
runtime builds the launch (runtimes/); the child joins the cgroup before exec, so the cgroup holds
everything the job ever starts. The "job" below is the runtime's process (bwrap, runc) for a
container: still our child, in its own session. An OOM kill in the cgroup ends the run as "oom";
the cleanup kills the whole cgroup, then the runtime's leftovers and the cgroup are removed.

While a terminate is in progress, the end of the main process does not end the job at once: the
rest of its process group (and of its cgroup) gets the rest of the grace period to finish its
checkpoint. A job script that runs `python train.py` (no exec) is the usual shape, and its shell
dies of the SIGTERM at once while Python is still saving.
"""
from __future__ import annotations

import ctypes
import json
import logging
import os
import selectors
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from . import spool
from .jobproc import start_job
from .outputs import output_problem
from .. import logsetup
from ..protocol.runspec import TERMINATE_REASONS, RunSpec, RunStatus

if TYPE_CHECKING:
    from .contain import Containment

log = logging.getLogger("hai.shepherd")

CONTROL_RECHECK = 1.0
# How often the output files' file system is looked at while the job runs (one statvfs each), and
# how many looks in a row must find it full before the job is failed: a moment of full disk that
# someone else frees at once is not worth a training run.
OUTPUT_CHECK = 5.0
OUTPUT_FULL_LOOKS = 2
CLEANUP_TIMEOUT = 10.0
LINGER_POLL = 0.1  # how often the process group is checked once the main process ended in a grace
PR_SET_CHILD_SUBREAPER = 36
try:  # looked up once: in the zygote, before it forks the shepherds (~0.1 ms each otherwise)
    _PRCTL = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):
    _PRCTL = None


def daemonize(fork_first: bool = True) -> None:
    """An exec'd shepherd (fork_first) forks twice, around setsid: the agent reaps the first
    child at once, and the session leader goes, so the shepherd is nobody's child and never gets
    a terminal. The zygote's child (not fork_first) only calls setsid: it is not the agent's
    child, its zygote ignores SIGCHLD (the kernel reaps it when it ends), and it opens no
    terminal. A fork of a Python process costs ~1.5 ms of CPU (page tables, copy-on-write)."""
    if fork_first and os.fork() > 0:
        os._exit(0)  # the agent reaps this one at once
    os.setsid()
    if fork_first and os.fork() > 0:
        os._exit(0)
    os.chdir("/")
    os.umask(0o022)


def become_subreaper() -> None:
    # Orphans of the job re-parent to us, not to PID 1: we reap them (no zombies where PID 1 does
    # not) and can kill those that left the job's process group.
    if _PRCTL is None or _PRCTL(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        log.warning("could not become a child subreaper; orphans of the job go to PID 1")


class Shepherd:
    def __init__(self, run_dir: Path, report_fd: int | None) -> None:
        self.dir = run_dir
        self.report_fd = report_fd
        self.spec = RunSpec.from_wire(spool.read_json(run_dir / spool.SPEC))
        self.box: Containment | None = None  # cgroup and runtime: only for a run that starts
        self.pid: int | None = None  # the job's main process, also its pgid
        self.start_time = time.time()
        self.start_mono = time.monotonic()
        self.wait_status: int | None = None
        self.launch_error: str | None = None
        self.reason: str | None = None
        self.kill_at: float | None = None
        self.killed = False
        self.warn_at: float | None = None
        self.limit_at: float | None = None
        self.next_control_check = 0.0
        self.next_output_check = 0.0
        self.output_full_looks = 0
        self.output_message: str | None = None
        self.control: Path | None = None  # the control dir, made before the job starts
        self.sel = selectors.DefaultSelector()

    # -- reporting to the agent --

    def report(self, event: dict) -> None:
        if self.report_fd is None:
            return
        try:
            os.write(self.report_fd, (json.dumps(event) + "\n").encode())
        except OSError:  # the agent died meanwhile: it reads the spool when it comes back
            pass
        os.close(self.report_fd)
        self.report_fd = None

    def finish(self, status: RunStatus) -> None:
        spool.write_json_atomic(self.dir / spool.STATUS, status.to_wire())
        log.info("job %s.%s ended: exit_code=%s signal=%s reason=%s killed=%s", self.spec.job_id,
                 self.spec.attempt, status.exit_code, status.signal, status.reason, status.killed)
        self.report({"event": "ended"})

    # -- signals --

    def install_signals(self) -> None:
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)  # C handler writes the signal number: select() wakes up
        for sig in (signal.SIGCHLD, signal.SIGUSR1, signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: None)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        self.sel.register(wake_r, selectors.EVENT_READ, "wake")

    def drain_wakeups(self, fd: int) -> set[int]:
        got: set[int] = set()
        try:
            while data := os.read(fd, 512):
                got.update(data)
        except BlockingIOError:
            pass
        return got

    # -- the job --

    def signal_job(self, sig: int) -> None:
        try:
            self.box.deliver(self.pid, sig)
        except ProcessLookupError:  # the child has not called setsid yet: only it exists
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def begin_terminate(self, reason: str) -> None:
        if self.reason is not None:
            return  # the first terminate (or the time limit) wins; its grace is not restarted
        self.reason = reason
        sig = signal.SIGTERM
        if reason in spool.RESUMING_REASONS and self.spec.signal is not None:
            sig = self.spec.signal
        log.info("terminating job %s.%s (%s): signal %d, grace %d s", self.spec.job_id,
                 self.spec.attempt, reason, sig, self.spec.grace)
        now, self.kill_at = time.time(), time.monotonic() + self.spec.grace
        self.leave_notice(reason, sig, now)  # before the signal: whoever handles it finds the notice
        # A stopped job must run to handle the signal. Only then: podman proxies each signal by
        # starting `runc kill` in the job's process group, where the next signal killed the
        # SIGCONT's proxy and podman lost the SIGTERM behind it (the job ran out its grace).
        if spool.any_stopped(spool.group_members(self.pid) + self.box.members()):
            self.signal_job(signal.SIGCONT)
        self.signal_job(sig)

    def leave_notice(self, reason: str, sig: int, now: float) -> None:
        if self.control is None:
            return
        try:
            path = spool.write_notice(self.control, reason, int(sig), self.spec.grace, now)
        except OSError as exc:  # the signal must still go out: the job may handle it alone
            log.error("could not write the %s notice: %s", spool.notice_name(reason), exc)
            return
        log.info("notice %s written", path)

    def lingering(self) -> bool:
        """The main process ended during a terminate and its process group is still alive (say
        Python saving its checkpoint after its shell died of the signal): wait, until the grace
        period is over."""
        return self.reason is not None and self.kill_at is not None and self.job_alive()

    def job_alive(self) -> bool:
        """Any process of the job left: in its process group, or anywhere in its cgroup."""
        return bool(spool.group_members(self.pid)) or self.box.alive()

    def check_oom(self) -> None:
        """An OOM kill ends the run (v2 kills the whole cgroup itself with memory.oom.group; v1
        cannot): whatever is left would only run on without its memory."""
        if self.box.oom_seen or not self.box.oom():
            return
        if self.reason is None:
            log.info("job %s.%s ran out of memory: killing the rest of it", self.spec.job_id, self.spec.attempt)
            self.kill_all()

    def kill_all(self) -> None:
        self.signal_job(signal.SIGKILL)
        self.box.kill()

    def read_terminate(self) -> str | None:
        try:
            req = spool.read_json(self.dir / spool.TERMINATE)
        except ValueError:
            log.error("unreadable terminate request; treating it as cancel")
            return "cancel"
        if req is None:
            return None
        reason = req.get("reason") if isinstance(req, dict) else None
        return reason if reason in TERMINATE_REASONS else "cancel"

    def reap(self) -> None:
        """Reap every child but the job's main process, whose exit is only looked at (WNOWAIT):
        it stays a zombie until cleanup is over (release_main). A zombie holds its pid, which is
        also the job's process group id, so until then no other process can be given that
        number: every signal to self.pid or its group reaches the job or nobody. Once reaped, a
        job's child cycling fork/exit could hand the number to another user's process, which
        the grace period's SIGKILL then killed (the second audit of issue 18, H1)."""
        if self.pid is not None and self.wait_status is None:
            try:
                info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                info = None
            if info is not None:
                self.wait_status = wait_status_of(info)
        for child in self.other_children():  # orphans the subreaper adopted, and runtime helpers
            try:
                os.waitpid(child, os.WNOHANG)
            except ChildProcessError:
                pass

    def other_children(self) -> list[int]:
        """Our children but the job's main process (kept a zombie until release_main)."""
        return [c for c in spool.children_of(os.getpid()) if c != self.pid]

    def release_main(self) -> None:
        """Reap the job's main process at last: nothing signals its pid or group after this."""
        if self.pid is not None:
            try:
                os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                pass

    def on_exec_pipe(self, fd: int, buf: bytearray) -> None:
        data = os.read(fd, 4096)
        if data:
            buf += data
            return
        self.sel.unregister(fd)
        os.close(fd)
        if buf:
            self.launch_error = buf.decode(errors="replace")
            log.error("launch failed: %s", self.launch_error)
        else:
            log.info("job %s.%s started: pid %d", self.spec.job_id, self.spec.attempt, self.pid)
            self.report({"event": "started", "pid": self.pid, "start_time": self.start_time,
                         "shepherd_pid": os.getpid()})

    def timers(self, now: float) -> None:
        if self.warn_at is not None and now >= self.warn_at:
            self.warn_at = None
            if self.reason is None:  # already being terminated: the warning would only confuse it
                log.info("sending signal %d before the time limit to the %s", self.spec.signal, self.spec.warn_to)
                try:
                    self.box.warn(self.pid, self.spec.signal)
                except ProcessLookupError:
                    pass
        if self.limit_at is not None and now >= self.limit_at:
            self.limit_at = None
            self.begin_terminate("timeout")
        if self.kill_at is not None and now >= self.kill_at:
            self.kill_at = None
            if self.wait_status is None or self.job_alive():
                log.info("grace period over: SIGKILL to the job's process group and cgroup")
                self.killed = True
                self.kill_all()

    def supervise(self, exec_r: int) -> None:
        buf = bytearray()
        self.sel.register(exec_r, selectors.EVENT_READ, "exec")
        while self.wait_status is None or self.lingering():
            now = time.monotonic()
            deadlines = [d for d in (self.warn_at, self.limit_at, self.kill_at) if d is not None]
            if self.wait_status is not None:  # lingering: the group's end wakes nobody, poll it
                deadlines.append(now + LINGER_POLL)
            timeout = min([CONTROL_RECHECK, *(d - now for d in deadlines)])
            woke: set[int] = set()
            for key, _ in self.sel.select(max(timeout, 0)):
                if key.data == "wake":
                    woke |= self.drain_wakeups(key.fd)
                elif key.data == "oom":
                    self.box.oom_notified(key.fd)
                else:
                    self.on_exec_pipe(key.fd, buf)
            self.reap()
            now = time.monotonic()
            if woke & {signal.SIGTERM, signal.SIGINT}:
                self.begin_terminate("node_fail")  # the node is going down around us
            if signal.SIGUSR1 in woke or now >= self.next_control_check:
                self.next_control_check = now + CONTROL_RECHECK
                reason = self.read_terminate()
                if reason is not None:
                    self.begin_terminate(reason)
            self.check_oom()
            self.check_output(now)
            self.timers(now)
        # the main process is gone; the exec pipe is at EOF or holds the launch error
        while exec_r in self.sel.get_map():
            self.on_exec_pipe(exec_r, buf)

    def check_output(self, now: float) -> None:
        """A full output file system fails the job while it runs (output_error), through the usual
        terminate (signal, grace, kill), instead of letting it train on without its log."""
        if now < self.next_output_check or self.reason is not None or self.wait_status is not None:
            return
        self.next_output_check = now + OUTPUT_CHECK
        problem = output_problem((self.spec.stdout, self.spec.stderr))
        self.output_full_looks = self.output_full_looks + 1 if problem else 0
        if self.output_full_looks >= OUTPUT_FULL_LOOKS:
            log.error("%s", problem)
            self.output_message = problem
            self.begin_terminate("output_error")

    def cleanup(self) -> None:
        """Kill what is left of the job: its process group, its cgroup, and orphans that left the
        group (without cgroups, the only trace of a double-forked process is that it is ours)."""
        deadline = time.monotonic() + CLEANUP_TIMEOUT
        while True:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except OSError:
                pass
            self.box.kill()
            for child in self.other_children():  # ours and unreaped: no pid here can be reused
                try:
                    os.kill(child, signal.SIGKILL)
                except OSError:
                    pass
            self.reap()
            if not self.job_alive() and not self.other_children():
                return
            if time.monotonic() > deadline:
                log.warning("processes of the job survive SIGKILL (uninterruptible sleep?)")
                return
            time.sleep(0.05)

    def status(self) -> RunStatus:
        st = RunStatus.for_spec(self.spec, state="ended", pid=self.pid, start_time=self.start_time,
                                end_time=time.time(), reason=self.reason, killed=self.killed)
        if self.launch_error is not None:
            st.pid, st.reason, st.message = None, "launch_failed", self.launch_error
        elif self.wait_status is not None:
            st.exit_code, st.signal = self.box.decode(self.wait_status)
            if self.box.oom_seen and st.reason is None:  # a terminate already under way wins
                st.reason, st.message = "oom", self.box.oom_message()
            if st.reason == "output_error":  # failed by check_output while it ran
                st.message = self.output_message
            if st.reason is None:
                lost_output = output_problem((self.spec.stdout, self.spec.stderr))
                if lost_output is not None:
                    st.reason, st.message = "output_error", lost_output
        return st

    def run(self) -> int:
        spec = self.spec
        me = os.getpid()
        become_subreaper()
        self.install_signals()
        # only now: the agent signals the recorded pid, and SIGUSR1 would kill us before this
        spool.write_json_atomic(self.dir / spool.SHEPHERD, {"pid": me, "starttime": spool.proc_starttime(me)},
                                durable=False)
        reason = self.read_terminate()
        if reason is not None:  # terminated while we were starting: do not start the job at all
            self.finish(RunStatus.for_spec(spec, state="ended", start_time=self.start_time,
                                           end_time=time.time(), reason=reason,
                                           message="terminated before the job started"))
            return 0
        # imported only now: a run terminated while starting must reach that check fast
        from .contain import Containment, LaunchError, load_node
        self.box = Containment(spec, self.dir, load_node(self.dir))
        try:
            groups = os.getgrouplist(spec.user, spec.gid)
        except (KeyError, OSError) as exc:
            self.launch_error = f"looking up the groups of user {spec.user} failed: {exc}"
            self.finish(self.status())
            return 0
        try:
            self.control = spool.make_control_dir(self.dir)
        except OSError as exc:
            self.launch_error = f"creating the control dir failed: {exc}"
            self.finish(self.status())
            return 0
        # HAI_CONTROL_DIR and HAI_STEP_SOCKET (for srun) are what the agent adds: the controller
        # builds the rest of the environment (core/jobenv.py) but cannot know this spool. (Container
        # runtimes add NVIDIA_VISIBLE_DEVICES: runtimes/common.py.)
        env = {**spec.environment, "HAI_CONTROL_DIR": str(self.control),
               "HAI_STEP_SOCKET": str(spool.step_socket(self.dir.parent.parent))}
        script = str(self.dir / spool.SCRIPT)
        try:
            launch = self.box.setup(groups, env, script, str(self.control))
        except LaunchError as exc:
            self.launch_error = str(exc)
            self.box.teardown()
            self.finish(self.status())
            return 0
        oom_fd = self.box.oom_notifier()
        if oom_fd is not None:
            self.sel.register(oom_fd, selectors.EVENT_READ, "oom")
        exec_r, exec_w = os.pipe()  # both CLOEXEC: exec success closes exec_w in the child
        pid = start_job(spec, launch, groups, exec_w, self.box.procs_files(), self.box.node.rlimits)
        os.close(exec_w)
        self.box.after_fork()
        self.pid = pid
        self.start_time, self.start_mono = time.time(), time.monotonic()
        spool.write_json_atomic(self.dir / spool.JOB, {"pid": pid, "starttime": spool.proc_starttime(pid),
                                                       "start_time": self.start_time}, durable=False)
        if spec.time_limit is not None:
            self.limit_at = self.start_mono + spec.time_limit
            if spec.signal is not None and spec.signal_time > 0:
                self.warn_at = self.start_mono + max(0, spec.time_limit - spec.signal_time)
        self.next_control_check = time.monotonic() + CONTROL_RECHECK
        self.supervise(exec_r)
        self.cleanup()
        self.release_main()
        if oom_fd is not None:  # an OOM the loop had no turn to read
            self.box.oom_notified(oom_fd)
        self.box.oom()  # an OOM kill of the main process may have been what ended it
        status = self.status()
        failure = self.box.setup_failure(self.wait_status) if self.launch_error is None else None
        if failure is not None:  # the runtime exited before the job ever ran
            log.error("launch failed: %s", failure)
            status.reason, status.message = "launch_failed", failure
            status.pid = status.exit_code = status.signal = None
        cpu, peak = self.box.usage()  # every process is gone: the cgroup's totals are final
        status.cpu_seconds = None if cpu is None else round(cpu, 3)
        status.mem_peak_kb = None if peak is None else -(-peak // 1024)
        self.box.teardown()
        self.finish(status)
        return 0


def wait_status_of(info: os.waitid_result) -> int:
    """waitid's siginfo as the status waitpid would have returned (os.WIFEXITED and friends)."""
    if info.si_code == os.CLD_EXITED:
        return (info.si_status & 0xff) << 8
    if info.si_code == os.CLD_DUMPED:
        return info.si_status | 0x80
    return info.si_status  # CLD_KILLED


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not os.path.isabs(args[0]):
        print("usage: python -m hai_cluster.agent.shepherd /ABSOLUTE/RUN_DIR", file=sys.stderr)
        return 2
    fd = os.environ.pop("HAI_REPORT_FD", None)
    report_fd = int(fd) if fd and fd.isdigit() else None
    return detach_and_run(Path(args[0]), report_fd)


def configure_logging() -> None:
    """The shepherd's log lines, to its stderr (shepherd.log). A no-op where it was done already:
    the zygote does it once, before it forks (zygote.warm)."""
    logsetup.configure(logging.INFO, "%(asctime)s shepherd[%(process)d] %(levelname)s %(message)s")


def detach_and_run(run_dir: Path, report_fd: int | None, fork_first: bool = True) -> int:
    """Daemonize, then supervise the run: for main(), and in a child of the zygote (zygote.py)."""
    daemonize(fork_first)
    configure_logging()
    try:
        shepherd = Shepherd(run_dir, report_fd)
    except Exception as exc:  # no usable spec: leave a status so the run is not a mystery
        log.exception("cannot read the run's spec")
        _fallback_status(run_dir, f"shepherd cannot read the spec: {exc}")
        return 1
    try:
        return shepherd.run()
    except Exception as exc:
        log.exception("shepherd failed")
        if shepherd.pid is not None:
            shepherd.kill_all()
        if shepherd.box is not None:
            shepherd.box.teardown()
        st = shepherd.status()
        st.reason, st.message = "lost", f"shepherd failed: {exc}"
        shepherd.finish(st)
        return 1


def _fallback_status(run_dir: Path, message: str) -> None:
    key = spool.parse_run_dir_name(run_dir.name) or (0, 0)
    st = RunStatus(job_id=key[0], attempt=key[1], rank=0, state="ended", start_time=time.time(),
                   end_time=time.time(), reason="launch_failed", message=message)
    spool.write_json_atomic(run_dir / spool.STATUS, st.to_wire())


if __name__ == "__main__":
    sys.exit(main())
