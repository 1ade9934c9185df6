"""The one place that calls NVIDIA's MPS control executable (`nvidia-cuda-mps-control`).

One control daemon per (card, user): its pipe and log directories are <run_dir>/gpu<N>-<uid>/,
owned by the user, and it runs as the user (an MPS server serves one user at a time). The daemon
creates `control` (and nvidia-cuda-mps-control.pid) in its pipe directory; they tell the agent,
across its own restarts, whether the daemon runs. The executable's path comes from the agent config ([sharing]
mps_control), so tests point it at a script that records what it was asked.
"""
from __future__ import annotations

import logging
import os
import subprocess
import threading
import time
from pathlib import Path

log = logging.getLogger(__name__)

TIMEOUT = 30.0
QUIT_WAIT = 10.0  # seconds a quitting daemon is given to go before a new one may be started


class MpsError(Exception):
    pass


class MpsControl:
    def __init__(self, executable: str, run_dir: str) -> None:
        self.executable, self.run_dir = executable, Path(run_dir)
        # Runs start on the agent's thread pool: two sharing runs of one user starting at once on
        # one card must not both find no daemon and start two (nor one stop what one starts).
        self._lock = threading.Lock()
        self.ensured = 0  # daemons handed out so far (ensure): what quit's `unless_ensured_since` compares

    def dirs(self, card: int, uid: int) -> tuple[Path, Path]:
        base = self.run_dir / f"gpu{card}-{uid}"
        return base / "pipe", base / "log"

    def running(self, card: int, uid: int) -> bool:
        """The daemon's control pipe exists and, where it left a pid file, that process lives (a
        pipe left behind by a crash or a reboot does not count)."""
        pipe = self.dirs(card, uid)[0]
        if not (pipe / "control").exists():
            return False
        try:
            pid = int((pipe / "nvidia-cuda-mps-control.pid").read_text().strip())
        except (OSError, ValueError):
            return True  # no pid file (older drivers): the pipe is all there is
        return os.path.exists(f"/proc/{pid}")

    def _env(self, card_uuid: str, card: int, uid: int) -> dict[str, str]:
        pipe, logs = self.dirs(card, uid)
        return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "CUDA_VISIBLE_DEVICES": card_uuid,
                "CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_MPS_LOG_DIRECTORY": str(logs)}

    def ensure(self, card: int, card_uuid: str, uid: int, gid: int) -> Path:
        """Start the card's control daemon for `uid` unless it runs; returns its pipe directory."""
        pipe, logs = self.dirs(card, uid)
        with self._lock:
            if self.running(card, uid):
                self.ensured += 1
                return pipe
            self.run_dir.mkdir(parents=True, exist_ok=True, mode=0o755)
            for d in (pipe.parent, pipe, logs):
                d.mkdir(exist_ok=True, mode=0o700)
                os.chown(d, uid, gid)
            self._call(["-d"], self._env(card_uuid, card, uid), uid, gid, f"start MPS on GPU {card} for uid {uid}")
            self.ensured += 1
        log.info("MPS control daemon started on GPU %d for uid %d (%s)", card, uid, pipe)
        return pipe

    def quit(self, card: int, card_uuid: str, uid: int, gid: int, unless_ensured_since: int | None = None) -> None:
        """Ask the card's control daemon for `uid` to shut down (MPS's `quit` command); not when
        a daemon was handed out since `ensured` read `unless_ensured_since` (its user may be a
        run that the caller's decision did not know of)."""
        with self._lock:
            if unless_ensured_since is not None and self.ensured != unless_ensured_since:
                return
            if not self.running(card, uid):
                return
            self._call([], self._env(card_uuid, card, uid), uid, gid, f"stop MPS on GPU {card} for uid {uid}",
                       stdin="quit\n")
            # `quit` is only delivered when the call returns: until the daemon is gone, a run
            # starting (ensure waits on the lock) would find it and be handed a dying daemon.
            deadline = time.monotonic() + QUIT_WAIT
            while self.running(card, uid) and time.monotonic() < deadline:
                time.sleep(0.05)
        log.info("MPS control daemon on GPU %d for uid %d told to quit", card, uid)

    def _call(self, args: list[str], env: dict[str, str], uid: int, gid: int, what: str, stdin: str = "") -> None:
        ids = {} if os.getuid() != 0 else {"user": uid, "group": gid, "extra_groups": []}
        try:
            done = subprocess.run([self.executable, *args], env=env, input=stdin, capture_output=True, text=True,
                                  timeout=TIMEOUT, cwd="/", **ids)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise MpsError(f"cannot {what}: {exc}") from None
        if done.returncode != 0:
            raise MpsError(f"cannot {what}: {self.executable} exited {done.returncode}: "
                           f"{(done.stderr or done.stdout).strip()[:300]}")
