"""The controller-agent contract (protocol/runspec.py): what dispatch builds is what the agent
accepts, and the wire form stays readable one release apart in both directions."""
import pytest

from hai_cluster.controller.dispatch import rank_spec
from hai_cluster.core.model import JobSpec
from hai_cluster.protocol.runspec import RunSpec, RunStatus, SpecError
from hai_cluster.store.records import COLUMNS, JobRecord

# The keys of a plain job's start_run spec as the release before this contract sent it
# (dispatch built the map by hand) and as its agent checked them: exactly these, no more.
PREVIOUS_WIRE_KEYS = {
    "job_id", "attempt", "rank", "user", "uid", "gid", "script", "script_args", "workdir", "stdout", "stderr",
    "environment", "time_limit", "signal", "signal_time", "grace", "checkpoint_dir", "runtime",
    "container_image", "mem_mb", "cpus", "gpus", "umask"}
PREVIOUS_OPTIONAL = {"runtime", "container_image", "mem_mb", "cpus", "gpus", "umask", "gpu_share"}


def job_row(**spec_fields) -> JobRecord:
    spec = JobSpec(script="#!/bin/sh\necho hi\n", workdir="/home/u/run", name="train", **spec_fields)
    row = dict.fromkeys(COLUMNS)
    row.update(id=42, name="train", user="u", uid=1000, gid=1000, partition="gpu", restart_count=1)
    return JobRecord.of(row, spec.to_wire())


def test_dispatch_builds_the_run_spec_the_agent_accepts():
    spec = rank_spec(job_row(gpus_per_node=2, cpus_per_task=4, mem_mb=2048, every_node=True), attempt=3, rank=1,
                     nodelist=["n1", "n2"], gpus=[2, 3], addresses={"n1": "10.0.0.1"})
    assert isinstance(spec, RunSpec)
    assert RunSpec.from_wire(spec.to_wire()) == spec
    assert (spec.key, spec.rank, spec.gpus, spec.cpus, spec.mem_mb) == ((42, 3), 1, (2, 3), 4, 2048)
    assert spec.stdout == "/home/u/run/slurm-42.out" and spec.environment["MASTER_ADDR"] == "10.0.0.1"
    assert not spec.step_server and "step_server" not in spec.to_wire()


def test_the_nodes_after_the_first_run_the_step_server_and_leave_the_output_file_alone():
    job = job_row(gpus_per_node=2)
    first, second = (rank_spec(job, attempt=0, rank=r, nodelist=["n1", "n2"], gpus=[0, 1], addresses={})
                     for r in (0, 1))
    assert not first.step_server and first.stdout == "/home/u/run/slurm-42.out"
    assert second.step_server and (second.stdout, second.stderr) == ("/dev/null", None)
    assert RunSpec.from_wire(second.to_wire()) == second


def test_a_plain_run_goes_on_the_wire_as_the_previous_release_sent_it():
    """A controller upgraded first still starts runs on agents of the previous release."""
    wire = rank_spec(job_row(), attempt=0, rank=0, nodelist=["n1"], gpus=[], addresses={}).to_wire()
    assert set(wire) == PREVIOUS_WIRE_KEYS
    assert PREVIOUS_WIRE_KEYS - PREVIOUS_OPTIONAL <= set(wire)  # what that agent requires


@pytest.mark.parametrize("fields, first, second", [
    ({}, "job", "job"),  # no --signal: nothing to say, nothing on the wire
    ({"signal": 10}, "steps", "steps"),  # Slurm's rule: the steps' tasks, not the batch shell
    ({"signal": 10, "signal_batch": True}, "batch", "batch"),  # B: (the step server's node has none)
    ({"signal": 10, "every_node": True}, "job", "job"),  # a script on every node is its own step
])
def test_the_warning_goes_to_whom_slurm_sends_it(fields, first, second):
    job = job_row(nodes=2, **fields)
    specs = [rank_spec(job, attempt=0, rank=r, nodelist=["n1", "n2"], gpus=[], addresses={}) for r in (0, 1)]
    assert [s.warn_to for s in specs] == [first, second]
    for s in specs:
        assert RunSpec.from_wire(s.to_wire()) == s and ("warn_to" in s.to_wire()) == (s.warn_to != "job")
    with pytest.raises(SpecError, match="spec.warn_to must be one of job, steps, batch"):
        RunSpec.from_wire({**specs[0].to_wire(), "warn_to": "everyone"})


def test_a_sharing_run_carries_its_share_and_a_plain_one_none():
    wire = rank_spec(job_row(gpu_fraction=0.25), attempt=0, rank=0, nodelist=["n1"], gpus=[0],
                     addresses={}).to_wire()
    assert wire["gpu_share"] == {"fraction": 0.25, "mem_mb": None, "compute": None, "qos": "guaranteed"}
    assert RunSpec.from_wire(wire).gpu_share == wire["gpu_share"]


def test_the_agent_reads_what_a_previous_controller_sent_and_refuses_unknown_fields():
    """An agent upgraded first still runs what a controller of the previous release asks."""
    old = rank_spec(job_row(), attempt=0, rank=0, nodelist=["n1"], gpus=[], addresses={}).to_wire()
    for optional in ("runtime", "container_image", "mem_mb", "cpus", "gpus", "umask"):
        del old[optional]  # the first release sent none of these
    spec = RunSpec.from_wire(old)
    assert (spec.runtime, spec.gpus, spec.umask, spec.gpu_share) == (None, (), 0o022, None)
    with pytest.raises(SpecError, match="unknown field"):
        RunSpec.from_wire({**old, "steps": []})


def test_the_agent_refuses_a_grace_past_the_protocols_bound():
    """A grace of 10^9 s let a job outlive its time limit and an admin's cancel (fourth audit)."""
    wire = rank_spec(job_row(grace=3600), attempt=0, rank=0, nodelist=["n1"], gpus=[], addresses={}).to_wire()
    assert RunSpec.from_wire(wire).grace == 3600
    with pytest.raises(SpecError, match="spec.grace must be at most 3600 seconds"):
        RunSpec.from_wire({**wire, "grace": 1_000_000_000})


# What an agent of the previous release sent as a run's status (RunStatus.to_wire, every field).
PREVIOUS_STATUS = {"job_id": 42, "attempt": 3, "rank": 1, "state": "ended", "pid": 77, "start_time": 10.0,
                   "end_time": 12.5, "exit_code": None, "signal": 15, "reason": "preempt", "killed": False,
                   "message": None}


def test_the_controller_reads_a_status_of_the_previous_release_and_ignores_newer_fields():
    status = RunStatus.from_wire({**PREVIOUS_STATUS, "a_field_from_a_newer_agent": [1, 2]})
    assert status.to_wire() == {**PREVIOUS_STATUS, "cpu_seconds": None, "mem_peak_kb": None} and status.ended
    usage = RunStatus.from_wire({**PREVIOUS_STATUS, "cpu_seconds": 12, "mem_peak_kb": 4096})
    assert (usage.cpu_seconds, usage.mem_peak_kb) == (12.0, 4096)
    running = RunStatus.from_wire({"job_id": 1, "attempt": 0, "rank": 0, "state": "running", "pid": 5,
                                   "start_time": 3})
    assert not running.ended and running.start_time == 3.0 and running.exit_code is None


@pytest.mark.parametrize("field,value,message", [
    ("job_id", "42", "status.job_id must be a non-negative integer"),
    ("attempt", -1, "status.attempt must be a non-negative integer"),
    ("rank", True, "status.rank must be a non-negative integer"),
    ("state", "exploded", "status.state must be running or ended"),
    ("exit_code", 0.5, "status.exit_code must be a 32-bit integer or nil"),
    ("end_time", "soon", "status.end_time must be a finite number"),
    # Tenth audit: these passed and failed only at the store (job ids 2^64, exit codes 2^100, NaN).
    ("job_id", 2**64, "status.job_id must be a non-negative integer that fits the store"),
    ("attempt", 2**31, "status.attempt must be a non-negative integer that fits the store"),
    ("exit_code", 2**100, "status.exit_code must be a 32-bit integer or nil"),
    ("pid", -2**40, "status.pid must be a 32-bit integer or nil"),
    ("start_time", float("nan"), "status.start_time must be a finite number"),
    ("end_time", float("inf"), "status.end_time must be a finite number"),
    ("end_time", 10**30, "status.end_time must be a finite number"),
    ("message", b"bytes", "status.message must be a string or nil"),
    ("cpu_seconds", -1.0, "status.cpu_seconds must be a non-negative number or nil"),
    ("cpu_seconds", float("nan"), "status.cpu_seconds must be a non-negative number or nil"),
    ("mem_peak_kb", "4096", "status.mem_peak_kb must be a non-negative number or nil"),
    ("mem_peak_kb", 2**60, "status.mem_peak_kb must be a non-negative number or nil"),
])
def test_a_malformed_status_is_refused_by_field(field, value, message):
    with pytest.raises(SpecError, match=message):
        RunStatus.from_wire({**PREVIOUS_STATUS, field: value})
    with pytest.raises(SpecError, match="must be a map"):
        RunStatus.from_wire([PREVIOUS_STATUS])


def test_a_status_is_cut_to_what_the_store_holds():
    status = RunStatus.from_wire({**PREVIOUS_STATUS, "reason": "x" * 100, "message": "m" * 100_000})
    assert len(status.reason) == 32 and len(status.message) == 65536
