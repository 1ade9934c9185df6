"""Typed records the store returns to the controller: a job with its parsed spec, a run just
started. The columns are the job table's (schema.py); a test checks that they match."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping

from ..core.model import JobSpec


@dataclass(frozen=True, slots=True)
class JobRecord:
    """A job row, its spec parsed once (an array task's: its array's with the task's own changes)."""
    id: int
    name: str
    user: str
    uid: int
    gid: int
    partition: str
    state: str
    reason: str
    priority: str
    submit_time: float
    start_time: float | None
    end_time: float | None
    nodes: int
    gpus_per_node: int
    cpus_per_task: int
    mem_mb: int | None
    time_limit: int | None
    hold: bool
    restart_count: int
    attempts: int
    exit_code: int | None
    exit_signal: int | None
    nodelist: str
    end_request: str | None
    attained_gpu_seconds: float
    version: int
    pending_since: float | None
    last_run_end: float | None
    preemptible: bool
    end_reason: str | None
    hold_admin: bool
    runtime: str | None
    begin_time: float | None
    array_job_id: int | None
    array_task_id: int | None
    array_task_limit: int | None
    dependency: str | None
    account: str | None
    gpu_fraction: float | None
    gpu_mem_mb: int | None
    gpu_compute: int | None
    gpu_qos: str | None
    tasks_per_node: int
    resumes: str | None
    exclusive: bool
    required_nodes: str | None
    excluded_nodes: str | None
    constraint: str | None
    qos: str | None
    nice: int
    reservation: str | None
    interactive: bool
    overcommit: bool  # 0031: -O (JobSpec.overcommit)
    spec: JobSpec

    @classmethod
    def of(cls, row: Mapping[str, Any], spec: Mapping[str, Any], **overrides: Any) -> JobRecord:
        """From a job row's mapping and its whole spec's wire form; `overrides`: columns the
        caller changed in the same transaction."""
        values = {**row, **overrides}
        return cls(**{name: values[name] for name in COLUMNS}, spec=JobSpec.from_wire(spec))

    @property
    def nodelist_names(self) -> list[str]:
        return [n for n in self.nodelist.split(",") if n]


COLUMNS = tuple(f.name for f in fields(JobRecord) if f.name != "spec")


@dataclass(frozen=True, slots=True)
class StartedRun:
    """A run the applier recorded: its job as it now is, and what each rank is sent."""
    job: JobRecord
    attempt: int
    run_id: int
    mig: tuple[str, ...]  # per rank, the MIG instance a sharing rank holds ("" none); () no MIG
