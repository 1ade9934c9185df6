"""Where srun puts its tasks' output, as Slurm's srun -o/-e (--output/--error) say:

    (unset) or "all"   srun's own stdout (stderr)
    "none"             nowhere
    N (a task id)      only task N's, to srun's own
    a file pattern     files: %t one per task, %n/%N one per node, else one for all
                       (%j %J %s %u %x %A %a %N %n %t, core/patterns.py)

-e unset follows -o, as in Slurm. Files are opened by srun itself, as the user, on srun's node,
where every task's output arrives (the nodes need share no file system); --open-mode=append
adds to them, truncate (the default) empties them first."""
from __future__ import annotations

import os
import posixpath
import pwd
from typing import BinaryIO, Mapping

from ..core.patterns import expand_output_pattern
from ..core.steps import StepLayout

OPEN_MODES = ("truncate", "append")


class SinkError(Exception):
    """An output file srun cannot open: srun's error text."""


def _int(env: Mapping[str, str], name: str) -> int | None:
    v = env.get(name, "")
    return int(v) if v.isdigit() else None


class Sinks:
    def __init__(self, out: BinaryIO, err: BinaryIO) -> None:
        self.std = {"out": out, "err": err}
        self.by_task: dict[tuple[int, str], BinaryIO | None] = {}  # unset: srun's own
        self.files: list[BinaryIO] = []
        self.dropping = False  # the step failed before it began: what its tasks print goes nowhere

    def target(self, procid: int, stream: str) -> BinaryIO | None:
        if self.dropping:
            return None
        return self.by_task.get((procid, stream), self.std[stream])

    def route(self, layout: StepLayout, output: str | None, error: str | None, open_mode: str | None,
              cwd: str, env: Mapping[str, str]) -> None:
        """Set each task's streams from -o/-e; SinkError (and no file left open) if one cannot be."""
        append = (open_mode or "truncate").lower() == "append"
        opened: dict[str, BinaryIO] = {}
        routes = {}
        try:
            for stream, spec in (("out", output), ("err", error if error is not None else output)):
                if spec is None or spec.lower() == "all":
                    continue
                for t in layout.tasks:
                    routes[(t.procid, stream)] = self._sink(spec, layout, t, stream, append, cwd, env, opened)
        except SinkError:
            self.dropping = True
            for f in opened.values():
                f.close()
            raise
        self.by_task, self.files = routes, list(opened.values())

    def _sink(self, spec: str, layout: StepLayout, task, stream: str, append: bool, cwd: str,
              env: Mapping[str, str], opened: dict[str, BinaryIO]) -> BinaryIO | None:
        if spec.lower() == "none":
            return None
        if spec.isdigit():
            return self.std[stream] if int(spec) == task.procid else None
        path = expand_output_pattern(
            spec, job_id=layout.job_id, job_name=env.get("SLURM_JOB_NAME", ""), user=_user(),
            node=layout.nodes[task.node], restart_count=_int(env, "SLURM_RESTART_COUNT") or 0,
            array_job_id=_int(env, "SLURM_ARRAY_JOB_ID"), array_task_id=_int(env, "SLURM_ARRAY_TASK_ID"),
            step_id=layout.step_id, task=task.procid, node_index=task.node)
        path = posixpath.normpath(posixpath.join(cwd, path))
        if path not in opened:
            flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | (os.O_APPEND if append else os.O_TRUNC)
            try:
                opened[path] = os.fdopen(os.open(path, flags, 0o666), "ab")
            except OSError as exc:
                what = "stdout" if stream == "out" else "stderr"
                raise SinkError(f"Could not open {what} file: {exc.strerror}") from None  # Slurm 22.05's words
        return opened[path]

    def close(self) -> None:
        for f in self.files:
            try:
                f.close()
            except OSError:
                pass


def _user() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())
