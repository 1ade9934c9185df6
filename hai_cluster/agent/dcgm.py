"""dcgm-exporter's job mapping (its --hpc-job-mapping-dir): one file per GPU index on this node,
holding the ids of the jobs on that GPU, one a line, so that a lab's DCGM dashboards label each
GPU's series with its job (the `hpc_job` label). Written by the agent as runs come and go
(agent.toml `[telemetry] dcgm_job_mapping_dir`; off by default).

The directory is the agent's (root's, not writable by others: safefs refuses one that is), 0755
so that the exporter may read it; each file is replaced whole (written aside, then renamed), so
the exporter never reads half of one. Files of GPUs no job holds are removed."""
from __future__ import annotations

import logging
import os
from typing import Iterable

from ..safefs import UnsafePath, create_file, open_private_dir

log = logging.getLogger(__name__)


class JobMapping:
    def __init__(self, path: str) -> None:
        self.path = path
        self.fd: int | None = None
        self.written: dict[str, bytes] = {}  # file name (GPU index) -> its content

    def open(self) -> None:
        self.fd, _ = open_private_dir(self.path, create=True)
        os.fchmod(self.fd, 0o755)
        for name in os.listdir(self.fd):  # a previous agent's files: its runs are re-read anyway
            if name.isdigit() or name.startswith(".tmp-"):
                os.unlink(name, dir_fd=self.fd)

    def update(self, runs: Iterable) -> None:
        """The files for these live runs (each with job_id and gpus): only those that change."""
        if self.fd is None:
            return
        jobs: dict[str, set[int]] = {}
        for r in runs:
            for g in r.gpus:
                jobs.setdefault(str(g), set()).add(r.job_id)
        want = {g: "".join(f"{j}\n" for j in sorted(ids)).encode() for g, ids in jobs.items()}
        try:
            for name in set(self.written) - set(want):
                os.unlink(name, dir_fd=self.fd)
                del self.written[name]
            for name, data in want.items():
                if self.written.get(name) != data:
                    os.close(create_file(self.fd, f".tmp-{name}", data, mode=0o644, replace=True))
                    os.replace(f".tmp-{name}", name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
                    self.written[name] = data
        except OSError as exc:  # a full disk must not stop the telemetry; the next change tries again
            log.warning("dcgm job mapping in %s not written: %s", self.path, exc)
            self.written.clear()

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def open_mapping(path: str) -> JobMapping | None:
    """The mapping at `path` ("" = off), or None with an error logged if the directory is unsafe."""
    if not path:
        return None
    mapping = JobMapping(path)
    try:
        mapping.open()
    except (UnsafePath, OSError) as exc:
        log.error("telemetry.dcgm_job_mapping_dir %s cannot be used (%s): no DCGM job mapping", path, exc)
        return None
    return mapping
