"""Interactive work, hai-cluster and Slurm side by side: the commands a person types, on a real
terminal (a pseudo-terminal whose slave side is the command's controlling terminal).

  - `srun --pty true` from outside any job: the allocation, a terminal on the node, the end and
    the allocation's release, as the person waits for the prompt to come back;
  - `srun true` the same without a terminal;
  - keystroke echo through `srun --pty cat`: one key typed, until its echo is shown (client ->
    controller -> agent -> step server -> the node's terminal and back; Slurm: srun -> slurmstepd).

hai-cluster on `hai-dev up --nodes 2` (jobs as root, simulated GPUs), Slurm on the peer
`../shared/peers/slurm`, one after the other, never both at once."""
from __future__ import annotations

import fcntl
import os
import re
import select
import struct
import subprocess
import termios
import time

from . import slurm_peer
from .cluster_ops import BIN, DevCluster, log, pct


def _ctty() -> None:
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class _Tty:
    def __init__(self, argv: list[str], env: dict, cwd: str) -> None:
        self.master, slave = os.openpty()
        fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
        self.proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=cwd,
                                     start_new_session=True, preexec_fn=_ctty)
        os.close(slave)
        self.seen = b""

    def read(self, timeout: float) -> None:
        if select.select([self.master], [], [], timeout)[0]:
            try:
                self.seen += os.read(self.master, 65536)
            except OSError:
                pass

    def until(self, text: bytes, start: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.seen[start:]:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{text!r} not shown: {self.seen[-500:]!r}")
            self.read(0.5)

    def finish(self, timeout: float = 60) -> int:
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            self.read(0.05)
        code = self.proc.wait(timeout=1)
        os.close(self.master)
        return code


def measure(srun: str, env: dict, cwd: str, reps: int, keys: int) -> dict:
    pty_rt, plain_rt, echo = [], [], []
    for _ in range(reps):
        t0 = time.monotonic()
        t = _Tty([srun, "--pty", "true"], env, cwd)
        if t.finish() != 0:
            raise RuntimeError(f"srun --pty true failed: {t.seen[-500:]!r}")
        pty_rt.append(time.monotonic() - t0)
    for _ in range(reps):
        t0 = time.monotonic()
        subprocess.run([srun, "true"], env=env, cwd=cwd, stdin=subprocess.DEVNULL, check=True, timeout=60)
        plain_rt.append(time.monotonic() - t0)
    t = _Tty([srun, "--pty", "cat"], env, cwd)
    os.write(t.master, b"ready\r")
    t.until(b"ready\r\nready", 0)
    for i in range(keys):
        key = bytes([ord("a") + i % 26])
        start = len(t.seen)
        t0 = time.monotonic()
        os.write(t.master, key)
        t.until(key, start)
        echo.append(time.monotonic() - t0)
        time.sleep(0.02)
    os.write(t.master, b"\r\x04")
    t.finish()
    return {"pty_s": pty_rt, "plain_s": plain_rt, "echo_s": echo}


def measure_hai(reps: int, keys: int) -> dict:
    c = DevCluster(nodes=2, gpus_per_node=2, tick=1.0)
    try:
        return measure(str(BIN / "srun"), {**c.env, "TERM": "xterm"}, str(c.work), reps, keys)
    finally:
        c.down()


def measure_slurm(reps: int, keys: int) -> dict:
    try:
        m = re.search(r"SLURM_CONF=(\S+)", slurm_peer._peer("up"))
        if not m:
            raise RuntimeError("slurm peer up printed no SLURM_CONF")
        env = {**os.environ, "SLURM_CONF": m[1].strip("'\""), "TERM": "xterm"}
        r = measure("srun", env, "/tmp", reps, keys)
        r["version"] = subprocess.run(["srun", "--version"], capture_output=True, text=True, env=env).stdout.strip()
        return r
    finally:
        slurm_peer._peer("down", timeout=120)


def section(args) -> str:
    reps, keys = max(args.reps * 4, 20), 100
    log(f"interactive: hai-dev, {reps} x srun --pty true and srun true, {keys} keystrokes")
    ours = measure_hai(reps, keys)
    theirs, how = None, "not measured (`--slurm none`)"
    if args.slurm == "live":
        log("interactive: the same on the Slurm peer")
        try:
            theirs = measure_slurm(reps, keys)
            how = f"{theirs['version']}, measured live right after hai-cluster"
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            how = f"the Slurm peer failed ({str(exc)[:200]})"
    rows = ["| measurement | hai-cluster p50 / p95 | Slurm p50 / p95 |", "|---|---|---|"]
    for key, label in (("pty_s", f"`srun --pty true` outside a job, {reps} runs"),
                       ("plain_s", f"`srun true` outside a job, {reps} runs"),
                       ("echo_s", f"keystroke echo through `srun --pty cat`, {keys} keys")):
        def cell(r):
            return f"{pct(r[key], 50) * 1000:.1f} ms / {pct(r[key], 95) * 1000:.1f} ms" if r else "—"
        rows.append(f"| {label} | {cell(ours)} | {cell(theirs)} |")
    return ("### Interactive: `srun --pty` round trip and keystroke echo\n\n"
            "On a real terminal (a pty, the command's controlling terminal; `scripts/benchmarks/interactive.py`): "
            "the wall time of `srun --pty true` and `srun true` typed outside any job (allocation, step, "
            "release), and the time from a key typed into `srun --pty cat` to its echo on the screen. "
            "hai-cluster: `hai-dev up --nodes 2` (the client's keys and the task's output go client → "
            f"controller → agent → step server and back). Slurm: {how}, the peer `../shared/peers/slurm`.\n\n"
            + "\n".join(rows))
