"""What the controller asks the agent to run (RunSpec) and what the agent reports back (RunStatus).

The contract between the two daemons: the controller's dispatch builds a RunSpec, the agent
checks it. Both cross the wire as msgpack maps and sit in the spool as JSON. RunSpec.from_wire
checks every field, because the agent runs as root and must refuse what it does not understand
rather than half-run it. Fields added since the first release are optional on the wire and left
out when unset, so an agent and a controller one release apart still understand each other
(tests/unit/test_run_contract.py). Light imports only: the shepherd imports this on every start.
"""
from __future__ import annotations

import math
import os
import signal as _signal
from dataclasses import dataclass
from typing import Any, Mapping

from ..core.jobids import MAX_ID
from ..core.grace import MAX_GRACE_SECONDS
from ..core.runtimes import REFERENCE_RUNTIMES, RUNTIMES, needs_image

REASONS = ("cancel", "preempt", "requeue", "node_fail", "timeout", "launch_failed", "lost", "oom",
           "output_error")
TERMINATE_REASONS = ("cancel", "preempt", "node_fail", "requeue")


class SpecError(ValueError):
    """A field of a RunSpec (or of a request body) is missing, extra or of the wrong type."""


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _no_nul(where: str, s: str) -> str:
    # execve and open() cannot take NUL bytes; refuse them here instead of failing the launch
    if "\0" in s:
        raise SpecError(f"{where} contains a NUL character")
    return s


def _abs_path(where: str, v: Any) -> str:
    if not isinstance(v, str) or not v:
        raise SpecError(f"{where} must be a non-empty string")
    if not os.path.isabs(v):
        raise SpecError(f"{where} must be an absolute path, got {v!r}")
    return _no_nul(where, v)


def valid_signal(where: str, v: Any) -> int:
    if not _is_int(v) or not 1 <= v < _signal.NSIG:
        raise SpecError(f"{where} must be a signal number between 1 and {_signal.NSIG - 1}, got {v!r}")
    return v


def check_keys(where: str, body: Any, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict:
    """The body must be a map with exactly these keys (and maybe some of the optional ones)."""
    if not isinstance(body, dict):
        raise SpecError(f"{where} must be a map, got {type(body).__name__}")
    missing = [k for k in required if k not in body]
    if missing:
        raise SpecError(f"{where} lacks field(s): {', '.join(missing)}")
    extra = sorted(str(k) for k in body if k not in required and k not in optional)
    if extra:
        raise SpecError(f"{where} has unknown field(s): {', '.join(extra)}")
    return body


def nonneg_int(where: str, v: Any) -> int:
    if not _is_int(v) or v < 0:
        raise SpecError(f"{where} must be a non-negative integer, got {v!r}")
    return v


MAX_INT32 = 2**31 - 1  # what the store's 32-bit INTEGER columns (attempt, exit_code, ...) hold


@dataclass(frozen=True)
class RunSpec:
    job_id: int
    attempt: int
    rank: int
    user: str
    uid: int
    gid: int
    script: str
    script_args: tuple[str, ...]
    workdir: str
    stdout: str
    stderr: str | None
    environment: Mapping[str, str]
    time_limit: int | None
    signal: int | None
    signal_time: int
    grace: int
    checkpoint_dir: str | None
    # Isolation (optional on the wire, so a controller that predates them still works):
    runtime: str | None = None  # None: the node's default (agent config)
    container_image: str | None = None  # rootfs dir or tarball (absolute path) or, for podman, a reference
    mem_mb: int | None = None  # memory limit of the rank, MiB
    cpus: int | None = None  # CPU limit of the rank
    gpus: tuple[int, ...] = ()  # the node's GPU indices this rank owns
    umask: int = 0o022  # the submitter's umask, for the output files and all the job creates
    # A share of gpus[0] (core.sharing.GpuShare's fields); None: the GPUs are the rank's whole.
    gpu_share: Mapping[str, Any] | None = None
    # The run holds the job's place on a node other than the batch script's: its process is the
    # step server (hai_cluster.job.stepd) that starts the tasks of `srun` steps there.
    step_server: bool = False
    # Who gets `signal` signal_time s before the limit, by Slurm's --signal rule: "steps" (the
    # tasks of srun's steps, not the batch shell), "batch" (B:, the batch shell alone) or "job"
    # (every process: a script that runs on every node is its own step)
    warn_to: str = "job"
    # Open the output files with O_TRUNC (--open-mode); None: on the job's first run only
    truncate_output: bool | None = None

    @property
    def key(self) -> tuple[int, int]:
        return (self.job_id, self.attempt)

    @classmethod
    def from_wire(cls, d: Any) -> "RunSpec":
        names = tuple(f for f in cls.__dataclass_fields__)
        check_keys("spec", d, tuple(n for n in names if n not in OPTIONAL), optional=OPTIONAL)
        for k in ("job_id", "attempt", "rank", "uid", "gid", "signal_time", "grace"):
            nonneg_int(f"spec.{k}", d[k])
        if d["grace"] > MAX_GRACE_SECONDS:
            raise SpecError(f"spec.grace must be at most {MAX_GRACE_SECONDS} seconds, got {d['grace']}")
        if not isinstance(d["user"], str) or not d["user"]:
            raise SpecError("spec.user must be a non-empty string")
        _no_nul("spec.user", d["user"])
        script = d["script"]
        if not isinstance(script, str) or not script.startswith("#!"):
            raise SpecError("spec.script must be the script text, starting with #!")
        args = d["script_args"]
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise SpecError("spec.script_args must be a list of strings")
        for a in args:
            _no_nul("spec.script_args", a)
        env = d["environment"]
        if not isinstance(env, dict):
            raise SpecError("spec.environment must be a map of strings to strings")
        for k, v in env.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise SpecError("spec.environment must be a map of strings to strings")
            if not k or "=" in k:
                raise SpecError(f"spec.environment has an invalid variable name {k!r}")
            _no_nul(f"spec.environment[{k}]", k + v)
        tl = d["time_limit"]
        if tl is not None and (not _is_int(tl) or tl <= 0):
            raise SpecError(f"spec.time_limit must be a positive integer or null, got {tl!r}")
        if d["signal"] is not None:
            valid_signal("spec.signal", d["signal"])
        iso = _isolation(d)
        step_server = d.get("step_server", False)
        if not isinstance(step_server, bool):
            raise SpecError(f"spec.step_server must be a boolean, got {step_server!r}")
        warn_to = d.get("warn_to", "job")
        if warn_to not in WARN_TO:
            raise SpecError(f"spec.warn_to must be one of {', '.join(WARN_TO)}, got {warn_to!r}")
        truncate_output = d.get("truncate_output")
        if truncate_output is not None and not isinstance(truncate_output, bool):
            raise SpecError(f"spec.truncate_output must be a boolean or null, got {truncate_output!r}")
        umask = d.get("umask", 0o022)
        if not _is_int(umask) or not 0 <= umask <= 0o777:
            raise SpecError(f"spec.umask must be an integer between 0 and 0777, got {umask!r}")
        return cls(
            job_id=d["job_id"], attempt=d["attempt"], rank=d["rank"], user=d["user"],
            uid=d["uid"], gid=d["gid"], script=script, script_args=tuple(args),
            workdir=_abs_path("spec.workdir", d["workdir"]),
            stdout=_abs_path("spec.stdout", d["stdout"]),
            stderr=None if d["stderr"] is None else _abs_path("spec.stderr", d["stderr"]),
            environment=dict(env), time_limit=tl, signal=d["signal"], signal_time=d["signal_time"],
            grace=d["grace"],
            checkpoint_dir=None if d["checkpoint_dir"] is None
            else _abs_path("spec.checkpoint_dir", d["checkpoint_dir"]),
            umask=umask, step_server=step_server, warn_to=warn_to, truncate_output=truncate_output, **iso,
        )

    def to_wire(self) -> dict[str, Any]:
        # Field by field, not asdict(): that deep-copies each value (the whole environment) on
        # every start, a tenth of the agent's CPU per run; no field holds a dataclass.
        d = {name: getattr(self, name) for name in self.__dataclass_fields__}
        d["script_args"] = list(self.script_args)
        d["environment"] = dict(self.environment)
        d["gpus"] = list(self.gpus)
        if self.gpu_share is not None:
            d["gpu_share"] = dict(self.gpu_share)
        else:  # absent, as a controller that predates sharing sends it (and such an agent reads it)
            del d["gpu_share"]
        if not self.step_server:  # absent, as an older controller sends it
            del d["step_server"]
        if self.warn_to == "job":
            del d["warn_to"]
        if self.truncate_output is None:
            del d["truncate_output"]
        return d

    @property
    def truncates_output(self) -> bool:
        """Whether this run wipes its output files: --open-mode's choice, else the first run only."""
        return self.attempt == 0 if self.truncate_output is None else self.truncate_output


OPTIONAL = ("runtime", "container_image", "mem_mb", "cpus", "gpus", "umask", "gpu_share", "step_server", "warn_to",
            "truncate_output")
WARN_TO = ("job", "steps", "batch")


def _positive_or_none(where: str, v: Any) -> int | None:
    if v is not None and (not _is_int(v) or v <= 0):
        raise SpecError(f"{where} must be a positive integer or null, got {v!r}")
    return v


def _isolation(d: dict) -> dict[str, Any]:
    """The optional isolation fields of a spec, checked (absent ones take their defaults)."""
    runtime = d.get("runtime")
    if runtime is not None and runtime not in RUNTIMES:
        raise SpecError(f"spec.runtime must be one of {', '.join(RUNTIMES)} (or null for the node's "
                        f"default), got {runtime!r}")
    image = d.get("container_image")
    if image is not None:
        if runtime in REFERENCE_RUNTIMES:  # a registry reference or a path: the runtime resolves it
            if not isinstance(image, str) or not image:
                raise SpecError("spec.container_image must be a non-empty string")
            _no_nul("spec.container_image", image)
        else:
            _abs_path("spec.container_image", image)
        if runtime == "none":
            raise SpecError("spec.container_image needs a container runtime, not runtime none")
    elif needs_image(runtime):
        raise SpecError(f"spec.runtime {runtime} needs a container_image")
    gpus = d.get("gpus", [])
    if not isinstance(gpus, list) or not all(_is_int(g) and g >= 0 for g in gpus):
        raise SpecError(f"spec.gpus must be a list of GPU indices, got {gpus!r}")
    if len(set(gpus)) != len(gpus):
        raise SpecError(f"spec.gpus lists a GPU twice: {gpus!r}")
    return {"runtime": runtime, "container_image": image, "gpus": tuple(gpus), "gpu_share": _gpu_share(d, gpus),
            "mem_mb": _positive_or_none("spec.mem_mb", d.get("mem_mb")),
            "cpus": _positive_or_none("spec.cpus", d.get("cpus"))}


def _gpu_share(d: dict, gpus: list) -> dict[str, Any] | None:
    share = d.get("gpu_share")
    if share is None:
        return None
    check_keys("spec.gpu_share", share, ("fraction", "mem_mb", "compute", "qos"), ("mig",))
    if not isinstance(share.get("mig", ""), str):
        raise SpecError("spec.gpu_share.mig must be a MIG instance UUID")
    from ..core.sharing import GpuShare  # checks the values; light (pure core)
    try:
        GpuShare(**{k: v for k, v in share.items() if k != "mig"})
    except (TypeError, ValueError) as exc:
        raise SpecError(f"spec.gpu_share: {exc}") from None
    if len(gpus) != 1:
        raise SpecError("spec.gpu_share needs exactly one GPU in spec.gpus")
    return dict(share)


@dataclass
class RunStatus:
    job_id: int
    attempt: int
    rank: int
    state: str = "running"  # running | ended
    pid: int | None = None
    start_time: float = 0.0
    end_time: float | None = None
    exit_code: int | None = None  # None when the main process was killed by a signal
    signal: int | None = None  # the signal that killed the main process
    reason: str | None = None
    killed: bool = False  # SIGKILL was needed after the grace period
    message: str | None = None
    # what the run's cgroup was charged (agent/cgroups.py RunCgroup.usage); None: no cgroup
    cpu_seconds: float | None = None
    mem_peak_kb: int | None = None

    @classmethod
    def for_spec(cls, spec: RunSpec, **kw: Any) -> "RunStatus":
        return cls(job_id=spec.job_id, attempt=spec.attempt, rank=spec.rank, **kw)

    @property
    def ended(self) -> bool:
        return self.state == "ended"

    def to_wire(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}  # all scalars: no asdict copies

    @classmethod
    def ended_by(cls, job_id: int, attempt: int, rank: int, reason: str, message: str) -> "RunStatus":
        """The end the controller records for a rank no agent reports (lost, node down, refused)."""
        return cls(job_id=job_id, attempt=attempt, rank=rank, state="ended", reason=reason, message=message)

    @classmethod
    def from_wire(cls, d: Any) -> "RunStatus":
        """An agent's report of a run (start_run's reply, list_runs, hello, run_exited), checked
        field by field; fields a newer agent adds are ignored. Raises SpecError, naming the field."""
        if not isinstance(d, dict):
            raise SpecError(f"a run status must be a map, got {type(d).__name__}")
        for name in ("job_id", "attempt", "rank"):  # the store's BIGINT (job_id) and INTEGER columns
            if not _is_int(d.get(name)) or not 0 <= d[name] <= (MAX_ID if name == "job_id" else MAX_INT32):
                raise SpecError(f"status.{name} must be a non-negative integer that fits the store, "
                                f"got {str(d.get(name))[:40]!r}")
        state = d.get("state", "running")
        if state not in ("running", "ended"):
            raise SpecError(f"status.state must be running or ended, got {state!r}")
        for name in ("pid", "exit_code", "signal"):
            if d.get(name) is not None and not (_is_int(d[name]) and -MAX_INT32 - 1 <= d[name] <= MAX_INT32):
                raise SpecError(f"status.{name} must be a 32-bit integer or nil, got {str(d[name])[:40]!r}")
        for name in ("start_time", "end_time"):
            v = d.get(name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                                  or not math.isfinite(v) or abs(v) > MAX_ID):
                raise SpecError(f"status.{name} must be a finite number, got {str(v)[:40]!r}")
        for name in ("reason", "message"):
            if d.get(name) is not None and not isinstance(d[name], str):
                raise SpecError(f"status.{name} must be a string or nil, got {type(d[name]).__name__}")
        for name, most in (("cpu_seconds", 1e12), ("mem_peak_kb", 2 ** 53)):  # an older agent: absent
            v = d.get(name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                                  or not math.isfinite(v) or not 0 <= v <= most):
                raise SpecError(f"status.{name} must be a non-negative number or nil, got {str(v)[:40]!r}")
        return cls(job_id=d["job_id"], attempt=d["attempt"], rank=d["rank"], state=state, pid=d.get("pid"),
                   start_time=float(d.get("start_time") or 0.0),
                   end_time=None if d.get("end_time") is None else float(d["end_time"]),
                   exit_code=d.get("exit_code"), signal=d.get("signal"),
                   # the store's columns: a reason of REASONS (32 characters), a message of 64 KiB
                   reason=None if d.get("reason") is None else d["reason"][:32],
                   killed=bool(d.get("killed")),
                   message=None if d.get("message") is None else d["message"][:65536],
                   cpu_seconds=None if d.get("cpu_seconds") is None else float(d["cpu_seconds"]),
                   mem_peak_kb=None if d.get("mem_peak_kb") is None else int(d["mem_peak_kb"]))

    @classmethod
    def from_disk(cls, d: Any) -> "RunStatus":
        """Read a status.json (always a final status); raises SpecError if it is not one of ours."""
        st = cls.from_wire(d)
        if st.state != "ended" or (st.reason is not None and st.reason not in REASONS):
            raise SpecError(f"status has state {st.state!r} / reason {st.reason!r}")
        return st
