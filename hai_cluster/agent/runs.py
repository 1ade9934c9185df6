"""The agent's table of runs, rebuilt from the spool at start and kept in step with it.

The spool is the truth: a run is ended once its status.json exists (the shepherd writes it, or the
agent when the shepherd vanished: reason "lost"). The table only caches it and remembers which
ended runs were already reported, so each end is pushed once per agent lifetime; hello/list_runs
keep reporting it until the controller forgets the run.
"""
from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import launcher, spool
from .isolation import NodeIsolation
from ..protocol.runspec import RunSpec, RunStatus
from .starter import ShepherdStarter

log = logging.getLogger(__name__)

Key = tuple[int, int]


class RunError(Exception):
    """A request about a run that cannot be honoured (message meant for the controller)."""


@dataclass
class Run:
    dir: Path
    spec: RunSpec | None  # None only for a spool entry whose spec.json is unreadable
    status: RunStatus
    shepherd_pid: int | None = None
    launching: asyncio.Task | None = None  # set while the shepherd's launch report is awaited


def _read_spec(run_dir: Path) -> RunSpec | None:
    try:
        return RunSpec.from_wire(spool.read_json(run_dir / spool.SPEC))
    except (ValueError, OSError) as exc:
        log.error("%s: unreadable spec: %s", run_dir, exc)
        return None


def retrieved(task: asyncio.Task) -> None:
    """Mark a start's error as seen: its caller may have hung up and left it unawaited."""
    if not task.cancelled():
        task.exception()


class RunTable:
    def __init__(self, spool_dir: str, launch_timeout: float, node: NodeIsolation | None = None,
                 starter: ShepherdStarter | None = None) -> None:
        self.root = spool.runs_dir(spool_dir)
        self.launch_timeout = launch_timeout
        self.node = node
        self.starter = starter
        self.runs: dict[Key, Run] = {}
        # A thread per uid for `prepare` (a GPU share's MPS daemon): it runs the user's control
        # program, which the user can stop; their runs then wait behind their own, not in the
        # shared pool every other user's share needs too (fifth audit).
        self._prepare_threads: dict[int, ThreadPoolExecutor] = {}
        # Set when a shepherd exits: the spool watch looks at once instead of at its next poll.
        self.exited = asyncio.Event()

    def setup(self) -> None:
        """Create the spool; the job's user must be able to traverse it to reach its script."""
        self.root.mkdir(parents=True, exist_ok=True)
        for d in (self.root.parent, self.root):
            os.chmod(d, 0o711)
        for d in self.root.parents:
            if d.stat().st_mode & 0o001 == 0:
                log.warning("%s is not searchable by others: jobs will fail to exec their script", d)

    def rebuild(self) -> None:
        for entry in sorted(os.listdir(self.root)):
            key = spool.parse_run_dir_name(entry)
            run_dir = self.root / entry
            if key is None or not run_dir.is_dir():
                continue  # temp files, strays: not ours to judge
            spec = _read_spec(run_dir)
            status = launcher.read_status(run_dir)
            shepherd = None
            if status is None:
                shepherd = spool.find_shepherd(run_dir)
                status = self._running_status(run_dir, spec, key) if shepherd else None
            if status is None:
                status = launcher.declare_dead(run_dir, spec, "lost", "no shepherd and no status found "
                                               "at agent start")
            self.runs[key] = Run(run_dir, spec, status, shepherd)
        running = sum(1 for r in self.runs.values() if not r.status.ended)
        log.info("spool: %d run(s), %d running", len(self.runs), running)

    def _running_status(self, run_dir: Path, spec: RunSpec | None, key: Key) -> RunStatus | None:
        job = launcher.job_record(run_dir)
        rank = spec.rank if spec else 0
        pid = job.get("pid") if isinstance(job.get("pid"), int) else None
        return RunStatus(job_id=key[0], attempt=key[1], rank=rank, state="running", pid=pid,
                         start_time=job.get("start_time") or time.time())

    def statuses(self) -> list[dict]:
        return [r.status.to_wire() for _, r in sorted(self.runs.items())]

    def get(self, key: Key) -> Run | None:
        return self.runs.get(key)

    async def start(self, spec: RunSpec,
                    prepare: Callable[[RunSpec], RunSpec] | None = None) -> tuple[bool, RunStatus]:
        """Start the run unless the table has it. `prepare` (run on a thread) completes the spec
        first: the GPU share's MPS daemon and environment. The run is in the table before it
        runs, so the agent's idle-daemon cleanup, which spares the daemons of the runs in the
        table, counts it as a user of its daemon from then on."""
        run = self.runs.get(spec.key)
        if run is not None:  # idempotent: the same (job, attempt) is never started twice
            if run.launching is not None:
                await asyncio.shield(run.launching)  # the first call's error, if it failed, is ours too
            return False, run.status
        run_dir = self.root / spool.run_dir_name(spec.job_id, spec.attempt)
        run = Run(run_dir, spec, RunStatus.for_spec(spec, state="running", start_time=time.time()))
        self.runs[spec.key] = run  # before any await: a concurrent duplicate finds it
        # a task of its own: a controller that hangs up mid-call must not abort the bookkeeping
        run.launching = asyncio.ensure_future(self._start(run, prepare))
        run.launching.add_done_callback(retrieved)
        await asyncio.shield(run.launching)
        return True, run.status

    async def _start(self, run: Run, prepare: Callable[[RunSpec], RunSpec] | None) -> None:
        """Prepare the run and launch its shepherd; a run that cannot be prepared leaves the
        table with the error (its caller's), one whose shepherd fails ends as launch_failed."""
        try:
            if prepare is not None:
                pool = self._prepare_threads.get(run.spec.uid)
                if pool is None:
                    pool = self._prepare_threads[run.spec.uid] = ThreadPoolExecutor(
                        1, thread_name_prefix=f"prepare-{run.spec.uid}")
                run.spec = await asyncio.get_running_loop().run_in_executor(pool, prepare, run.spec)
            try:
                launcher.prepare(run.dir, run.spec, self.node)
            except OSError as exc:
                if not isinstance(exc, FileExistsError):  # never delete a dir this call did not make
                    shutil.rmtree(run.dir, ignore_errors=True)
                raise RunError(f"cannot prepare the run directory {run.dir}: {exc}") from None
        except BaseException:
            del self.runs[run.spec.key]
            run.launching = None
            raise
        await self._launch(run)

    async def _launch(self, run: Run) -> None:
        try:
            run.status, run.shepherd_pid = await launcher.launch(run.dir, run.spec, self.launch_timeout,
                                                                    self.starter)
            if run.shepherd_pid is not None:
                self._watch_exit(run.shepherd_pid)
        except Exception as exc:
            log.exception("job %s.%s: starting the shepherd failed", run.spec.job_id, run.spec.attempt)
            run.status = launcher.declare_dead(run.dir, run.spec, "launch_failed",
                                               f"cannot start the shepherd: {exc}")
        finally:
            run.launching = None

    def _watch_exit(self, pid: int) -> None:
        """Wake the spool watch when this shepherd exits (its pidfd becomes readable), so that an
        end is reported within milliseconds, not at the next poll. Only a wake-up: the spool
        stays the truth, and without pidfds (or for a reused pid) the poll finds the end as before."""
        loop = asyncio.get_running_loop()
        try:
            fd = os.pidfd_open(pid)
        except (AttributeError, OSError):  # no pidfd here, or the shepherd is gone already
            self.exited.set()
            return

        def exited() -> None:
            loop.remove_reader(fd)
            os.close(fd)
            self.exited.set()
        loop.add_reader(fd, exited)

    def terminate(self, key: Key, reason: str) -> bool:
        run = self.runs.get(key)
        if run is None:
            return False
        if not run.status.ended:
            launcher.request_terminate(run.dir, reason)
        return True

    def idle_notice(self, key: Key, notice: dict | None) -> bool:
        """Write (or with None, remove) the run's idle warning in its control dir."""
        run = self.runs.get(key)
        if run is None or run.status.ended:
            return False
        return spool.write_idle_notice(run.dir / spool.CONTROL, notice)

    def signal(self, key: Key, sig: int) -> bool:
        run = self.runs.get(key)
        if run is None or run.status.ended:
            return False
        return launcher.signal_job(run.dir, sig)

    def forget(self, key: Key) -> bool:
        run = self.runs.get(key)
        if run is None:
            return False
        if not run.status.ended:
            raise RunError(f"run {key[0]}.{key[1]} has not ended; terminate it and wait for its status")
        shutil.rmtree(run.dir, ignore_errors=True)
        if run.dir.exists():
            raise RunError(f"cannot remove {run.dir}")
        del self.runs[key]
        return True

    def poll(self) -> list[RunStatus]:
        """Runs that ended since the last poll. Cheap: a stat per running run, plus a /proc read
        of its shepherd."""
        ended = []
        for run in self.runs.values():
            if run.status.ended or run.launching is not None:
                continue
            status = launcher.read_status(run.dir)
            if status is None and not self._shepherd_alive(run):
                # it may have written its status and exited between our two looks
                status = launcher.read_status(run.dir) or launcher.declare_dead(
                    run.dir, run.spec, "lost", "the shepherd died without recording the job's end")
            if status is None:
                if run.status.pid is None:  # the launch was not confirmed: pick up the pid later
                    pid = launcher.job_record(run.dir).get("pid")
                    run.status.pid = pid if isinstance(pid, int) else None
                continue
            run.status = status
            ended.append(status)
        return ended

    def _shepherd_alive(self, run: Run) -> bool:
        if run.shepherd_pid is not None and spool.is_shepherd(run.shepherd_pid, run.dir):
            return True
        run.shepherd_pid = spool.find_shepherd(run.dir)
        return run.shepherd_pid is not None

