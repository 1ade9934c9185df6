"""Accounting for the Slurm peer, so that its `sacct` has data to list: a private MariaDB and a
slurmdbd beside the peer's slurmctld (Debian 12's mariadb-server and slurmdbd, installed when
missing), its slurm.conf switched to accounting_storage/slurmdbd and slurmctld restarted cold.
The peer's own scripts (`up`, `down`) are not changed: `up` runs it without accounting, this
adds accounting to the running peer, and `stop()` takes it away again (the original slurm.conf
back; the peer's `down` stops slurmctld as always). Everything lives under the peer's directory
(acct/), on ports above the peer's (base port + 23 for MariaDB, + 24 for slurmdbd)."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from .polling import wait_until

PACKAGES = ("mariadb-server", "slurmdbd")
DB_PASSWORD = "peer-bench"  # a database on 127.0.0.1 of a throwaway peer, gone with it


def _log(msg: str) -> None:
    print(f"[slurm_accounting] {msg}", flush=True, file=sys.stderr)


def _wait(check, seconds: float, what: str) -> None:
    wait_until(check, seconds, what, interval=0.2)


def _install() -> None:
    missing = [p for p in PACKAGES if subprocess.run(["dpkg-query", "-W", "-f=${Status}", p], capture_output=True,
                                                      text=True).stdout != "install ok installed"]
    if missing:
        _log(f"apt-get install {' '.join(missing)}")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", *missing], env=env, check=True,
                       stdout=subprocess.DEVNULL, timeout=900)


class Accounting:
    def __init__(self, conf: Path, base_port: int) -> None:
        self.conf = conf
        self.dir = conf.parent.parent / "acct"
        self.db_port, self.dbd_port = base_port + 23, base_port + 24
        self.saved = conf.with_name("slurm.conf.no-accounting")
        self.env = {**os.environ, "SLURM_CONF": str(conf)}
        self.db: subprocess.Popen | None = None

    def start(self) -> None:
        _install()
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
        run = self.dir / "run"  # the database server's: it runs as mysql
        (self.dir / "db").mkdir(parents=True)
        run.mkdir()
        shutil.chown(self.dir / "db", "mysql", "mysql")
        shutil.chown(run, "mysql", "mysql")
        subprocess.run(["mariadb-install-db", "--user=mysql", f"--datadir={self.dir / 'db'}", "--skip-test-db",
                        "--auth-root-authentication-method=socket"], check=True, capture_output=True, timeout=300)
        sock = run / "mysqld.sock"
        self.db = subprocess.Popen(["mariadbd", "--user=mysql", f"--datadir={self.dir / 'db'}", f"--socket={sock}",
                          f"--port={self.db_port}", "--bind-address=127.0.0.1", f"--pid-file={run / 'mysqld.pid'}",
                          f"--log-error={run / 'mysqld.err'}", "--skip-name-resolve"],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
        _wait(sock.exists, 60, "MariaDB")
        subprocess.run(["mariadb", f"--socket={sock}", "-u", "root", "-e",
                        f"CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY '{DB_PASSWORD}'; "
                        "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"], check=True, timeout=60)
        dbd_conf = self.conf.with_name("slurmdbd.conf")  # slurmdbd reads it beside SLURM_CONF
        fd = os.open(dbd_conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"AuthType=auth/munge\nDbdAddr=127.0.0.1\nDbdHost=localhost\nDbdPort={self.dbd_port}\n"
                    f"SlurmUser=root\nLogFile={self.dir / 'slurmdbd.log'}\nPidFile={self.dir / 'slurmdbd.pid'}\n"
                    f"StorageType=accounting_storage/mysql\nStorageHost=127.0.0.1\nStoragePort={self.db_port}\n"
                    f"StorageUser=slurm\nStoragePass={DB_PASSWORD}\nStorageLoc=slurm_acct_db\n")
        subprocess.run(["slurmdbd"], env=self.env, check=True, timeout=60)
        _wait(lambda: (self.dir / "slurmdbd.pid").exists(), 60, "slurmdbd")
        text = self.conf.read_text()
        shutil.copy(self.conf, self.saved)
        self.conf.write_text(text.replace(
            "AccountingStorageType=accounting_storage/none\n",
            f"AccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageHost=localhost\n"
            f"AccountingStoragePort={self.dbd_port}\n"))
        name = next(line.split("=", 1)[1] for line in text.splitlines() if line.startswith("ClusterName="))
        _wait(lambda: subprocess.run(["sacctmgr", "-i", "add", "cluster", name], env=self.env, capture_output=True,
                                     timeout=60).returncode == 0, 60, "sacctmgr add cluster")
        self._restart_slurmctld()
        _log(f"accounting on: slurmdbd on port {self.dbd_port}, MariaDB on {self.db_port}")

    def _restart_slurmctld(self) -> None:
        """Cold, as the peer's `up` starts it; the slurmd's read the new slurm.conf too."""
        pidfile = self.conf.parent.parent / "run" / "slurmctld.pid"
        pid = int(pidfile.read_text())
        os.kill(pid, signal.SIGTERM)
        _wait(lambda: not Path(f"/proc/{pid}").exists(), 60, "slurmctld to stop")
        subprocess.run(["slurmctld", "-c", "-f", str(self.conf)], env=self.env, check=True, timeout=60,
                       stdin=subprocess.DEVNULL)
        _wait(lambda: subprocess.run(["scontrol", "reconfigure"], env=self.env, capture_output=True,
                                     timeout=60).returncode == 0, 60, "slurmctld to answer")
        _wait(lambda: set(subprocess.run(["sinfo", "-h", "-o", "%t"], env=self.env, capture_output=True, text=True,
                                         timeout=60).stdout.split()) == {"idle"}, 120, "the peer's nodes idle")

    def stop(self) -> None:
        """slurmdbd and MariaDB stopped, the peer's slurm.conf as `up` wrote it (slurmctld, which
        `down` stops, keeps running with accounting until then)."""
        try:
            if not (self.dir / "slurmdbd.pid").exists():
                raise ProcessLookupError  # none was started
            pid = int((self.dir / "slurmdbd.pid").read_text())
            os.kill(pid, signal.SIGTERM)
            _wait(lambda: not Path(f"/proc/{pid}").exists(), 60, "slurmdbd to stop")
        except ProcessLookupError:
            pass
        except (OSError, ValueError, RuntimeError) as exc:
            _log(f"slurmdbd: {exc}")
        if self.db is not None:
            self.db.terminate()
            try:
                self.db.wait(60)
            except subprocess.TimeoutExpired:
                self.db.kill()
                self.db.wait()
            self.db = None
        if self.saved.exists():
            os.replace(self.saved, self.conf)
