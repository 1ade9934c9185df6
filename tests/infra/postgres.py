"""A private, throwaway PostgreSQL server for tests.

    with PrivatePostgres() as pg:
        url = pg.create_database("t1")     # postgresql+psycopg://postgres@127.0.0.1:PORT/t1
        ...
        pg.drop_database("t1")

initdb -A trust into a fresh directory under /tmp (owned by the `postgres` OS user when we run as
root: initdb refuses to run as root), then `pg_ctl -w start` listening on 127.0.0.1 at a spare port
and on a Unix socket in that directory; durability is switched off (fsync, full page writes) since
the data is thrown away. `close()` stops it with `pg_ctl -m fast` and removes the directory.

Each live server holds an flock on DIR/owner.lock; a server directory whose lock is free was left
by a crashed run and is stopped and removed by the next PrivatePostgres.
"""
from __future__ import annotations

import fcntl
import glob
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

PREFIX = "hai-pg-"
BASE_DIR = "/tmp"
NEEDED = ("initdb", "pg_ctl", "postgres", "createdb", "dropdb")
DB_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


class PostgresError(RuntimeError):
    pass


def find_bindir() -> str | None:
    """The directory holding initdb/pg_ctl/postgres: pg_config --bindir, the newest
    /usr/lib/postgresql/*/bin, or wherever initdb is on PATH."""
    candidates: list[str] = []
    if shutil.which("pg_config"):
        try:
            out = subprocess.run(["pg_config", "--bindir"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                 text=True, timeout=10)
            if out.returncode == 0 and out.stdout.strip():
                candidates.append(out.stdout.strip())
        except (OSError, subprocess.TimeoutExpired):
            pass

    def version(path: str) -> tuple[int, ...]:
        m = re.search(r"/postgresql/([\d.]+)/bin$", path)
        return tuple(int(x) for x in m.group(1).split(".")) if m else ()

    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version, reverse=True)
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(os.path.dirname(initdb))
    for d in candidates:
        if all(os.access(os.path.join(d, b), os.X_OK) for b in NEEDED):
            return d
    return None


def _spare_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrivatePostgres:
    def __init__(self, *, database: str | None = "hai", bindir: str | None = None,
                 start_timeout: float = 60.0) -> None:
        self.bindir = bindir or find_bindir()
        if self.bindir is None:
            raise PostgresError("PostgreSQL server binaries not found (initdb, pg_ctl, postgres): "
                                "install the postgresql package")
        self.database = database
        self.start_timeout = start_timeout
        self.dir: Path | None = None
        self.port: int | None = None
        self._lock_fd: int | None = None
        self._user: pwd.struct_passwd | None = None
        self._started = False

    # -- paths and helpers -------------------------------------------------------------------

    @property
    def data_dir(self) -> Path:
        assert self.dir is not None
        return self.dir / "data"

    @property
    def socket_dir(self) -> Path:
        assert self.dir is not None
        return self.dir / "sock"

    @property
    def log_file(self) -> Path:
        assert self.dir is not None
        return self.dir / "server.log"

    def _bin(self, name: str) -> str:
        return os.path.join(self.bindir, name)

    def _as_owner(self, argv: list[str]) -> list[str]:
        """Run server-side tools as the `postgres` user when we are root."""
        if os.geteuid() == 0:
            return ["runuser", "-u", self._user.pw_name, "--", *argv]
        return argv

    def _run(self, argv: list[str], *, as_owner: bool = False, timeout: float = 120.0) -> subprocess.CompletedProcess:
        if as_owner:
            argv = self._as_owner(argv)
        try:
            proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  timeout=timeout, cwd="/")
        except subprocess.TimeoutExpired as exc:
            raise PostgresError(f"{' '.join(argv)} timed out after {timeout:g} s") from exc
        return proc

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except (FileNotFoundError, AssertionError):
            return "(no log)"

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> "PrivatePostgres":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        if os.geteuid() == 0:
            try:
                self._user = pwd.getpwnam("postgres")
            except KeyError:
                raise PostgresError("running as root but there is no `postgres` OS user for initdb "
                                    "(install the postgresql package)") from None
        else:
            self._user = pwd.getpwuid(os.geteuid())
        reap_stale_servers(self.bindir)
        try:
            self._init()
            self._start_server()
            if self.database:
                self.create_database(self.database)
        except BaseException:
            self.close()
            raise

    def _init(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix=PREFIX, dir=BASE_DIR if os.path.isdir(BASE_DIR) else None))
        self._lock_fd = os.open(self.dir / "owner.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self.socket_dir.mkdir()
        self.log_file.touch()
        for p in (self.dir, self.socket_dir, self.log_file):
            os.chown(p, self._user.pw_uid, self._user.pw_gid)
        os.chmod(self.dir, 0o700)
        proc = self._run([self._bin("initdb"), "-D", str(self.data_dir), "-A", "trust", "-U", "postgres",
                          "-E", "UTF8", "--no-locale", "--no-sync"], as_owner=True)
        if proc.returncode != 0:
            raise PostgresError(f"initdb failed ({proc.returncode}):\n{proc.stdout}")

    def _start_server(self) -> None:
        last = ""
        for _ in range(5):  # a spare port can be taken between choosing and binding it: retry
            port = _spare_port()
            opts = (f"-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories={self.socket_dir} "
                    f"-c fsync=off -c full_page_writes=off -c synchronous_commit=off")
            proc = self._run([self._bin("pg_ctl"), "-D", str(self.data_dir), "-l", str(self.log_file),
                              "-w", "-t", str(int(self.start_timeout)), "-o", opts, "start"],
                             as_owner=True, timeout=self.start_timeout + 30)
            if proc.returncode == 0:
                self.port = port
                self._started = True
                return
            last = f"{proc.stdout}\n{self.log_tail()}"
            if "could not bind" not in last and "already in use" not in last:
                break
            self._kill_postmaster()
        raise PostgresError(f"pg_ctl start failed:\n{last}")

    def stop(self) -> None:
        """Stop the server, keeping its data and port, to test what happens while it is down."""
        proc = self._run([self._bin("pg_ctl"), "-D", str(self.data_dir), "-m", "fast", "-w", "-t", "30", "stop"],
                         as_owner=True, timeout=60)
        if proc.returncode != 0:
            raise PostgresError(f"pg_ctl stop failed:\n{proc.stdout}")

    def resume(self) -> None:
        """Start a stopped server again on the same port."""
        opts = (f"-c listen_addresses=127.0.0.1 -c port={self.port} -c unix_socket_directories={self.socket_dir} "
                f"-c fsync=off -c full_page_writes=off -c synchronous_commit=off")
        proc = self._run([self._bin("pg_ctl"), "-D", str(self.data_dir), "-l", str(self.log_file), "-w", "-t",
                          str(int(self.start_timeout)), "-o", opts, "start"], as_owner=True,
                         timeout=self.start_timeout + 30)
        if proc.returncode != 0:
            raise PostgresError(f"pg_ctl start failed:\n{proc.stdout}\n{self.log_tail()}")

    def close(self) -> None:
        """Stop the server and remove its directory. Idempotent."""
        if self.dir is None:
            return
        try:
            if self._started or (self.data_dir / "postmaster.pid").exists():
                proc = self._run([self._bin("pg_ctl"), "-D", str(self.data_dir), "-m", "fast", "-w", "-t", "30",
                                  "stop"], as_owner=True, timeout=60)
                if proc.returncode != 0:
                    self._kill_postmaster()
        finally:
            self._started = False
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def _kill_postmaster(self) -> None:
        _kill_postmaster(self.data_dir)

    # -- databases ---------------------------------------------------------------------------

    def url(self, database: str | None = None) -> str:
        """SQLAlchemy 2 + psycopg 3 URL for a database on this server (default: the one made at start)."""
        db = database or self.database or "postgres"
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{db}"

    def _client(self, tool: str, *args: str) -> subprocess.CompletedProcess:
        return self._run([self._bin(tool), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", *args],
                         timeout=60)

    def create_database(self, name: str) -> str:
        if not DB_NAME.match(name):
            raise ValueError(f"bad database name {name!r}")
        proc = self._client("createdb", name)
        if proc.returncode != 0:
            raise PostgresError(f"createdb {name} failed: {proc.stdout.strip()}")
        return self.url(name)

    def drop_database(self, name: str) -> None:
        proc = self._client("dropdb", "--if-exists", "--force", name)
        if proc.returncode != 0:
            raise PostgresError(f"dropdb {name} failed: {proc.stdout.strip()}")


def _kill_postmaster(data_dir: Path) -> None:
    try:
        pid = int((data_dir / "postmaster.pid").read_text().split()[0])
    except (FileNotFoundError, ValueError, IndexError):
        return
    try:  # the pid may have been reused since a crash: only signal a process running in data_dir
        if os.path.realpath(f"/proc/{pid}/cwd") != os.path.realpath(data_dir):
            return
    except OSError:
        return
    try:
        os.kill(pid, signal.SIGQUIT)  # immediate shutdown; children follow the postmaster
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def reap_stale_servers(bindir: str | None = None) -> None:
    """Stop and remove servers left by crashed runs (their owner.lock is no longer held)."""
    for d in glob.glob(os.path.join(BASE_DIR, PREFIX + "*")):
        lock = os.path.join(d, "owner.lock")
        try:
            if time.time() - os.stat(lock).st_mtime < 60:
                continue  # possibly being set up right now
            fd = os.open(lock, os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            continue  # being created right now, or not ours
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a live run owns it
            _kill_postmaster(Path(d) / "data")
            shutil.rmtree(d, ignore_errors=True)
        finally:
            os.close(fd)
