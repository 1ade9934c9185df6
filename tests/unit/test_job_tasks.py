"""Tasks in a job's request (-n, --ntasks-per-node, --gpus-per-task): what sbatch reads, what a
node must hold, and the variables the batch script sees. The expected variables are what
Slurm 22.05 printed for the same options (the peer in ../shared/peers/slurm, 64-CPU nodes)."""
import pytest

from hai_cluster.core.jobenv import job_environment
from hai_cluster.core.jobscript import JobScriptError, parse_submission
from hai_cluster.core.model import JobState, JobView, NodeView
from hai_cluster.core.resources import fits

TASK_VARS = ("SLURM_NTASKS", "SLURM_NPROCS", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE",
             "SLURM_CPUS_ON_NODE", "SLURM_JOB_CPUS_PER_NODE", "SLURM_GPUS_PER_TASK", "SLURM_GPUS_ON_NODE")


def spec_of(*options):
    return parse_submission("#!/bin/sh\ntrue\n", list(options), cwd="/home/a", env={}).spec


def batch_env(spec, base=None):
    nodelist = [f"n{i + 1}" for i in range(spec.nodes)]
    return job_environment(
        base or {}, job_id=7, job_name="t", user="a", partition=None, nodelist=nodelist, rank=0,
        node="n1", gpus=list(range(spec.gpus_per_node)), cpus_per_task=spec.cpus_per_task,
        restart_count=0, checkpoint_dir="/c", submit_dir="/home/a", master_addr="n1", time_limit=None,
        tasks_per_node=spec.tasks_per_node, ntasks=spec.ntasks, ntasks_per_node=spec.ntasks_per_node,
        gpus_per_task=spec.gpus_per_task)


@pytest.mark.parametrize("options, slurm", [
    ("-N 2 --ntasks-per-node=4", "SLURM_CPUS_ON_NODE=4 SLURM_JOB_CPUS_PER_NODE=4(x2) SLURM_NPROCS=8 "
     "SLURM_NTASKS=8 SLURM_NTASKS_PER_NODE=4 SLURM_TASKS_PER_NODE=4(x2)"),
    ("-n 4", "SLURM_CPUS_ON_NODE=4 SLURM_JOB_CPUS_PER_NODE=4 SLURM_NPROCS=4 SLURM_NTASKS=4 "
     "SLURM_TASKS_PER_NODE=4"),
    ("-N 1 -n 3 -c 2", "SLURM_CPUS_ON_NODE=6 SLURM_JOB_CPUS_PER_NODE=6 SLURM_NPROCS=3 SLURM_NTASKS=3 "
     "SLURM_TASKS_PER_NODE=3"),
    ("-N 2 --ntasks-per-node=2 --gpus-per-task=2", "SLURM_CPUS_ON_NODE=2 SLURM_GPUS_ON_NODE=4 "
     "SLURM_GPUS_PER_TASK=2 SLURM_JOB_CPUS_PER_NODE=2(x2) SLURM_NPROCS=4 SLURM_NTASKS=4 "
     "SLURM_NTASKS_PER_NODE=2 SLURM_TASKS_PER_NODE=2(x2)"),
    ("-n 12 -c 2", "SLURM_CPUS_ON_NODE=24 SLURM_JOB_CPUS_PER_NODE=24 SLURM_NPROCS=12 SLURM_NTASKS=12 "
     "SLURM_TASKS_PER_NODE=12"),
    ("-N 2", "SLURM_CPUS_ON_NODE=1 SLURM_JOB_CPUS_PER_NODE=1(x2) SLURM_TASKS_PER_NODE=1(x2)"),
    ("-N 2 -c 3", "SLURM_CPUS_ON_NODE=3 SLURM_JOB_CPUS_PER_NODE=3(x2) SLURM_TASKS_PER_NODE=1(x2)"),
    ("-N 2 -n 2 -c 3 --gpus-per-task=1", "SLURM_CPUS_ON_NODE=3 SLURM_GPUS_ON_NODE=1 SLURM_GPUS_PER_TASK=1 "
     "SLURM_JOB_CPUS_PER_NODE=3(x2) SLURM_NPROCS=2 SLURM_NTASKS=2 SLURM_TASKS_PER_NODE=1(x2)"),
    ("-n 3 --gpus-per-task=1", "SLURM_CPUS_ON_NODE=3 SLURM_GPUS_ON_NODE=3 SLURM_GPUS_PER_TASK=1 "
     "SLURM_JOB_CPUS_PER_NODE=3 SLURM_NPROCS=3 SLURM_NTASKS=3 SLURM_TASKS_PER_NODE=3"),
])
def test_the_batch_script_sees_the_task_variables_sbatch_sets(options, slurm):
    env = batch_env(spec_of(*options.split()))
    seen = " ".join(f"{k}={env[k]}" for k in sorted(TASK_VARS) if k in env)
    assert seen == slurm


def test_variables_from_the_submitters_own_allocation_are_not_kept():
    inherited = {"SLURM_NTASKS": "64", "SLURM_NPROCS": "64", "SLURM_NTASKS_PER_NODE": "8", "SLURM_GPUS_PER_TASK": "1"}
    env = batch_env(spec_of("-N", "2"), base=inherited)
    assert not set(inherited) & set(env)


@pytest.mark.parametrize("options, nodes, tasks, gpus", [
    ("-n 8 --ntasks-per-node=4", 2, 4, 0),  # -n with --ntasks-per-node: the nodes follow
    ("-N 2 -n 8 --ntasks-per-node=4", 2, 4, 0),
    ("-N 4 -n 8", 4, 2, 0),
    ("-N 2 --ntasks-per-node=8 --gpus-per-task=1", 2, 8, 8),
    ("--ntasks-per-node=2 -c 4", 1, 2, 0),
])
def test_the_request_holds_the_same_tasks_on_every_node(options, nodes, tasks, gpus):
    spec = spec_of(*options.split())
    assert (spec.nodes, spec.tasks_per_node, spec.gpus_per_node) == (nodes, tasks, gpus)
    assert spec.cpus_per_node == tasks * spec.cpus_per_task


@pytest.mark.parametrize("options, message", [
    ("-N 2 -n 5", "-n 5: 5 tasks cannot be spread evenly over 2 nodes"),
    ("-N 4 -n 2", "-n 2: 2 tasks cannot be spread evenly over 4 nodes"),
    ("-n 6 --ntasks-per-node=4", "-n 6: 6 tasks do not make --ntasks-per-node=4 on every node"),
    ("-N 2 -n 6 --ntasks-per-node=4", "-n 6: 6 tasks do not make --ntasks-per-node=4 on 2 nodes"),
    ("-n 0", "-n 0: expected a positive integer"),
    ("--ntasks-per-node=513", "--ntasks-per-node=513: at most 512 tasks"),
    ("-n 65537", "-n 65537: at most 65536 tasks"),
    ("--gpus-per-task=0", "--gpus-per-task=0: expected a positive integer"),
    ("--gpus-per-task=1 --gpus-per-node=2", "--gpus-per-task=1: cannot be combined with --gpus-per-node=2"),
    ("--gpus-per-task=1 --gpu-mem=4G", "--gpus-per-task=1: cannot be combined with --gpu-mem=4G"),
])
def test_task_requests_that_cannot_be_met_evenly_are_refused_by_name(options, message):
    with pytest.raises(JobScriptError) as exc:
        spec_of(*options.split())
    assert message in str(exc.value)


def test_the_directives_give_tasks_too():
    script = "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=4\n#SBATCH --gpus-per-task=1\nsrun true\n"
    spec = parse_submission(script, [], cwd="/home/a", env={}).spec
    assert (spec.nodes, spec.tasks_per_node, spec.gpus_per_node, spec.ntasks_per_node) == (2, 4, 4, 4)


def test_a_node_must_hold_every_task_of_its_share():
    job = JobView(id=1, user="a", state=JobState.PENDING, submit_time=0, nodes=1, gpus_per_node=0,
                  cpus_per_task=4, tasks_per_node=4)
    assert fits(job, NodeView(name="big", gpus=(), cpus=16, mem_mb=65536))
    small = fits(job, NodeView(name="small", gpus=(), cpus=12, mem_mb=65536))
    assert not small and small.reason == "small has 12 CPUs, job needs 16"
    busy = fits(job, NodeView(name="busy", gpus=(), cpus=16, mem_mb=65536, used_cpus=4))
    assert not busy and busy.reason == "busy has 12 free CPUs"
