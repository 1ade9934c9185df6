"""Output file name patterns, as sbatch's -o/-e take them (pure, no I/O).

    %j job id        %x job name       %u user         %N node (the batch host)
    %r restart count (ours; Slurm has none)             %J job id (Slurm: jobid.stepid)
    %A array job id (the job id outside an array)       %a array task id      %% a '%'
and, in srun's -o/-e (a job step's):
    %s step id       %t task id (rank)  %n node id in the step   %J job id.step id

A number between '%' and the letter zero-pads numeric fields ("%4j" -> 0042), at most 10
wide; it is ignored for text fields. An unknown letter is left as it is, '%' included. A
backslash anywhere turns all of this off and is itself removed, as in Slurm.
"""
from __future__ import annotations

import posixpath
import re

DEFAULT_OUTPUT = "slurm-%j.out"  # sbatch's defaults: -o unset (and -e unset: the same file)
DEFAULT_ARRAY_OUTPUT = "slurm-%A_%a.out"

NO_VAL = 4294967294  # what Slurm prints for %a when the job is not part of an array
_MAX_WIDTH = 10
_TOKEN = re.compile(r"%(?:%|([0-9]*)([A-Za-z]))")


def expand_output_pattern(pattern: str, *, job_id: int, job_name: str, user: str, node: str,
                          restart_count: int, array_job_id: int | None = None,
                          array_task_id: int | None = None, step_id: int | None = None,
                          task: int | None = None, node_index: int | None = None) -> str:
    if "\\" in pattern:
        return pattern.replace("\\", "")
    numbers = {
        "j": job_id, "J": job_id, "r": restart_count,
        "A": job_id if array_job_id is None else array_job_id,
        "a": NO_VAL if array_task_id is None else array_task_id,
    }
    texts = {"x": job_name, "u": user, "N": node}
    for letter, value in (("s", step_id), ("t", task), ("n", node_index)):
        if value is not None:
            numbers[letter] = value
    if step_id is not None:
        texts["J"] = f"{job_id}.{step_id}"
        del numbers["J"]

    def replace(m: re.Match[str]) -> str:
        width, letter = m.group(1), m.group(2)
        if letter is None:  # "%%"
            return "%"
        if letter in numbers:  # a width of more digits than _MAX_WIDTH has is _MAX_WIDTH: never int()
            # a 4,400-digit one (int() refuses past 4,300 digits; the job's dispatch failed forever)
            pad = _MAX_WIDTH if len(width) > 2 else min(int(width or 0), _MAX_WIDTH)
            return str(numbers[letter]).zfill(pad)
        if letter in texts:
            return texts[letter]
        return m.group(0)

    return _TOKEN.sub(replace, pattern)


def resolve_output_path(pattern: str | None, workdir: str, *, job_id: int, job_name: str,
                        user: str, node: str, restart_count: int,
                        array_job_id: int | None = None,
                        array_task_id: int | None = None) -> str:
    """The absolute, normalized file a job's stream goes to. None means sbatch's default
    "slurm-%j.out" ("slurm-%A_%a.out" for an array's task); "none" (any case) means /dev/null;
    relative paths start at workdir."""
    if pattern is None:
        pattern = DEFAULT_OUTPUT if array_task_id is None else DEFAULT_ARRAY_OUTPUT
    elif pattern.lower() == "none":
        return "/dev/null"
    if not posixpath.isabs(workdir):
        raise ValueError(f"workdir must be an absolute path, got {workdir!r}")
    path = expand_output_pattern(pattern, job_id=job_id, job_name=job_name, user=user,
                                 node=node, restart_count=restart_count,
                                 array_job_id=array_job_id, array_task_id=array_task_id)
    return posixpath.normpath(posixpath.join(workdir, path))
