"""Runtime `bwrap` (bubblewrap), run as the user (unprivileged user namespace).

The root is the host's `/` or the image, read-only; fresh /proc, a minimal /dev (null, zero,
full, random, urandom, tty, pts, shm) plus the rank's GPU device nodes; a private /tmp; the job's
directories bound at their host paths. New PID, IPC and UTS namespaces: bwrap's own PID 1 reaps
and waits for every process, and the outer bwrap exits with the job script's status as soon as the
script ends (128+N if it died of signal N).

The job's processes share the outer bwrap's process group, so the shepherd's signals reach all of
them; not the outer bwrap itself, which has no handlers and would die of them (signal_main=False):
it must live on to report the script's exit status. No --die-with-parent: when the script dies of
the preempt signal, the rest of the job
(say Python still writing its checkpoint) must keep its grace period, exactly as without a
container. The shepherd kills what is left (process group and cgroup) when the run ends.

bwrap resolves the job's bind sources itself, as the user: they need no stage points. The image
(the overlay's lower layer, mounted by root in the job child) does: runtimes.Staged.

Setup failures: bwrap exits 1 both when it could not set up the sandbox and when the job exited
1; its --json-status-fd tells them apart (an "exit-code" record only once the job ran). That fd
is a pipe whose read end only the shepherd holds, not a file the user could write: a user could
otherwise turn their job's exit 1 into a "setup failure" that quotes their output file in the
job's reason. Anything the job adds to the pipe can only add records, never remove bwrap's.
"""
from __future__ import annotations

import os

from . import Context, Launch, MountPlan, Overlay, Runtime, RuntimeRefused
from .common import container_env, gpu_devices, image_rootfs, job_binds, mount_plan_dirs, tool_error

STATUS_MAX = 64 * 1024  # bwrap writes two short JSON records


class Bwrap(Runtime):
    name = "bwrap"

    def prepare(self, ctx: Context) -> Launch:
        tool = ctx.node.tools.get("bwrap")
        if tool is None:
            raise RuntimeRefused(f"bwrap is not installed on node {ctx.node.node}")
        binds = job_binds(ctx)
        mounts = None
        holds: tuple[int, ...] = ()
        root = "/"
        if ctx.spec.container_image:
            image = image_rootfs(ctx)
            holds = () if image.lock is None else (image.lock,)
            scratch, root = str(ctx.run_dir / "overlay"), str(ctx.run_dir / "rootfs")
            for d in (scratch, root):
                os.makedirs(d, 0o700 if d == scratch else 0o755, exist_ok=True)
            dirs, files = mount_plan_dirs(ctx, binds, ("/proc", "/dev", "/tmp", "/sys"))
            mounts = MountPlan(staged=() if image.staged is None else (image.staged,),
                               overlay=Overlay(lower=image.path, scratch=scratch, root=root, dirs=dirs,
                                               files=files))
        # Its status (child pid, exit code) tells a sandbox that never started from a job that failed.
        status_r, status = os.pipe()
        os.set_blocking(status_r, False)
        argv = [tool, "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--ro-bind", root, "/",
                "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
        if mounts is not None:
            argv += ["--ro-bind", "/sys", "/sys"]
        for dev in gpu_devices(ctx):
            argv += ["--dev-bind", dev.host, dev.path]
        for b in binds:
            argv += ["--bind" if b.rw else "--ro-bind", b.src, b.dst]
        argv += ["--chdir", ctx.spec.workdir, "--json-status-fd", str(status),
                 "--", ctx.script, *ctx.spec.script_args]
        return Launch(argv=argv, env=container_env(ctx), mounts=mounts, keep_fds=(status,),
                      signal_exit_codes=True, signal_main=False, status_fd=status_r, holds=holds)

    def after_exit(self, ctx: Context, launch: Launch, wait_status: int | None) -> str | None:
        status = _read_status(launch.status_fd)
        if wait_status is None or not os.WIFEXITED(wait_status) or os.WEXITSTATUS(wait_status) != 1:
            return None  # the job ran (or was killed): its status is the job's
        if b'"exit-code"' in status:  # a substring: bytes the job appended cannot hide it
            return None
        return f"bwrap could not set up the container: {tool_error(ctx, 'bwrap:')}"


def _read_status(fd: int | None) -> bytes:
    """What bwrap wrote to its status pipe (bwrap has exited: all of it is there; processes of
    the job that kept the write end may still be running, so no waiting for its end)."""
    if fd is None:
        return b""
    data = b""
    try:
        while len(data) < STATUS_MAX and (chunk := os.read(fd, STATUS_MAX - len(data))):
            data += chunk
    except BlockingIOError:
        pass
    finally:
        os.close(fd)
    return data


RUNTIME = Bwrap  # what runtimes.get() builds for this module (core/runtimes.py names it)
