"""Interactive jobs at submission (salloc, srun outside a job): which of sbatch's options an
allocation takes, its time limit and the [interactive] limits (config/interactive.py).

An allocation runs no batch script: its output options, arrays and the batch shell's signal have
nothing to apply to and are refused by name. It is never requeued (a session cannot resume: a
preemption or a node's loss ends it), so time-slicing never takes it.
"""
from __future__ import annotations

import os
from dataclasses import replace

from ..config import ControllerConfig
from ..core.model import JobSpec
from ..core.timefmt import format_limit
from ..store import interactive as store
from ..transport.rpc import RequestError

FAILED = "Job submit/allocate failed"


def allocation_spec(spec: JobSpec, detached: bool = False) -> JobSpec:
    """The spec of an interactive allocation, or RequestError for an option it cannot take."""
    refused = [name for name, given in (
        ("--array", spec.array is not None), ("--every-node", spec.every_node),
        ("--container-image", spec.container_image is not None), ("--runtime", spec.runtime is not None),
        ("--signal=B:", spec.signal_batch), ("-o/--output", spec.stdout is not None),
        ("-e/--error", spec.stderr is not None), ("--open-mode", spec.open_mode is not None)) if given]
    if refused:
        raise RequestError(f"{FAILED}: {', '.join(refused)}: not for an interactive allocation (it runs no batch "
                           f"script{'; containers not yet' if spec.container_image or spec.runtime else ''})")
    return replace(spec, interactive=True, detached=detached, requeue=False, resumes=None, stdout=os.devnull,
                   stderr=None)


def time_limit(spec: JobSpec, cfg: ControllerConfig, given: int | None) -> JobSpec:
    """[interactive] max_time: the longest -t (`given`) an interactive job may ask, and the limit
    of one that asks none (or a partition's or QOS's longer one)."""
    top = cfg.interactive.max_time
    if top is None:
        return spec
    if given is not None and given > top:
        raise RequestError(f"{FAILED}: Requested time limit is invalid (missing or exceeds some limit): "
                           f"-t {format_limit(given)} is longer than interactive jobs may run "
                           f"({format_limit(top)}, [interactive] max_time)")
    if spec.time_limit is None or spec.time_limit > top:
        return replace(spec, time_limit=top)
    return spec


def check_limits(engine, cfg: ControllerConfig, *, user: str, account: str, spec: JobSpec) -> None:
    """On the store's thread, in turn with every other submission: RequestError if one more
    interactive job of `spec` would be beyond a limit."""
    lim = cfg.interactive
    if not any(getattr(lim, k) for k in lim.COUNTS):
        return
    (jobs, gpus), (account_jobs, account_gpus) = store.held(engine, user=user, account=account)
    want = spec.nodes * spec.gpus_per_node
    for count, has, adds, key, whose, what in (
            (lim.max_jobs_per_user, jobs, 1, "max_jobs_per_user", f"user {user}", "interactive jobs"),
            (lim.max_gpus_per_user, gpus, want, "max_gpus_per_user", f"user {user}", "GPUs in interactive jobs"),
            (lim.max_jobs_per_account, account_jobs, 1, "max_jobs_per_account", f"account {account}",
             "interactive jobs"),
            (lim.max_gpus_per_account, account_gpus, want, "max_gpus_per_account", f"account {account}",
             "GPUs in interactive jobs")):
        if count and adds and has + adds > count:
            raise RequestError(f"{FAILED}: interactive job limit: {whose} would hold {has + adds} {what} "
                               f"(at most {count}, [interactive] {key}; {has} held now: end one, e.g. exit its salloc)")
