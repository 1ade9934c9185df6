"""Job arrays and job ids as people type them (pure, no I/O).

    --array=0-7   1,3,5-9   0-15:4   0-15%2      (%N: at most N tasks running at once)
    12   12_4   12_[1-3,5]                       (a job or a whole array, one task, some tasks)

An array is one job row per task; the first task's job id is the array's id (Slurm's
ArrayJobId), so `12` names the whole array and `12_4` one task of it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

MAX_ID = 2**63 - 1  # the largest job id or task index the store's INTEGER columns hold
DEFAULT_MAX_ARRAY_SIZE = 1001  # Slurm's MaxArraySize: task indices 0..1000
_RANGE = re.compile(r"([0-9]+)(?:-([0-9]+)(?::([0-9]+))?)?")
_REF = re.compile(r"([0-9]+)(?:_(?:([0-9]+)|\[([0-9,\-:]+)\]))?")


class ArrayError(ValueError):
    """A bad --array value or job id; the text names the problem."""


@dataclass(frozen=True)
class ArraySpec:
    indices: tuple[int, ...]  # sorted, distinct
    limit: int | None = None  # %N: tasks of this array running at once

    @property
    def text(self) -> str:
        """The canonical spelling (stored with each task, shown by hcontrol)."""
        return format_indices(self.indices) + (f"%{self.limit}" if self.limit is not None else "")


def parse_indices(text: str, max_size: int | None = None) -> tuple[int, ...]:
    """'1,3,5-9', '0-15:4' -> sorted distinct indices, each below max_size when one is given."""
    if not text:
        raise ArrayError("no task indices given")
    found: set[int] = set()
    for item in text.split(","):
        m = _RANGE.fullmatch(item)
        if m is None:
            raise ArrayError(f"invalid task index or range {item!r} (expected N, N-M or N-M:STEP)")
        lo = int(m[1])
        hi = int(m[2]) if m[2] is not None else lo
        step = int(m[3]) if m[3] is not None else 1
        if hi > MAX_ID or step > MAX_ID:
            raise ArrayError(f"task index or step in {item!r} is too large")
        if hi < lo:
            raise ArrayError(f"invalid range {item!r}: the end is below the start")
        if step < 1:
            raise ArrayError(f"invalid step in {item!r}: it must be at least 1")
        if max_size is not None and hi >= max_size:
            raise ArrayError(f"task index {hi} is too large: max_array_size is {max_size} "
                             f"(indices 0-{max_size - 1})")
        if hi - lo > 10_000_000:  # without a configured bound, refuse before building the set
            raise ArrayError(f"range {item!r} is too large")
        found.update(range(lo, hi + 1, step))
    return tuple(sorted(found))


def parse_array(text: str, max_size: int | None = DEFAULT_MAX_ARRAY_SIZE) -> ArraySpec:
    """An --array value: indices, then an optional %LIMIT."""
    spec, pct, limit_text = text.partition("%")
    limit = None
    if pct:
        if not re.fullmatch(r"[0-9]+", limit_text) or not 1 <= int(limit_text) <= MAX_ID:
            raise ArrayError(f"invalid task limit %{limit_text}: expected a positive integer")
        limit = int(limit_text)
    return ArraySpec(parse_indices(spec, max_size), limit)


def format_indices(indices: Iterable[int]) -> str:
    """Sorted indices -> '0-3,7,9-10' (consecutive runs collapsed)."""
    parts: list[str] = []
    values = sorted(set(indices))
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        parts.append(str(values[i]) if i == j else f"{values[i]}-{values[j]}")
        i = j + 1
    return ",".join(parts)


@dataclass(frozen=True)
class JobRef:
    """What a job id on a command line names: a job (or whole array), or some tasks of an array."""
    job_id: int
    tasks: tuple[int, ...] | None = None

    def __str__(self) -> str:
        if self.tasks is None:
            return str(self.job_id)
        if len(self.tasks) == 1:
            return f"{self.job_id}_{self.tasks[0]}"
        return f"{self.job_id}_[{format_indices(self.tasks)}]"


def parse_job_ref(text: str) -> JobRef:
    m = _REF.fullmatch(text.strip())
    if m is None:
        raise ArrayError(f"Invalid job id specified: {text}")
    if any(g is not None and g.isdigit() and int(g) > MAX_ID for g in (m[1], m[2])):
        raise ArrayError(f"Invalid job id specified: {text}")
    if m[2] is not None:
        return JobRef(int(m[1]), (int(m[2]),))
    if m[3] is not None:
        try:
            return JobRef(int(m[1]), parse_indices(m[3]))
        except ArrayError as exc:
            raise ArrayError(f"Invalid job id specified: {text} ({exc})") from None
    return JobRef(int(m[1]))


def parse_job_refs(texts: Iterable[str]) -> list[JobRef]:
    """Command-line ids, comma lists allowed outside brackets ('12_[1,2],13')."""
    refs = []
    for text in texts:
        for item in re.findall(r"[^,\[]+(?:\[[^\]]*\])?", text):
            if item.strip():
                refs.append(parse_job_ref(item))
    return refs


def refs_to_wire(refs: Sequence[JobRef]) -> dict:
    """{'ids': [...], 'tasks': [[array id, task], ...]}, as the controller's API takes them."""
    ids = [r.job_id for r in refs if r.tasks is None]
    tasks = [[r.job_id, t] for r in refs if r.tasks is not None for t in r.tasks]
    return {k: v for k, v in (("ids", ids), ("tasks", tasks)) if v}


def job_label(job: Mapping) -> str:
    """'12_4' for a task of array 12, else the job id."""
    if job.get("array_job_id") is not None and job.get("array_task_id") is not None:
        return f"{job['array_job_id']}_{job['array_task_id']}"
    return str(job.get("id", job.get("job_id")))


def collapse_pending(jobs: Sequence[Mapping]) -> list[tuple[Mapping, str]]:
    """squeue's view of arrays: the pending tasks of an array that wait for the same reason are
    one row labelled '12_[3-7]' (at the place of the first); everything else is one row each."""
    groups: dict[tuple, list[Mapping]] = {}
    order: list[tuple] = []
    for j in jobs:
        if j.get("array_job_id") is not None and j.get("state") == "PENDING":
            key = ("array", j["array_job_id"], j.get("reason"))
        else:
            key = ("job", j.get("id"))
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(j)
    rows = []
    for key in order:
        members = groups[key]
        first = members[0]
        if key[0] == "array" and len(members) > 1:
            label = f"{first['array_job_id']}_[{format_indices(m['array_task_id'] for m in members)}]"
        else:
            label = job_label(first)
        rows.append((first, label))
    return rows
