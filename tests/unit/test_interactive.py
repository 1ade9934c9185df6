"""Interactive jobs (salloc, srun outside a job), the pure parts: what an allocation's spec is,
its class in the MLFQ, its time limit, the wire of a client's step, salloc's and srun's options."""
from dataclasses import replace

import pytest

from hai_cluster.cli.salloc import Usage, split
from hai_cluster.cli.srun import normalized, parser
from hai_cluster.cli.srun_client import job_options
from hai_cluster.config import ControllerConfig
from hai_cluster.config.interactive import InteractiveConfig
from hai_cluster.controller import interactive
from hai_cluster.core.jobenv import allocation_variables, job_environment
from hai_cluster.core.jobscript import parse_submission
from hai_cluster.core.model import JobView
from hai_cluster.core.states import JobState
from hai_cluster.core.steps import StepIO
from hai_cluster.protocol.runspec import SpecError
from hai_cluster.protocol.steps import step_io, stdin_chunk, window
from hai_cluster.scheduling.mlfq import MlfqPolicy
from hai_cluster.scheduling.plan import Preempt, Start
from hai_cluster.store.views import probe_view
from hai_cluster.transport.rpc import RequestError

from .test_mlfq import CFG, node, pending, running, snapshot


def spec_of(*options):
    sub = parse_submission("#!/bin/sh\n", list(options), cwd="/home/a", env={})
    return interactive.allocation_spec(sub.spec)


def test_an_allocation_is_interactive_never_requeued_and_writes_no_output_file():
    spec = spec_of("-N", "2", "--gpus-per-node=1", "--requeue")
    assert spec.interactive and not spec.requeue and spec.resumes is None
    assert spec.stdout == "/dev/null" and spec.stderr is None
    view = probe_view(spec, job_id=1, user="a", partition="gpu", now=0)
    assert view.interactive and not view.preemptible and not view.resumable


@pytest.mark.parametrize("option, name", [(["--array=0-3"], "--array"), (["-o", "x.out"], "-o/--output"),
                                          (["--signal=B:USR1@60"], "--signal=B:"), (["--every-node"], "--every-node")])
def test_options_that_only_a_batch_script_has_are_refused_by_name(option, name):
    with pytest.raises(RequestError, match=f"Job submit/allocate failed: {name}: not for an interactive allocation"):
        spec_of(*option)


def test_interactive_max_time_is_the_longest_limit_and_the_default():
    cfg = ControllerConfig(interactive=InteractiveConfig(max_time=3600))
    spec = spec_of()
    assert interactive.time_limit(spec, cfg, None).time_limit == 3600
    assert interactive.time_limit(replace(spec, time_limit=7200), cfg, None).time_limit == 3600  # a partition's
    assert interactive.time_limit(replace(spec, time_limit=600), cfg, 600).time_limit == 600
    with pytest.raises(RequestError, match=r"-t 2:00:00 is longer than interactive jobs may run \(1:00:00, "
                                           r"\[interactive\] max_time\)"):
        interactive.time_limit(replace(spec, time_limit=7200), cfg, 7200)
    assert interactive.time_limit(spec, ControllerConfig(), None).time_limit == 86400  # the default: a day
    unlimited = ControllerConfig(interactive=InteractiveConfig(max_time=None))
    assert interactive.time_limit(spec, unlimited, None).time_limit is None


def test_interactive_jobs_start_ahead_of_batch_jobs_of_their_level_not_of_a_higher_one():
    batch = pending(1, gpus=4, t=0.0)
    session = replace(pending(2, gpus=4, t=5.0), interactive=True)
    plan = MlfqPolicy(CFG).decide(snapshot(10.0, [node("a")], [batch, session]))
    assert [a.job_id for a in plan.actions if isinstance(a, Start)] == [2]
    urgent = pending(3, gpus=4, t=8.0, priority="urgent")  # urgent still comes first
    plan = MlfqPolicy(CFG).decide(snapshot(10.0, [node("a")], [batch, session, urgent]))
    assert [a.job_id for a in plan.actions if isinstance(a, Start)] == [3]


def test_time_slicing_never_takes_an_interactive_session():
    spec = spec_of("--gpus-per-node=4")
    view = probe_view(spec, job_id=1, user="u", partition="gpu", now=0)
    # a long session (level 2, quantum long over) and a new batch job that wants its GPUs
    session = replace(running(1, [("a", [0, 1, 2, 3])], start=0.0, attained=5000.0),
                      preemptible=view.preemptible, resumable=view.resumable, interactive=True)
    plan = MlfqPolicy(CFG).decide(snapshot(1000.0, [node("a")], [session, pending(2, gpus=4, t=900.0)]))
    assert not [a for a in plan.actions if isinstance(a, (Preempt, Start))]
    # the same run, were it a resumable batch job, would be taken
    batch = replace(session, preemptible=True, resumable=True, interactive=False)
    plan = MlfqPolicy(CFG).decide(snapshot(1000.0, [node("a")], [batch, pending(2, gpus=4, t=900.0)]))
    assert [a.job_id for a in plan.actions if isinstance(a, Preempt)] == [1]


def test_salloc_sets_the_allocations_variables_and_none_of_a_nodes():
    env = job_environment({"HOME": "/h", "CUDA_VISIBLE_DEVICES": "7"}, job_id=12, job_name="interactive", user="a",
                          partition="gpu", nodelist=["n1", "n2"], rank=0, node="n1", gpus=[0, 1], cpus_per_task=2,
                          restart_count=0, checkpoint_dir="/c", submit_dir="/home/a", master_addr="n1", time_limit=None,
                          tasks_per_node=2, ntasks=4, cluster_name="hai")
    got = allocation_variables(env)
    assert got == {"SLURM_JOB_ID": "12", "SLURM_JOBID": "12", "SLURM_JOB_NAME": "interactive",
                   "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_NODELIST": "n[1-2]", "SLURM_NNODES": "2",
                   "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_CPUS_PER_NODE": "4(x2)", "SLURM_TASKS_PER_NODE": "2(x2)",
                   "SLURM_NTASKS": "4", "SLURM_NPROCS": "4", "SLURM_JOB_PARTITION": "gpu", "SLURM_SUBMIT_DIR": "/home/a",
                   "SLURM_CLUSTER_NAME": "hai", "SLURM_CPUS_PER_TASK": "2", "HAI_JOB_ID": "12",
                   "HAI_JOB_NAME": "interactive", "HAI_NODELIST": "n[1-2]", "HAI_NNODES": "2", "HAI_PARTITION": "gpu"}


def test_a_client_steps_io_is_checked_field_by_field():
    assert step_io(None) == StepIO()
    io = step_io({"input": 3, "pty": False, "rows": 50, "cols": 200, "unbuffered": True})
    assert io.reads_input(3) and not io.reads_input(0)
    pty = step_io({"input": "all", "pty": True, "rows": 24, "cols": 80, "unbuffered": False})
    assert pty.reads_input(0) and not pty.reads_input(1)  # a terminal's keys go to task 0 alone
    assert not StepIO(input="none").reads_input(0) and StepIO().reads_input(5)
    for bad in ({"input": "file.txt", "pty": False, "rows": 1, "cols": 1, "unbuffered": False},
                {"input": "all", "pty": 1, "rows": 1, "cols": 1, "unbuffered": False},
                {"input": "all", "pty": True, "rows": 0, "cols": 80, "unbuffered": False},
                {"input": True, "pty": True, "rows": 24, "cols": 80, "unbuffered": False},
                {"input": "all", "pty": True, "rows": 24, "cols": 80}):
        with pytest.raises(SpecError):
            step_io(bad)
    with pytest.raises(SpecError):
        window({"rows": 24, "cols": 10**6})
    with pytest.raises(SpecError):
        stdin_chunk({"data": b"x" * (64 * 1024 + 1), "eof": False})
    assert stdin_chunk({"data": b"", "eof": True}) == (b"", True)


def test_salloc_tells_its_own_options_from_sbatchs_and_the_command():
    own, options, command = split(["-N", "2", "--no-shell", "-I5", "-t", "10", "-K", "--exclusive", "-J", "x",
                                   "bash", "-c", "-I"])
    assert own == {"no_shell": True, "immediate": 5, "kill": 0, "quiet": False}
    assert options == ["-N", "2", "-t", "10", "--exclusive", "-J", "x"] and command == ["bash", "-c", "-I"]
    own, _, command = split(["--immediate", "--kill-command=TERM", "-Q", "--", "--odd-command"])
    assert own == {"no_shell": False, "immediate": 0, "kill": 15, "quiet": True} and command == ["--odd-command"]
    assert split(["-KUSR1"])[0]["kill"] == 10 and split([])[2] == []
    with pytest.raises(Usage, match="Invalid signal specification: NOPE"):
        split(["--kill-command=NOPE"])


def test_srun_outside_a_job_asks_for_its_job_with_sbatchs_options():
    p = parser()
    args = p.parse_args(normalized(p, ["-N2", "-n", "4", "-t", "5", "-w", "n[1-2]", "--gpus-per-node=2", "--immediate",
                                       "--nice", "-K", "--pty", "python3", "-I", "--nice=3"]))
    assert args.command == ["python3", "-I", "--nice=3"] and args.pty and args.immediate == 0
    assert job_options(args) == ["--job-name=python3", "--nodes=2", "--ntasks=4", "--nice=100", "--nodelist=n1,n2",
                                 "--time=5", "--gpus-per-node=2"]
    args = p.parse_args(normalized(p, ["-I7", "-J", "dbg", "--nice=5", "-i", "0", "true"]))
    assert (args.immediate, args.input, job_options(args)) == (7, "0", ["--job-name=dbg", "--nice=5"])


def test_pending_interactive_view_is_a_plain_pending_job_to_everything_else():
    view = JobView(id=1, user="u", state=JobState.PENDING, submit_time=0, nodes=1, gpus_per_node=1)
    assert not view.interactive
