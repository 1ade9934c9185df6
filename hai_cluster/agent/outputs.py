"""Whether a job can write its output: checked by the shepherd while the job runs and when it ends.

The job writes its stdout/stderr files itself (they are its fds 1 and 2), so a write that failed
with ENOSPC is seen only by the job (which may well exit 0 regardless). What the shepherd can see
cheaply is the file system: one statvfs every few seconds. When the file system of an output file
has no space left for the user (while the job runs, on consecutive looks; or at the job's end), the
run fails with reason output_error and says so, instead of looking COMPLETED with its output cut
short. (Opening the files is checked at launch: a permission
error there fails the launch with the path and the error.)"""
from __future__ import annotations

import os
import stat
from typing import Iterable


def output_problem(paths: Iterable[str | None]) -> str | None:
    for path in dict.fromkeys(p for p in paths if p):
        try:
            # The path is the user's (the shepherd is root): an O_PATH fd, not through a final
            # symlink, opens nothing and waits for no FIFO; it is looked at only if regular.
            fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):  # /dev/null, a pipe, a terminal, a symlink
                continue
            fs = os.fstatvfs(fd)
        except OSError:
            continue
        finally:
            os.close(fd)
        if fs.f_blocks > 0 and fs.f_bavail == 0:
            return f"writing job output {path} failed: No space left on device (its file system is full)"
    return None
