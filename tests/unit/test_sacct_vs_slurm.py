"""sacct's State, ExitCode, DerivedExitCode and AllocTRES of ended jobs and their steps, against
what Slurm 22.05's sacct printed for the same jobs (the peer with a slurmdbd, 2026-12-06; ids and
node names made ours): a completed job with two srun steps, a failed one, a cancelled one, one
past its time limit, one whose script a signal ended, and one whose srun steps were killed,
failed and completed (its DerivedExitCode is the highest: an exit code outranks a signal)."""
from __future__ import annotations

from hai_cluster.cli import sacct
from hai_cluster.cli.acctrows import rows_for

SLURM = """\
1|okjob|COMPLETED|0:0|0:0|billing=4,cpu=4,node=2
1.batch|batch|COMPLETED|0:0||cpu=2,mem=0,node=1
1.0|hostname|COMPLETED|0:0||cpu=4,mem=0,node=2
2|failjob|FAILED|3:0|0:0|billing=1,cpu=1,node=1
2.batch|batch|FAILED|3:0||cpu=1,mem=0,node=1
3|longjob|CANCELLED by 0|0:0|0:0|billing=1,cpu=1,node=1
3.batch|batch|CANCELLED|0:15||cpu=1,mem=0,node=1
4|tojob|TIMEOUT|0:0|0:0|billing=1,cpu=1,node=1
4.batch|batch|CANCELLED|0:15||cpu=1,mem=0,node=1
5|sigjob|FAILED|0:9|0:0|billing=1,cpu=1,node=1
5.batch|batch|CANCELLED|0:9||cpu=1,mem=0,node=1
6|stepjob|COMPLETED|0:0|3:0|billing=1,cpu=1,node=1
6.batch|batch|COMPLETED|0:0||cpu=1,mem=0,node=1
6.0|bash|CANCELLED|0:9||cpu=1,mem=0,node=1
6.1|bash|FAILED|3:0||cpu=1,mem=0,node=1
6.2|true|COMPLETED|0:0||cpu=1,mem=0,node=1
"""


def job(i, name, state, code, sig, nodes=1, cpus=1, mem_mb=None, reason=""):
    return {"id": i, "name": name, "state": state, "exit_code": code, "exit_signal": sig, "submit_time": 100.0,
            "start_time": 101.0, "end_time": 110.0, "user": "root", "uid": 0, "partition": "gpu", "nodes": nodes,
            "cpus_per_task": cpus, "tasks_per_node": 1, "mem_mb": mem_mb, "interactive": False, "overcommit": False,
            "restart_count": 0, "reason": reason, "array_job_id": None, "array_task_id": None, "time_limit": None,
            "priority": "normal", "qos": None, "constraint": None}


def run(i, state, code, sig, nodelist="n1", gpus=0):
    return {"id": 100 + i, "job_id": i, "attempt": 0, "state": state, "start_time": 101.0, "end_time": 110.0,
            "exit_code": code, "exit_signal": sig, "nodelist": nodelist, "gpus": gpus, "reason": "",
            "gpu_charge": None, "account": None, "name": "", "user": "root", "partition": "gpu"}


def step(i, n, name, state, code, sig, nodelist="n1", cpus=1):
    return {"run_id": 100 + i, "step_id": n, "name": name, "state": state, "exit_code": code, "exit_signal": sig,
            "start_time": 102.0, "end_time": 103.0, "nodelist": nodelist, "cpus": cpus, "ntasks": 1}


def lines(reply, fmt="JobID,JobName,State,ExitCode,DerivedExitCode,AllocTRES"):
    """`sacct -P -n -o FMT` of the reply's rows."""
    jobs = {j["id"]: j for j in reply["jobs"]}
    rows = rows_for(reply, True)
    for r in rows:
        r["job"] = jobs[r["job_id"]]
    keys = [key for key, _f in sacct.parse_fields(fmt)]
    return "".join("|".join(str(sacct.FIELDS[k][2](r)) for k in keys) + "\n" for r in rows)


def test_ended_jobs_and_steps_read_as_slurms():
    jobs = [job(1, "okjob", "COMPLETED", 0, None, nodes=2, cpus=2), job(2, "failjob", "FAILED", 3, None),
            job(3, "longjob", "CANCELLED", 0, 15, reason="cancelled by 0"), job(4, "tojob", "TIMEOUT", 0, 15),
            job(5, "sigjob", "FAILED", 0, 9), job(6, "stepjob", "COMPLETED", 0, None)]
    runs = [run(1, "COMPLETED", 0, None, "n1,n2"), run(2, "FAILED", 3, None), run(3, "CANCELLED", 0, 15),
            run(4, "TIMEOUT", 0, 15), run(5, "FAILED", 0, 9), run(6, "COMPLETED", 0, None)]
    runs[2]["reason"] = "cancelled by 0"
    steps = [step(1, 0, "hostname", "COMPLETED", 0, None, "n1,n2", 4),
             step(6, 0, "bash", "FAILED", 0, 9), step(6, 1, "bash", "FAILED", 3, None),
             step(6, 2, "true", "COMPLETED", 0, None)]
    for r, j in zip(runs, jobs):
        r["name"] = j["name"]
    assert lines({"now": 200.0, "jobs": jobs, "runs": runs, "steps": steps}) == SLURM


def test_memory_reads_in_slurms_units_and_a_steps_line_has_no_billing():
    reply = {"now": 200.0, "jobs": [job(7, "gpujob", "COMPLETED", 0, None, mem_mb=1024)],
             "runs": [{**run(7, "COMPLETED", 0, None, gpus=2), "name": "gpujob"}], "steps": [step(7, 0, "true", "COMPLETED", 0, None)]}
    assert lines(reply) == ("7|gpujob|COMPLETED|0:0|0:0|billing=1,cpu=1,gres/gpu=2,mem=1G,node=1\n"
                            "7.batch|batch|COMPLETED|0:0||cpu=1,mem=1G,node=1\n"
                            "7.0|true|COMPLETED|0:0||cpu=1,mem=1G,node=1\n")
    assert lines(reply, "JobID,ReqMem") == "7|1G\n7.batch|\n7.0|\n"


def _states_reply():
    """The peer's three jobs of the -s check: completed (with steps that a signal ended, that
    failed and that completed), failed, cancelled; all ran and ended between 10:00 and now."""
    jobs = [job(6, "stepjob", "COMPLETED", 0, None), job(2, "failjob", "FAILED", 3, None),
            job(3, "longjob", "CANCELLED", 0, 15, reason="cancelled by 0")]
    runs = [run(6, "COMPLETED", 0, None), run(2, "FAILED", 3, None), run(3, "CANCELLED", 0, 15)]
    runs[2]["reason"] = "cancelled by 0"
    for r, j in zip(runs, jobs):
        j["submit_time"] = 1000.0
        r.update(name=j["name"], start_time=1001.0, end_time=1010.0)
    steps = [step(6, 0, "bash", "FAILED", 0, 9), step(6, 1, "bash", "FAILED", 3, None),
             step(6, 2, "true", "COMPLETED", 0, None)]
    for st in steps:
        st.update(start_time=1002.0, end_time=1003.0)
    return {"now": 2000.0, "jobs": jobs, "runs": runs, "steps": steps}


def ids(**options):
    import time
    at = {k: time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(v)) for k, v in options.items() if k.endswith("time")}
    kw = dict(allusers=True, users=None, me=False, job_ids=None, starttime=None, endtime=None, states=None, names=None,
              partitions=None, fmt="JobID", long_=False, allocations=False, noheader=True, parsable2=True,
              parsable1=False)
    kw.update({**options, **at})
    q = sacct.query({}, lambda: "root", True, 2000.0, **kw)
    return sacct.text_of(q, sacct.shown_rows(q, _states_reply())).split()


def test_a_state_filter_asks_what_was_in_that_state_during_the_window_as_slurm_does():
    """What Slurm 22.05's sacct listed for the same three jobs (peer with slurmdbd): -s chooses
    jobs, each with all its steps; the window is now..now without -S and S..S without -E; R is
    "ran during the window"; -j without -S/-E takes the states as they are."""
    assert ids(states=("F",)) == []
    assert ids(states=("F",), starttime=900.0) == []
    assert ids(states=("F",), starttime=900.0, endtime=2000.0) == ["2", "2.batch"]
    assert ids(states=("CA",), starttime=900.0, endtime=2000.0) == ["3", "3.batch"]
    assert ids(states=("CD",), starttime=900.0, endtime=2000.0) == ["6", "6.batch", "6.0", "6.1", "6.2"]
    assert ids(states=("R,F",), starttime=900.0, endtime=2000.0) == ["6", "6.batch", "6.0", "6.1", "6.2", "2",
                                                                   "2.batch", "3", "3.batch"]
    assert ids(states=("F",), job_ids=("2",)) == ["2", "2.batch"]
    assert ids(states=("F",), job_ids=("2",), starttime=900.0) == []
    assert ids(states=("R",), starttime=1011.0, endtime=2000.0) == []  # ended before the window
