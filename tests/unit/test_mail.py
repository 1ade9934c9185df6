"""--mail-type: Slurm's subjects (src/slurmctld/agent.c, mail_job_info) and which notices go out."""
import asyncio
from dataclasses import fields

from hai_cluster.controller.mail import Mailer, subject
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
