"""hai-controller: start-up, the API socket, signal handling, shutdown."""
from __future__ import annotations

import asyncio
import logging
import signal
import sys

import click

from ..config import ConfigError, ControllerConfig, load_controller_config
from ..transport.rpc import RpcConnection
from ..transport.unix import SocketInUse, bind_socket, close_server, peer_credentials
from .api import build_api, caller_from_creds
from .service import Controller

log = logging.getLogger("hai.controller")

async def serve(cfg: ControllerConfig, stop: asyncio.Event) -> None:
    sock = bind_socket(cfg.socket, 0o666, "controller")  # anyone may connect; the kernel says who
    ctl = Controller(cfg)
    await ctl.start()
    api = build_api(ctl)
    connections: set[RpcConnection] = set()

    async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        pid, uid, gid = peer_credentials(writer)
        caller = caller_from_creds(pid, uid, gid, cfg.admins)
        conn = RpcConnection(reader, writer, table=api, context=caller, name=f"client uid={uid} pid={pid}")
        connections.add(conn)
        try:
            await conn.run()
        finally:
            connections.discard(conn)

    server = await asyncio.start_unix_server(on_client, sock=sock)
    log.info("controller listening on %s, %d node(s), store %s", cfg.socket, len(cfg.nodes),
             cfg.database.split("@")[-1])
    try:
        await stop.wait()
    finally:
        log.info("shutting down (running jobs keep running)")
        await close_server(server, connections, cfg.socket)
        await ctl.stop()


@click.command()
@click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False),
              help="controller TOML file")
def main(config_path: str) -> None:
    """Run the hai-cluster controller."""
    try:
        cfg = load_controller_config(config_path)
    except ConfigError as exc:
        click.echo(f"hai-controller: {exc}", err=True)
        sys.exit(2)
    logging.basicConfig(level=cfg.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve(cfg, stop)

    try:
        asyncio.run(run())
    except SocketInUse as exc:
        click.echo(f"hai-controller: {exc}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
