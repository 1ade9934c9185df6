"""The messages of job steps, checked field by field wherever they arrive (protocol/runspec.py's
helpers). Their path (agent/steps.py has the picture):

    srun --step_create--> agent --step_create--> controller --step_start--> agent --start--> step server
    tasks' output and ends: step server --step_output/step_exit--> agent --> controller --> srun's agent --> srun

Every body names its job, and a task's output names its step and task, so that each hop only
forwards what it was sent to the one it belongs to.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core.steps import StepIO, StepRequest
from .runspec import SpecError, check_keys, nonneg_int, valid_signal

MAX_ARGV = 4096  # arguments of a step's command
MAX_ENV = 4096  # variables of srun's environment
MAX_OUTPUT_CHUNK = 256 * 1024  # bytes of one task's output in one message
MAX_INPUT_CHUNK = 64 * 1024  # bytes of a client's stdin in one message
MAX_WINDOW = 10_000  # rows or columns of a terminal
STREAMS = ("out", "err")
REQUEST_FIELDS = ("nodes", "ntasks", "ntasks_per_node", "cpus_per_task", "gpus_per_task", "nodelist", "exclude")


def _pos_or_none(where: str, v: Any) -> int | None:
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= 1_000_000:
        raise SpecError(f"{where} must be a positive count or null, got {v!r}")
    return v


def _names(where: str, v: Any) -> tuple[str, ...]:
    if not isinstance(v, list) or len(v) > 10_000 or not all(isinstance(n, str) and 0 < len(n) <= 255 for n in v):
        raise SpecError(f"{where} must be a list of node names")
    return tuple(v)


def step_request(d: Any) -> StepRequest:
    check_keys("step request", d, REQUEST_FIELDS, ("overcommit",))  # optional: older sruns lack it
    if not isinstance(d.get("overcommit", False), bool):
        raise SpecError("overcommit must be true or false")
    return StepRequest(nodes=_pos_or_none("nodes", d["nodes"]), ntasks=_pos_or_none("ntasks", d["ntasks"]),
                       ntasks_per_node=_pos_or_none("ntasks_per_node", d["ntasks_per_node"]),
                       cpus_per_task=_pos_or_none("cpus_per_task", d["cpus_per_task"]),
                       gpus_per_task=_pos_or_none("gpus_per_task", d["gpus_per_task"]),
                       nodelist=_names("nodelist", d["nodelist"]), exclude=_names("exclude", d["exclude"]),
                       overcommit=d.get("overcommit", False))


def request_to_wire(r: StepRequest) -> dict:
    return {"nodes": r.nodes, "ntasks": r.ntasks, "ntasks_per_node": r.ntasks_per_node,
            "cpus_per_task": r.cpus_per_task, "gpus_per_task": r.gpus_per_task,
            "nodelist": list(r.nodelist), "exclude": list(r.exclude), "overcommit": r.overcommit}


def command(d: dict) -> tuple[list[str], str, dict[str, str]]:
    """A step's argv, working directory and environment (srun's)."""
    argv, cwd, env = d["argv"], d["cwd"], d["env"]
    if not isinstance(argv, list) or not argv or len(argv) > MAX_ARGV or not all(
            isinstance(a, str) and "\0" not in a for a in argv) or not argv[0]:
        raise SpecError("argv must be a non-empty list of strings without NUL characters")
    if not isinstance(cwd, str) or not cwd.startswith("/") or "\0" in cwd:
        raise SpecError("cwd must be an absolute path")
    if not isinstance(env, dict) or len(env) > MAX_ENV:
        raise SpecError(f"env must be a map of at most {MAX_ENV} variables")
    for k, v in env.items():
        if not isinstance(k, str) or not isinstance(v, str) or not k or "=" in k or "\0" in k + v:
            raise SpecError("env must map variable names to strings without NUL characters")
    return argv, cwd, env


def output(d: Any, *extra: str) -> tuple[int, int, int, str, bytes]:
    """(job, step, task, stream, data) of a task's output. `seq` numbers a task's messages from 0:
    one sent again after an agent's restart is told apart (srun drops what it had)."""
    check_keys("step output", d, ("job_id", "step_id", "task", "seq", "stream", "data", *extra))
    nonneg_int("seq", d["seq"])
    if d["stream"] not in STREAMS:
        raise SpecError(f"stream must be one of {', '.join(STREAMS)}")
    if not isinstance(d["data"], bytes) or len(d["data"]) > MAX_OUTPUT_CHUNK:
        raise SpecError(f"data must be at most {MAX_OUTPUT_CHUNK} bytes")
    return (nonneg_int("job_id", d["job_id"]), nonneg_int("step_id", d["step_id"]), nonneg_int("task", d["task"]),
            d["stream"], d["data"])


def task_exit(d: Any, *extra: str) -> tuple[int, int, int, int | None, int | None]:
    """(job, step, task, exit code, signal) of a task's end."""
    check_keys("step exit", d, ("job_id", "step_id", "task", "exit_code", "signal", *extra))
    code, sig = d["exit_code"], d["signal"]
    if code is not None and (not isinstance(code, int) or isinstance(code, bool) or not 0 <= code <= 255):
        raise SpecError("exit_code must be 0-255 or null")
    if sig is not None:
        valid_signal("signal", sig)
    return nonneg_int("job_id", d["job_id"]), nonneg_int("step_id", d["step_id"]), nonneg_int("task", d["task"]), code, sig


def step_io(d: Any) -> StepIO:
    """A client step's -i/--pty/-u (core.steps.StepIO); None: the defaults."""
    if d is None:
        return StepIO()
    check_keys("step io", d, ("input", "pty", "rows", "cols", "unbuffered"))
    inp = d["input"]
    if inp not in ("all", "none") and not (isinstance(inp, int) and not isinstance(inp, bool) and 0 <= inp < 1_000_000):
        raise SpecError(f"input must be 'all', 'none' or a task id, got {inp!r}")
    for k in ("pty", "unbuffered"):
        if not isinstance(d[k], bool):
            raise SpecError(f"{k} must be true or false")
    for k in ("rows", "cols"):
        if not isinstance(d[k], int) or isinstance(d[k], bool) or not 1 <= d[k] <= MAX_WINDOW:
            raise SpecError(f"{k} must be between 1 and {MAX_WINDOW}")
    return StepIO(inp, d["pty"], d["rows"], d["cols"], d["unbuffered"])


def window(d: Any) -> tuple[int, int]:
    """(rows, cols) of a terminal's new size."""
    rows, cols = d.get("rows"), d.get("cols")
    for k, v in (("rows", rows), ("cols", cols)):
        if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= MAX_WINDOW:
            raise SpecError(f"{k} must be between 1 and {MAX_WINDOW}")
    return rows, cols


def stdin_chunk(d: Any) -> tuple[bytes, bool]:
    """(data, eof) of a client's stdin message."""
    data, eof = d.get("data"), d.get("eof")
    if not isinstance(data, bytes) or len(data) > MAX_INPUT_CHUNK:
        raise SpecError(f"data must be at most {MAX_INPUT_CHUNK} bytes")
    if not isinstance(eof, bool):
        raise SpecError("eof must be true or false")
    return data, eof


# -- sattach on a batch job's step: srun's own node's tasks' output, copied to the controller --

MAX_TEE_EVENTS = 1024  # events of one step_tee_data message (or of srun's replay)
MAX_TEE_BYTES = 256 * 1024  # output bytes of one such message (srun sends smaller batches)


@dataclass(frozen=True)
class TeeEvent:
    """A task's output chunk or end, as srun copies it for sattach; `at`: when srun read it
    (seconds since the epoch), to interleave a replay with the other nodes' output."""
    kind: str  # "output" or "exit"
    at: float
    message: dict  # the event as the attacher gets it: step_id, task, and seq/stream/data or exit_code/signal

    def to_wire(self) -> dict:
        return {"kind": self.kind, "at": self.at, **{k: v for k, v in self.message.items() if k != "step_id"}}


def tee_events(d: Any, step_id: int) -> list[TeeEvent]:
    """The events of srun's copy of its own tasks' output (`step_tee` reply, `step_tee_data`)."""
    if not isinstance(d, list) or len(d) > MAX_TEE_EVENTS:
        raise SpecError(f"events must be a list of at most {MAX_TEE_EVENTS}")
    events, total = [], 0
    for e in d:
        if not isinstance(e, dict) or e.get("kind") not in ("output", "exit"):
            raise SpecError("each event must be a map with kind 'output' or 'exit'")
        at = e.get("at")
        if not isinstance(at, (int, float)) or isinstance(at, bool) or not 0 <= at < 1e11:
            raise SpecError("at must be a time in seconds")
        body = {k: v for k, v in e.items() if k not in ("kind", "at")}
        if e["kind"] == "output":
            _, _, task, stream, data = output({**body, "job_id": 0, "step_id": step_id})
            total += len(data)
            message = {"step_id": step_id, "task": task, "seq": body["seq"], "stream": stream, "data": data}
        else:
            _, _, task, code, sig = task_exit({**body, "job_id": 0, "step_id": step_id})
            message = {"step_id": step_id, "task": task, "exit_code": code, "signal": sig}
        events.append(TeeEvent(e["kind"], float(at), message))
    if total > MAX_TEE_BYTES:
        raise SpecError(f"events carry more than {MAX_TEE_BYTES} bytes of output")
    return events
