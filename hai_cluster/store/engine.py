"""Engine setup for SQLite (WAL, synchronous writes) and PostgreSQL, and schema migration."""
from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from sqlalchemy import Engine, create_engine, event

log = logging.getLogger(__name__)


def _migrations_dir() -> Path:
    """Beside the package in a checkout (editable install), else where the installer put them:
    the wheel's data files land under its scheme's data directory (sys.prefix for a venv or the
    system, the user base for --user, PREFIX for --prefix), which the installed files list says."""
    for candidate in (Path(__file__).resolve().parents[2] / "migrations", _installed_migrations(),
                      Path(sys.prefix) / "share" / "hai-cluster" / "migrations"):
        if candidate is not None and (candidate / "env.py").exists():
            return candidate
    raise RuntimeError("hai-cluster's migrations/ directory is missing from this installation")


def _installed_migrations() -> Path | None:
    """The migrations/ of the installed distribution, from its RECORD (importlib.metadata)."""
    from importlib.metadata import PackageNotFoundError, distribution
    here = Path(__file__).resolve().parents[1]  # this hai_cluster package: its own distribution's files
    try:
        dist = distribution("hai-cluster")
    except PackageNotFoundError:
        return None
    files = dist.files or ()
    if not any(Path(dist.locate_file(f)).resolve() == here / "__init__.py" for f in files if f.name == "__init__.py"):
        return None  # another installation of hai-cluster than the one running
    for f in files:
        if f.name == "env.py" and f.parent.name == "migrations" and "hai-cluster" in f.parts:
            return Path(dist.locate_file(f)).resolve().parent
    return None


SQLITE_FILES = ("", "-wal", "-shm", "-journal")


class StoreAccessError(Exception):
    """A file of the store that this process may not open (made by another user: root, by hand)."""


def _name(uid: int) -> str:
    import pwd
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def access_error(path: str, exc: OSError) -> StoreAccessError:
    """Say which file, whose it is, and who we are: the usual cause is a file root made (a
    controller or `db upgrade` run as root by an older version) that the service user cannot open."""
    there = os.path.abspath(path)
    while not os.path.lexists(there) and there != "/":
        there = os.path.dirname(there)  # a directory that could not be made: its parent's owner
    try:
        owner = _name(os.lstat(there).st_uid)
    except OSError:
        owner = "unknown"
    me = _name(os.geteuid())
    return StoreAccessError(f"cannot open the store's file {path}: {exc.strerror or exc} ({there} belongs to "
                            f"{owner}, this controller runs as {me}); the store's files must be its user's: as root, "
                            f"chown -R {me}: {os.path.dirname(os.path.abspath(path))}")


def private_sqlite(path: str) -> None:
    """The SQLite store and its WAL are its owner's alone (0600; the controller's user, hai, or
    root): they hold every job's script and environment. SQLite gives the -wal and -shm files the
    database file's mode, so the file is made 0600 before SQLite opens it, and files an older
    version left readable are narrowed."""
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), mode=0o700, exist_ok=True)
    except PermissionError as exc:
        raise access_error(os.path.dirname(os.path.abspath(path)), exc) from None
    for suffix in SQLITE_FILES:
        flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_CREAT if not suffix else 0)
        try:
            fd = os.open(path + suffix, flags, 0o600)
        except FileNotFoundError:
            continue
        except PermissionError as exc:
            raise access_error(path + suffix, exc) from None
        try:
            if os.fstat(fd).st_mode & 0o077:
                log.warning("%s was readable by others; made 0600", path + suffix)
                os.fchmod(fd, 0o600)
        finally:
            os.close(fd)


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        path = url.split("///", 1)[1] if "///" in url else ""
        if path and path != ":memory:":
            private_sqlite(path)
        engine = create_engine(url, connect_args={"timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record):
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            # FULL: a submission acknowledged to the user survives a power cut.
            cur.execute("PRAGMA synchronous=FULL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()
        return engine
    return create_engine(url, pool_pre_ping=True)


def _alembic_config(connection):
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(_migrations_dir()))
    cfg.attributes["connection"] = connection
    return cfg


def upgrade(engine: Engine, revision: str = "head") -> None:
    from alembic import command

    with engine.begin() as conn:
        command.upgrade(_alembic_config(conn), revision)


def downgrade(engine: Engine, revision: str) -> None:
    from alembic import command

    with engine.begin() as conn:
        command.downgrade(_alembic_config(conn), revision)


def current_revision(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def head_revision() -> str:
    """The newest migration this installation ships."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(_alembic_config(None)).get_current_head()
