"""--mail-type: Slurm's subjects (src/slurmctld/agent.c, mail_job_info) and which notices go out."""
import asyncio
from dataclasses import fields

from hai_cluster.controller.mail import LimitWatch, Mailer, subject
from hai_cluster.core.model import JobSpec
from hai_cluster.store.records import JobRecord


def record(**kw) -> JobRecord:
    spec = JobSpec(script="#!/bin/sh\n", workdir="/w", name="train", mail_type=kw.pop("mail_type", ()),
                   mail_user=kw.pop("mail_user", None))
    base = {f.name: None for f in fields(JobRecord)}
    base.update(id=12, name="train", user="ann", uid=1000, gid=1000, partition="gpu", state="RUNNING",
                submit_time=100.0, spec=spec, **kw)
    return JobRecord(**base)


def test_subjects_are_slurm_s():
    job = record()
    assert subject(job, "BEGIN", start=161.0) == "Slurm Job_id=12 Name=train Began, Queued time 00:01:01"
    assert subject(job, "END", "COMPLETED", 0, 200.0, 90200.0) == \
        "Slurm Job_id=12 Name=train Ended, Run time 1-01:00:00, COMPLETED, ExitCode 0"
    assert subject(job, "FAIL", "FAILED", 3, 200.0, 205.0) == \
        "Slurm Job_id=12 Name=train Failed, Run time 00:00:05, FAILED, ExitCode 3"
    task = record(array_job_id=10, array_task_id=2)
    assert subject(task, "REQUEUE", start=200.0, end=260.0) == \
        "Slurm Array Task Job_id=10_2 (12) Name=train Requeued, Run time 00:01:00"


def test_which_notices_are_mailed():
    async def queued(job, *notices):
        m = Mailer("/bin/true", "lab")
        m.queue = asyncio.Queue()
        for kind, state in notices:
            m.notice(job, kind, state=state)
        return [m.queue.get_nowait()[0] for _ in range(m.queue.qsize())]

    run = asyncio.run
    assert run(queued(record(), ("BEGIN", None), ("END", "COMPLETED"))) == []  # asked for none
    mails = run(queued(record(mail_type=("END", "FAIL"), mail_user="ann@lab.example"),
                       ("BEGIN", None), ("END", "FAILED")))
    assert [(m[0], m[1], m[3]) for m in mails] == [("/bin/true", "-s", "ann@lab.example")]
    assert " Failed, " in mails[0][2]  # one mail for a failed end, with FAIL asked
    assert run(queued(record(mail_type=("FAIL",)), ("END", "COMPLETED"))) == []  # not a failure
    assert len(run(queued(record(mail_type=("ALL",)), ("BEGIN", None), ("REQUEUE", None), ("END", "CANCELLED")))) == 3
    task = record(mail_type=("ALL",), array_job_id=10, array_task_id=2)
    assert [m[2].split()[-1] for m in run(queued(task, ("BEGIN", None), ("END", "COMPLETED")))] == ["COMPLETED"]


def test_time_limit_marks_are_due_once_per_job_and_not_again_after_a_restart():
    job = record(mail_type=("TIME_LIMIT_50", "TIME_LIMIT_90", "END"), time_limit=100)
    w = LimitWatch()
    w.watch(job, 1000.0, 1000.0)
    assert w.due(1049.0) == [] and [k for _, k, _ in w.due(1050.0)] == ["TIME_LIMIT_50"]
    assert [k for _, k, _ in w.due(1095.0)] == ["TIME_LIMIT_90"] and w.due(2000.0) == []
    assert subject(job, "TIME_LIMIT_90", start=1000.0, end=1090.0) == \
        "Slurm Job_id=12 Name=train Reached 90% of time limit, Run time 00:01:30"
    w.run_ended(12, final=False, now=1100.0)  # requeued: the marks sent stay sent (Slurm clears the bits)
    w.watch(job, 2000.0, 2000.0)
    assert w.due(3000.0) == []
    # a restarted controller: only the marks still ahead
    fresh = LimitWatch()
    fresh.watch(job, 1000.0, 1060.0, skip_passed=True)
    assert [k for _, k, _ in fresh.due(1100.0)] == ["TIME_LIMIT_90"]
    # a run killed at its limit ends before the pass that would mail TIME_LIMIT: the end sends it
    limit = record(mail_type=("TIME_LIMIT",), time_limit=60)
    w.watch(limit, 0.0, 0.0)
    assert [k for _, k, _ in w.run_ended(12, final=True, now=60.5)] == ["TIME_LIMIT"]
    assert LimitWatch().due(10**9) == [] and not w.due(10**9)
    w.watch(record(mail_type=("ALL",), time_limit=60), 0.0, 0.0)  # ALL has no time limit mails, as Slurm's
    assert w.due(10**9) == []
