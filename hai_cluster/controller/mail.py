"""--mail-type/--mail-user: the controller runs a mail program, as slurmctld runs MailProg:
`PROG -s SUBJECT RECIPIENT` with Slurm's subject (`Slurm Job_id=12 Name=train Ended, Run time
00:05:00, COMPLETED, ExitCode 0`), an empty body and Slurm's SLURM_JOB_* variables, as the
controller's user, with a time limit. Mails wait in a bounded queue and at most a few programs
run at once: a burst of job ends never holds the controller, and a hung mail program costs
MAIL_TIMEOUT at most."""
from __future__ import annotations

import asyncio
import logging
import os
import stat

from ..core.states import JobState
from ..core.timefmt import slurm_duration as duration
from ..store.records import JobRecord

log = logging.getLogger(__name__)

MAIL_TIMEOUT = 30.0  # seconds a mail program may take (Slurm's MAIL_PROG_TIMEOUT is 120)
MAIL_QUEUE = 1000  # mails waiting; more are dropped, with a warning
MAIL_AT_ONCE = 4
# Slurm's words for each notice, and the end states that make an end a failure (JOB_FAILED and after)
WORDS = {"BEGIN": "Began", "END": "Ended", "FAIL": "Failed", "REQUEUE": "Requeued",
         "TIME_LIMIT_50": "Reached 50% of time limit", "TIME_LIMIT_80": "Reached 80% of time limit",
         "TIME_LIMIT_90": "Reached 90% of time limit", "TIME_LIMIT": "Reached time limit",
         "IDLE": "GPUs idle, to be reclaimed"}  # IDLE: ours (Slurm has no idle reclamation)
# --mail-type=TIME_LIMIT*: the share of the run's limit at which each is mailed (not part of ALL, as Slurm's)
LIMIT_MARKS = {"TIME_LIMIT_50": 0.5, "TIME_LIMIT_80": 0.8, "TIME_LIMIT_90": 0.9, "TIME_LIMIT": 1.0}
ALL = ("BEGIN", "END", "FAIL", "REQUEUE", "IDLE")
FAILED = {JobState.FAILED.value, JobState.TIMEOUT.value, JobState.NODE_FAIL.value, JobState.OUT_OF_MEMORY.value}


def subject(job: JobRecord, kind: str, state: str | None = None, exit_code: int | None = None,
            start: float | None = None, end: float | None = None) -> str:
    """The mail's subject line, as slurmctld's mail_job_info writes it."""
    if job.array_job_id is not None:
        head = f"Slurm Array Task Job_id={job.array_job_id}_{job.array_task_id} ({job.id}) Name={job.name}"
    else:
        head = f"Slurm Job_id={job.id} Name={job.name}"
    text = f"{head} {WORDS[kind]}"
    if kind == "BEGIN" and start is not None:
        text += f", Queued time {duration(start - job.submit_time)}"
    elif start is not None and end is not None:
        text += f", Run time {duration(end - start)}"
    if kind in ("END", "FAIL") and state is not None:
        text += f", {state}" + (f", ExitCode {exit_code}" if exit_code is not None else "")
    return text


# What mail programs run to queue a mail on Debian: mail(1) runs sendmail; exim4's sendmail is
# setuid root, postfix's runs the setgid postdrop.
MTA_HELPERS = ("/usr/sbin/sendmail", "/usr/sbin/postdrop")


def no_new_privs(status: str = "/proc/self/status") -> bool:
    try:
        with open(status) as f:
            return any(line.split() == ["NoNewPrivs:", "1"] for line in f)
    except OSError:
        return False


def setid_problem(program: str, helpers: tuple[str, ...] = MTA_HELPERS, nnp: bool | None = None) -> str | None:
    """Why mail will not go out, said once at start: under hai-controller.service (NoNewPrivileges,
    the controller as user hai) a setuid or setgid program runs without those privileges, so a
    local MTA that needs them to queue (exim4, postfix) fails at every mail."""
    if not (no_new_privs() if nnp is None else nnp):
        return None
    for path in (program, *helpers):
        real = os.path.realpath(path)
        try:
            mode = os.stat(real).st_mode
        except OSError:
            continue
        if mode & (stat.S_ISUID | stat.S_ISGID):
            what = real if real == path else f"{real} (what {path} runs)"
            return (f"mail_program {program}: {what} is set{'uid' if mode & stat.S_ISUID else 'gid'}, and this "
                    f"controller runs with no_new_privs (NoNewPrivileges in hai-controller.service), so it gets "
                    f"no privileges and cannot queue mail: --mail-type mails will fail. Use a sendmail that "
                    f"hands mail to an SMTP relay (Debian's msmtp-mta; docs/OPERATIONS.md, Mail)")
    return None


class Mailer:
    def __init__(self, program: str, cluster: str) -> None:
        self.program, self.cluster = program, cluster
        self.queue: asyncio.Queue | None = None
        self.workers: list[asyncio.Task] = []
        self._warned = False

    def start(self) -> None:
        problem = setid_problem(self.program)
        if problem:
            log.warning("%s", problem)
        self.queue = asyncio.Queue(MAIL_QUEUE)
        self.workers = [asyncio.ensure_future(self._work()) for _ in range(MAIL_AT_ONCE)]

    async def stop(self) -> None:
        for w in self.workers:
            w.cancel()
        await asyncio.gather(*self.workers, return_exceptions=True)

    def notice(self, job: JobRecord, kind: str, *, state: str | None = None, exit_code: int | None = None,
               start: float | None = None, end: float | None = None) -> None:
        """Mail the job's user about this, if the job asked for it (--mail-type)."""
        wanted = set(job.spec.mail_type)
        if "ALL" in wanted:
            wanted |= set(ALL)
        if kind == "END" and state in FAILED and "FAIL" in wanted:
            kind = "FAIL"  # one mail for a failed end, with Slurm's "Failed"
        elif kind == "END" and "END" not in wanted:
            return
        if kind not in wanted or self.queue is None:
            return
        if job.array_job_id is not None and "ARRAY_TASKS" not in wanted and kind in ("BEGIN", "REQUEUE"):
            return  # an array's tasks say it only with ARRAY_TASKS (their ends still do)
        mail = ([self.program, "-s", subject(job, kind, state, exit_code, start, end),
                 job.spec.mail_user or job.user], self._env(job, kind, state))
        try:
            self.queue.put_nowait(mail)
        except asyncio.QueueFull:
            log.warning("job %d: %s mail dropped: %d mails are waiting", job.id, kind, MAIL_QUEUE)

    def _env(self, job: JobRecord, kind: str, state: str | None) -> dict[str, str]:
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "SLURM_JOB_ID": str(job.id), "SLURM_JOBID": str(job.id),
               "SLURM_JOB_NAME": job.name, "SLURM_JOB_USER": job.user, "SLURM_JOB_UID": str(job.uid),
               "SLURM_JOB_PARTITION": job.partition, "SLURM_JOB_STATE": state or job.state,
               "SLURM_JOB_MAIL_TYPE": WORDS[kind], "SLURM_CLUSTER_NAME": self.cluster}
        if job.array_job_id is not None:
            env["SLURM_ARRAY_JOB_ID"], env["SLURM_ARRAY_TASK_ID"] = str(job.array_job_id), str(job.array_task_id)
        return env

    async def _work(self) -> None:
        assert self.queue is not None
        while True:
            argv, env = await self.queue.get()
            await self._send(argv, env)

    async def _send(self, argv: list[str], env: dict[str, str]) -> None:
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT, cwd="/", start_new_session=True)
        except OSError as exc:
            if not self._warned:  # once: a cluster without a mail program says so, not at every job
                log.warning("mail_program %s cannot run (%s): --mail-type mails are not sent", argv[0],
                            exc.strerror or exc)
                self._warned = True
            return
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), MAIL_TIMEOUT)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
            log.warning("mail_program %s took more than %g s; killed (%s)", argv[0], MAIL_TIMEOUT, argv[2])
            return
        if proc.returncode:
            log.warning("mail_program %s exited %d: %s", argv[0], proc.returncode,
                        out[:200].decode("utf-8", "replace").strip())


class LimitWatch:
    """The TIME_LIMIT* mails still to send for running jobs, each once per job as slurmctld sends
    them (it clears the mail bit): registered at a run's start, taken when due, dropped when the
    run ends. In memory: a restarted controller registers its running jobs again, skipping the
    marks already passed (they were sent before)."""

    def __init__(self) -> None:
        self._due: dict[int, tuple[JobRecord, float, list[tuple[float, str]]]] = {}
        self._sent: dict[int, set[str]] = {}

    def watch(self, job: JobRecord, start: float | None, now: float, *, skip_passed: bool = False) -> None:
        kinds = [k for k in LIMIT_MARKS if k in job.spec.mail_type and k not in self._sent.get(job.id, ())]
        if not kinds or not job.time_limit or start is None:
            return
        marks = sorted((start + LIMIT_MARKS[k] * job.time_limit, k) for k in kinds)
        if skip_passed:
            marks = [(at, k) for at, k in marks if at > now]
        if marks:
            self._due[job.id] = (job, start, marks)

    def due(self, now: float) -> list[tuple[JobRecord, str, float]]:
        """(job, kind, run start) of each mail due by `now`, in time order per job."""
        out = []
        for job_id in [j for j, (_, _, marks) in self._due.items() if marks[0][0] <= now]:
            job, start, marks = self._due[job_id]
            while marks and marks[0][0] <= now:
                kind = marks.pop(0)[1]
                self._sent.setdefault(job_id, set()).add(kind)
                out.append((job, kind, start))
            if not marks:
                del self._due[job_id]
        return out

    def run_ended(self, job_id: int, final: bool, now: float) -> list[tuple[JobRecord, str, float]]:
        """The run ended: its marks due by now (a run killed at its limit may end before the pass
        that would mail TIME_LIMIT) are returned to send; the rest dropped."""
        entry = self._due.pop(job_id, None)
        out = []
        if entry is not None:
            job, start, marks = entry
            out = [(job, kind, start) for at, kind in marks if at <= now]
            self._sent.setdefault(job_id, set()).update(kind for _, kind, _ in out)
        if final:
            self._sent.pop(job_id, None)
        return out
