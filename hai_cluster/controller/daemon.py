"""hai-controller: start-up, the API socket, signal handling, shutdown; `db` for operators.

`hai-controller --config FILE` runs the daemon (it migrates the store at start and tells systemd
READY=1 once it serves); `hai-controller db current|upgrade [--dry-run] --config FILE` shows or
applies the schema migrations without starting it."""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import textwrap
from dataclasses import replace

import click

from ..config import ConfigError, ControllerConfig, load_controller_config
from ..core.states import JobState
from .. import logsetup
from ..sdnotify import ListenError, Notifier, listened_socket
from ..store.engine import StoreAccessError
from ..store.lease import StoreInUse
from ..protocol.codec import client_limits
from ..transport.rpc import RpcConnection, Shares
from ..transport.unix import GatedServer, SocketInUse, bind_socket, close_server, peer_credentials
from .access import caller_from_creds
from .api import build_api
from .client_steps import ClientLink
from .connlimit import ConnectionCounter
from .leader import LOST_EXIT, Gate, Leader
from .runas import RunAsError, become_store_owner, store_directory
from .metrics import render, start_metrics_server
from .service import Controller

log = logging.getLogger("hai.controller")

DEFAULT_CONFIG = "/etc/hai/controller.toml"
STATUS_EVERY = 5.0  # seconds between STATUS= lines to systemd


def _job_counts(ctl: Controller) -> dict[str, int]:
    from sqlalchemy import func, select

    from ..store.schema import jobs

    wanted = (JobState.PENDING.value, JobState.RUNNING.value)
    with ctl.repo.engine.connect() as c:
        return dict(c.execute(select(jobs.c.state, func.count()).where(jobs.c.state.in_(wanted))
                              .group_by(jobs.c.state)).all())


async def status_line(ctl: Controller) -> str:
    """What `systemctl status hai-controller` shows: links up, jobs running and pending."""
    up = sum(1 for link in ctl.links.values() if link.connected)
    counts = await ctl.db(_job_counts, ctl)
    return (f"serving, {up}/{len(ctl.links)} nodes responding, {counts.get(JobState.RUNNING.value, 0)} jobs "
            f"running, {counts.get(JobState.PENDING.value, 0)} pending")


async def serve(cfg: ControllerConfig, stop: asyncio.Event, notifier: Notifier | None = None) -> Leader:
    """Serve the socket; wait as a standby until this controller holds the lease, then run.
    Returns the Leader, whose `lost` says whether we stopped because another controller took over."""
    notifier = notifier or Notifier(None)
    sock = listened_socket(cfg.socket)  # systemd's (hai-controller.socket), made as root in /run/hai
    activated = sock is not None
    if sock is None:
        sock = bind_socket(cfg.socket, 0o666, "controller")  # anyone may connect; the kernel says who
    try:
        user = become_store_owner(cfg)  # started as root: the store's owner (hai) from here on
    except RunAsError:
        sock.close()
        _remove_socket(cfg.socket, activated)
        raise
    if user is not None:
        log.info("running as %s, the owner of %s, not as root", user, store_directory(cfg))
    elif os.geteuid() == 0:  # a development setup, or a store made by hand: say what it costs
        log.warning("running as root (%s is root's): whoever can change the store can act for every user; "
                    "the packaged service runs as %s", store_directory(cfg), cfg.run_as)
    ctl = Controller(cfg)
    leader = None
    metrics = None
    try:
        leader = Leader(cfg)  # opens the store's engine: a file it may not open is said here
        if cfg.telemetry.metrics_listen:  # first: a port in use ends the start before anything else
            try:
                metrics = await start_metrics_server(cfg.telemetry.metrics_listen,
                                                     lambda: render(ctl.telemetry, [n.name for n in cfg.nodes], ctl.queue_stats))
            except OSError as exc:
                raise ConfigError(f"metrics.listen {cfg.telemetry.metrics_listen}: {exc.strerror or exc}") from None
        notifier.status("migrating the store")
        await leader.open()
    except BaseException:
        if metrics is not None:
            metrics.close()
        sock.close()
        _remove_socket(cfg.socket, activated)
        if leader is not None:
            leader.close()
        raise
    api = Gate(build_api(ctl), leader, ready=lambda: ctl.started)  # not before start() has opened the store
    connections: set[RpcConnection] = set()

    counter = ConnectionCounter(cfg.access.max_connections_per_uid)
    limits = client_limits(cfg.access.max_request_bytes)
    shares = Shares(cfg.access.max_requests_in_flight_per_uid, cfg.access.max_request_bytes_per_uid)

    async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        pid, uid, gid = peer_credentials(writer)
        share = shares.open(uid) if uid != 0 else None  # one uid's requests and bytes, over its connections
        if not counter.admit(uid):
            try:
                await counter.refuse(reader, writer, uid, pid, limits=limits, share=share)
            finally:
                if share is not None:
                    shares.close(uid)
            return
        try:
            caller = replace(caller_from_creds(pid, uid, gid, cfg.access), link=ClientLink())
            conn = RpcConnection(reader, writer, table=api, context=caller, name=f"client uid={uid} pid={pid}",
                                 frame_timeout=cfg.access.client_frame_timeout,
                                 idle_timeout=cfg.access.client_idle_timeout, limits=limits,
                                 max_in_flight=cfg.access.max_requests_in_flight, share=share)
            caller.link.conn = conn
            connections.add(conn)
            try:
                await conn.run()
            finally:
                connections.discard(conn)
                link = caller.link  # an interactive client went away, or a sattach: what it held goes
                if link.steps or link.held or link.watches or link.follow is not None:
                    ctl.spawn(ctl.client_steps.gone(link, caller))
        finally:
            counter.release(uid)
            if share is not None:
                shares.close(uid)

    server = GatedServer(sock, on_client, refused=counter.too_fast)  # a uid over its connect rate: closed unread
    log.info("controller listening on %s, %d node(s), store %s", cfg.socket, len(cfg.nodes),
             cfg.database.split("@")[-1])

    async def status() -> str:
        return await status_line(ctl) if leader.active else leader.status_line()

    notifier.ready("waiting for the controller lease")
    heartbeat = asyncio.create_task(notifier.heartbeat(status, STATUS_EVERY))
    keeper = None
    started = False
    try:
        if await leader.wait_until_active(stop):
            notifier.status("active; starting")
            leader.on_lost = stop.set
            started = True
            await ctl.start(leader)
            keeper = asyncio.create_task(leader.keep())
        await stop.wait()
    finally:
        notifier.stopping("shutting down (running jobs keep running)")
        heartbeat.cancel()
        if keeper is not None:
            keeper.cancel()
        log.info("shutting down (running jobs keep running)")
        ctl.stopping = True  # the clients' connections close now: their sessions stay
        await close_server(server, connections, None)
        _remove_socket(cfg.socket, activated)
        if metrics is not None:
            metrics.close()
        if started:
            await ctl.stop()
        await leader.release()
        leader.close()
    return leader


def _remove_socket(path: str, activated: bool) -> None:
    """Remove the socket we bound; systemd's stays for the next start. Once the controller is no
    longer root, root's /run/hai keeps a socket it bound as root: the next start replaces it."""
    if activated:
        return
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except PermissionError:
        log.debug("left %s: this process is no longer root", path)


def run_daemon(config_path: str) -> None:
    try:
        cfg = load_controller_config(config_path)
    except ConfigError as exc:
        click.echo(f"hai-controller: {exc}", err=True)
        sys.exit(2)
    logsetup.configure(cfg.log_level.upper(), "%(asctime)s %(levelname)s %(name)s: %(message)s")
    notifier = Notifier.from_environment()  # and out of os.environ: nothing we start inherits it

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        return await serve(cfg, stop, notifier)

    try:
        leader = asyncio.run(run())
    except (SocketInUse, StoreInUse, StoreAccessError, ListenError, RunAsError, ConfigError) as exc:
        click.echo(f"hai-controller: {exc}", err=True)
        sys.exit(2)
    if leader.lost:  # systemd restarts us (Restart=on-failure) and we come back as a standby
        sys.exit(LOST_EXIT)


@click.group(invoke_without_command=True)
@click.option("--config", "config_path", type=click.Path(dir_okay=False),
              help="controller TOML file (required to run the daemon)")
@click.pass_context
def main(ctx: click.Context, config_path: str | None) -> None:
    """Run the hai-cluster controller (no command), or manage its store (`db`)."""
    ctx.obj = {"config": config_path}
    if ctx.invoked_subcommand is None:
        if config_path is None:
            raise click.UsageError("Missing option '--config'.", ctx)
        run_daemon(config_path)


# ---- hai-controller db: the store's schema, for operators ----------------------------------
_db_config = click.option("--config", "config_path", type=click.Path(dir_okay=False),
                          help=f"controller TOML file whose database to use [default: {DEFAULT_CONFIG}]")


def _db_target(ctx: click.Context, config_path: str | None):
    """(URL, URL without password, engine or None when an SQLite file does not exist yet, the
    migration scripts)."""
    from alembic.script import ScriptDirectory
    from sqlalchemy.engine import make_url

    from ..store.engine import _migrations_dir, make_engine

    path = config_path or (ctx.find_root().obj or {}).get("config") or DEFAULT_CONFIG
    try:
        cfg = load_controller_config(path)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        user = become_store_owner(cfg)  # as root: as the service runs, so new files are its user's
    except RunAsError as exc:
        raise click.ClickException(str(exc)) from None
    if user is not None:
        click.echo(f"hai-controller: running as {user}, the owner of {store_directory(cfg)}", err=True)
    url = make_url(cfg.database)
    shown = url.render_as_string(hide_password=True)
    missing = url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:") \
        and not os.path.exists(url.database)
    try:
        engine = None if missing else make_engine(cfg.database)
    except StoreAccessError as exc:
        raise click.ClickException(str(exc)) from None
    return cfg.database, shown, engine, ScriptDirectory(str(_migrations_dir()))


def _pending(script, current: str | None) -> list:
    """The migrations an upgrade to head runs, oldest first."""
    from alembic.script.revision import RevisionError
    from alembic.util import CommandError

    try:
        return list(reversed(list(script.iterate_revisions("heads", current or "base"))))
    except (CommandError, RevisionError) as exc:
        raise click.ClickException(f"the database is at revision {current}, which this hai-cluster does not know "
                                   f"(made by a newer version?): {exc}") from None


def _describe(rev) -> str:
    summary = " ".join((rev.doc or "").strip().split("\n\n")[0].split())  # the first paragraph
    return f"  {rev.revision}  {textwrap.shorten(summary, 110, placeholder=' ...')}"


def _current(engine) -> str | None:
    from ..store.engine import current_revision

    if engine is None:
        return None
    try:
        return current_revision(engine)
    except Exception as exc:  # unreachable server, wrong password, ...: say so, no traceback
        raise click.ClickException(f"cannot read the database: {exc}") from None


@main.group()
def db() -> None:
    """The store's schema: which migration it is at, and upgrading it."""


@db.command("current")
@_db_config
@click.pass_context
def db_current(ctx: click.Context, config_path: str | None) -> None:
    """Print the database's schema revision and the migrations not applied yet."""
    _, shown, engine, script = _db_target(ctx, config_path)
    current = _current(engine)
    todo = _pending(script, current)
    click.echo(f"database  {shown}" + ("  (does not exist yet)" if engine is None else ""))
    click.echo(f"current   {current or 'none (empty database)'}")
    click.echo(f"head      {script.get_current_head()}")
    if todo:
        click.echo(f"{len(todo)} migration(s) to run (hai-controller db upgrade, or start the controller):")
        for rev in todo:
            click.echo(_describe(rev))
    else:
        click.echo("up to date")


@db.command("upgrade")
@_db_config
@click.option("--dry-run", is_flag=True, help="print the migrations that would run; change nothing")
@click.pass_context
def db_upgrade(ctx: click.Context, config_path: str | None, dry_run: bool) -> None:
    """Apply the schema migrations up to this version's head (the controller also does at start)."""
    from ..store.engine import make_engine, upgrade

    database, shown, engine, script = _db_target(ctx, config_path)
    current = _current(engine)
    todo = _pending(script, current)
    head = script.get_current_head()
    if not todo:
        click.echo(f"{shown}: at {current}, the head; nothing to do")
        return
    click.echo(f"{shown}: at {current or 'none (empty database)'}, head {head}; "
               f"{'would run' if dry_run else 'running'} {len(todo)} migration(s):")
    for rev in todo:
        click.echo(_describe(rev))
    if dry_run:
        click.echo("dry run: nothing changed")
        return
    if engine is None:  # a new SQLite file: make_engine creates it (and its directory)
        try:
            engine = make_engine(database)
        except StoreAccessError as exc:
            raise click.ClickException(str(exc)) from None
    upgrade(engine)
    click.echo(f"upgraded to {_current(engine)}")


if __name__ == "__main__":
    main()
