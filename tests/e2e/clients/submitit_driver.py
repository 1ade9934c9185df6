"""A lab's submitit use, unmodified (run by tests/e2e/test_submitit.py as the test user, with the
cluster's sbatch, srun, sacct, scancel and scontrol first on PATH). Each mode prints one line."""
from __future__ import annotations

import sys
import time

import submitit


def add(a, b):
    return a + b


def where():
    env = submitit.JobEnvironment()
    return env.global_rank, env.local_rank, env.node, env.num_tasks, env.num_nodes


def square(x):
    return x * x


class Count(submitit.helpers.Checkpointable):
    """Counts to `total`, slowly; preempted, it is pickled with its count and resumes from it."""

    def __init__(self):
        self.count = 0
        self.runs = []

    def __call__(self, total):
        import os
        self.runs.append(int(os.environ.get("SLURM_RESTART_COUNT", "0")))
        while self.count < total:
            time.sleep(0.1)
            self.count += 1
        return self.count, self.runs


def executor(folder: str, **params) -> submitit.AutoExecutor:
    ex = submitit.AutoExecutor(folder=folder, cluster="slurm")
    ex.update_parameters(timeout_min=30, slurm_partition="gpu", cpus_per_task=1, **params)
    return ex


def main(mode: str, folder: str, *args: str) -> None:
    if mode == "add":
        print("add", executor(folder, nodes=1, tasks_per_node=1).submit(add, 2, 3).result())
    elif mode == "ranks":
        job = executor(folder, nodes=2, tasks_per_node=2, gpus_per_node=1).submit(where)
        print("ranks", sorted(job.results()))
    elif mode == "map":
        jobs = executor(folder, nodes=1, tasks_per_node=1).map_array(square, [1, 2, 3])
        print("map", [j.result() for j in jobs], len({j.job_id.split("_")[0] for j in jobs}))
    elif mode == "cancel":
        # submitit's job ignores SIGTERM (its handler lets it pass: Slurm sends it to every step of a
        # preempted job), so a cancel ends with the SIGKILL after the grace, 60 s by default (Slurm:
        # KillWait, 30 s); a short one keeps the wait under the test's 60 s
        job = executor(folder, nodes=1, tasks_per_node=1,
                       slurm_additional_parameters={"grace": 5}).submit(time.sleep, 1000)
        # forced sacct calls: submitit's own polling backs off to a call a minute
        while job.get_info(mode="force").get("State") != "RUNNING":
            time.sleep(0.5)
        job.cancel()
        while not job.done(force_check=True):
            time.sleep(0.5)
        print("cancel", job.state.split()[0])
    elif mode == "count":
        job = executor(folder, nodes=2, tasks_per_node=1, gpus_per_node=2).submit(Count(), int(args[0]))
        print(job.job_id)
    elif mode == "count-result":
        print("count", submitit.SlurmJob(folder, args[0]).result())
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main(*sys.argv[1:])
