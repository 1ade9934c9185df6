"""hai-controller: start-up, the API socket, signal handling, shutdown."""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import struct
import sys

import click

from ..config import ConfigError, ControllerConfig, load_controller_config
from ..transport.rpc import RpcConnection
from .api import build_api, caller_from_creds
from .service import Controller

log = logging.getLogger("hai.controller")

_UCRED = struct.Struct("3i")


def peer_credentials(writer: asyncio.StreamWriter) -> tuple[int, int, int]:
    sock = writer.get_extra_info("socket")
    return _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))


async def serve(cfg: ControllerConfig, stop: asyncio.Event) -> None:
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

    os.makedirs(os.path.dirname(cfg.socket) or ".", mode=0o755, exist_ok=True)
    if os.path.exists(cfg.socket):
        os.unlink(cfg.socket)
    server = await asyncio.start_unix_server(on_client, path=cfg.socket)
    os.chmod(cfg.socket, 0o666)  # anyone may connect; the kernel tells us who they are
    log.info("controller listening on %s, %d node(s), store %s", cfg.socket, len(cfg.nodes),
             cfg.database.split("@")[-1])
    try:
        await stop.wait()
    finally:
        log.info("shutting down (running jobs keep running)")
        server.close()
        for conn in list(connections):
            await conn.close()
        await ctl.stop()
        try:
            os.unlink(cfg.socket)
        except FileNotFoundError:
            pass


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

    asyncio.run(run())


if __name__ == "__main__":
    main()
