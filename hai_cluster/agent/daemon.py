"""hai-agent: the per-node root daemon. Serves RPCs on a Unix socket and watches the spool.

Shutting down (SIGTERM/SIGINT) closes the socket and leaves every job running: jobs belong to
their shepherds, and the next agent picks them up from the spool.
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal

import click
import psutil

from .. import logsetup, timeouts
from ..config import AgentConfig, ConfigError, load_agent_config
from ..sdnotify import Notifier
from ..transport.rpc import ConnectionLost, RpcConnection
from ..transport.unix import SocketInUse, bind_socket, close_server, peer_credentials
from .adopt import Adopter, Peer
from .gpus import GpuError, inventory
from .health import HealthChecker
from .isolation import NodeIsolation
from .gpushare import Shares
from .runs import RunTable
from .service import build_table
from .spool import runs_dir
from .follow import OutputFollows
from .steps import StepRelay
from .starter import ShepherdStarter, room_for
from .dcgm import open_mapping
from .telemetry import RunRef, Sampler

log = logging.getLogger("hai_cluster.agent.daemon")  # not __main__ under -m

PUSH_TIMEOUT = 5.0  # a controller that does not read its socket must not stall the poll loop


class Agent:
    def __init__(self, cfg: AgentConfig) -> None:
        self.cfg = cfg
        self.gpu_backend, self.gpus = inventory(cfg)
        self.cpus = cfg.cpus or os.cpu_count() or 1
        self.mem_mb = psutil.virtual_memory().total // (1024 * 1024)
        self.isolation = NodeIsolation.detect(cfg)  # logs what it found (and what is missing)
        self.starter = ShepherdStarter(cfg.shepherd_start, room_for(runs_dir(cfg.spool)))
        self.runs = RunTable(cfg.spool, cfg.launch_timeout, self.isolation, self.starter)
        self.shares = Shares(cfg, self.gpus)
        self.adopter = Adopter(cfg.adopt, cfg.name, self.runs)  # ssh logins into jobs (pam_exec)
        self._mps_cleanup: asyncio.Future | None = None  # release_idle_mps's task
        self._mps_cleanup_again = False
        self.health = HealthChecker(cfg, len(self.gpus))
        self.table = build_table(self)
        self.connections: set[RpcConnection] = set()
        self.controller: RpcConnection | None = None  # the connection that said hello last
        self.controller_up = asyncio.Event()  # set while there is one
        self.steps = StepRelay(self)
        self.follows = OutputFollows(self)  # sattach JOB.batch: the batch script's output, read as its user
        self._occupancy: dict[int, list[int]] = {}
        self._gpu_jobs: dict[int, list[int]] = {}
        t = cfg.telemetry
        self.sampler = Sampler(self._telemetry_nvml(), cfg.name, t.interval, t.history,
                               on_event=self.health.note_event) if t.enabled else None
        # written where the sampler reads the live runs (each sample), so it follows them within one interval
        self.job_mapping = open_mapping(t.dcgm_job_mapping_dir) if t.enabled else None

    def _telemetry_nvml(self):
        """The NVML module the inventory came from; simulated GPUs read this node's live runs."""
        if self.gpu_backend == "simulated":
            from .simgpu import SimulatedTelemetryNvml
            s, t = self.cfg.simulated, self.cfg.telemetry
            return SimulatedTelemetryNvml(self.cfg.name, s.count, s.model, s.memory_mb, occupancy=self.gpu_occupancy,
                                          busy_util=t.simulated_util, process_memory_mb=t.simulated_process_memory_mb,
                                          xid_file=s.xid_file, util_file=s.util_file, gpu_jobs=self.gpu_jobs)
        import pynvml
        return pynvml

    def live_runs(self) -> list[RunRef]:
        """Runs with a job process to measure (a run still launching has none yet). Called on the
        event loop before each sample; it also notes which GPUs they hold, for simulated GPUs."""
        runs = [RunRef(key[0], key[1], tuple(r.spec.gpus), r.status.pid, r.dir)
                for key, r in sorted(self.runs.runs.items())
                if r.spec is not None and not r.status.ended and r.status.pid is not None]
        occupancy: dict[int, list[int]] = {}
        jobs: dict[int, list[int]] = {}
        for run in runs:
            for g in run.gpus:
                occupancy.setdefault(g, []).append(run.pid)
                jobs.setdefault(g, []).append(run.job_id)
        self._occupancy, self._gpu_jobs = occupancy, jobs
        if self.job_mapping is not None:
            self.job_mapping.update(runs)
        return runs

    def gpu_occupancy(self) -> dict[int, list[int]]:
        """GPU index -> main pids of the live runs holding it (what simulated GPUs report). Read on
        the NVML thread: a dict swapped whole on the loop, never the run table itself."""
        return self._occupancy

    def gpu_jobs(self) -> dict[int, list[int]]:
        """GPU index -> the jobs whose live runs hold it (gpus.simulated_util_file), as gpu_occupancy."""
        return self._gpu_jobs

    def hello_from(self, name: str) -> None:
        """The controller said hello on the connection named `name`: the agent's requests (job
        steps) go there."""
        for conn in self.connections:
            if conn.name == name:
                self.controller = conn
                self.controller_up.set()

    async def send_telemetry(self, batch: dict) -> bool:
        """A batch to every controller connected; a link gap is not worth a warning."""
        delivered = False
        for conn in list(self.connections):
            try:
                await timeouts.wait_for(conn.push("telemetry", batch), PUSH_TIMEOUT)
                delivered = True
            except (ConnectionLost, asyncio.TimeoutError) as exc:
                log.debug("telemetry not delivered to %s: %s", conn.name, exc)
        return delivered

    async def on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        pid, uid, _ = peer_credentials(writer)
        name = f"pid {pid} uid {uid}"
        if uid not in (0, os.getuid()):  # the socket is 0600; refuse anyway if that was loosened
            log.warning("refusing connection from %s", name)
            writer.close()
            return
        conn = RpcConnection(reader, writer, table=self.table, context=Peer(pid, uid), name=name,
                             frame_timeout=self.cfg.frame_timeout, idle_timeout=self.cfg.idle_timeout)
        self.connections.add(conn)
        log.info("connection from %s", name)
        try:
            await conn.run()
        finally:
            self.connections.discard(conn)
            if self.controller is conn:
                self.controller = None
                self.controller_up.clear()
            await conn.close()
            log.info("connection from %s closed: %s", name, conn.close_reason)

    async def push(self, name: str, body: dict) -> bool:
        """To every controller connected; whether at least one got it."""
        async def one(conn: RpcConnection) -> bool:
            try:
                await timeouts.wait_for(conn.push(name, body), PUSH_TIMEOUT)
                return True
            except (ConnectionLost, asyncio.TimeoutError) as exc:
                log.warning("could not push %s to %s: %s", name, conn.name, exc)
                return False
        return any(await asyncio.gather(*(one(c) for c in list(self.connections))))

    def release_idle_mps(self) -> None:
        """Stop the MPS daemons no live run needs, in a task of its own: the control program runs
        as each daemon's user, who can stall it (up to mps.TIMEOUT); the spool watch, and with it
        every other run's end, must not wait for that. One at a time; ends meanwhile ask again."""
        if self._mps_cleanup is not None and not self._mps_cleanup.done():
            self._mps_cleanup_again = True
            return
        self._mps_cleanup_again = False
        live = [r.spec for r in self.runs.runs.values() if not r.status.ended and r.spec]

        async def cleanup() -> None:
            try:
                await asyncio.to_thread(self.shares.release_idle, live, self.shares.prepared)
            except Exception:
                log.exception("stopping idle MPS daemons failed")
            if self._mps_cleanup_again:
                self._mps_cleanup = None
                self.release_idle_mps()
        self._mps_cleanup = asyncio.ensure_future(cleanup())

    async def watch_spool(self) -> None:
        while True:
            try:
                ended = self.runs.poll()
                for status in ended:
                    log.info("job %s.%s ended: exit_code=%s signal=%s reason=%s", status.job_id,
                             status.attempt, status.exit_code, status.signal, status.reason)
                    await self.push("run_exited", status.to_wire())
                self.adopter.ended((s.job_id, s.attempt) for s in ended)
                if ended and self.shares.any_daemon():  # MPS daemons no live sharing run needs any more
                    self.release_idle_mps()
            except Exception:  # a broken spool entry must not stop the watch for all the others
                log.exception("spool poll failed")
            try:  # the next poll: after poll_interval, or as soon as a shepherd exits
                await timeouts.wait_for(self.runs.exited.wait(), self.cfg.poll_interval)
            except asyncio.TimeoutError:
                pass
            self.runs.exited.clear()


STATUS_EVERY = 5.0  # seconds between STATUS= lines to systemd


def status_line(agent: Agent) -> str:
    """What `systemctl status hai-agent` shows."""
    running = sum(1 for r in agent.runs.runs.values() if not r.status.ended)
    return f"serving, {running} run(s) running, {len(agent.connections)} controller connection(s)"


async def serve(cfg: AgentConfig, notifier: Notifier | None = None) -> None:
    notifier = notifier or Notifier(None)
    agent = Agent(cfg)
    log.info("node %s: %d cpu(s), %d MiB, %d %s GPU(s)", cfg.name, agent.cpus, agent.mem_mb,
             len(agent.gpus), agent.gpu_backend)
    try:  # first: a second agent must not touch the spool
        sock = bind_socket(cfg.socket, 0o600, "agent")
    except SocketInUse as exc:
        raise ConfigError(str(exc)) from None
    agent.runs.setup()
    agent.starter.open()  # the zygote imports while the spool is read
    agent.runs.rebuild()
    agent.adopter.sweep()
    server = await asyncio.start_unix_server(agent.on_client, sock=sock)
    agent.steps.open()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    watcher = asyncio.create_task(agent.watch_spool())
    sampling = asyncio.create_task(agent.sampler.run(agent.live_runs, agent.send_telemetry)) if agent.sampler else None
    checker = asyncio.create_task(agent.health.run(agent.push))
    log.info("serving on %s", cfg.socket)
    notifier.ready(status_line(agent))

    async def status() -> str:
        return status_line(agent)
    heartbeat = asyncio.create_task(notifier.heartbeat(status, STATUS_EVERY))
    try:
        await stop.wait()
        log.info("shutting down; running jobs stay with their shepherds")
    finally:
        notifier.stopping("shutting down; running jobs stay with their shepherds")
        heartbeat.cancel()
        watcher.cancel()
        if sampling is not None:
            sampling.cancel()
            await asyncio.gather(sampling, return_exceptions=True)
        checker.cancel()
        agent.steps.close()
        agent.follows.close()
        agent.isolation.release()
        agent.starter.close()  # the zygote exits; the shepherds it forked are not its children
        await close_server(server, agent.connections, cfg.socket)


@click.command()
@click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False),
              help="agent TOML config file")
def main(config_path: str) -> None:
    """Run the hai node agent."""
    try:
        cfg = load_agent_config(config_path)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    logsetup.configure(cfg.log_level, "%(asctime)s %(name)s %(levelname)s %(message)s")
    if os.geteuid() != 0:
        log.warning("not running as root: jobs can only run as uid %d", os.geteuid())
    notifier = Notifier.from_environment()  # and out of os.environ: shepherds and jobs must not inherit it
    try:
        asyncio.run(serve(cfg, notifier))
    except (ConfigError, GpuError, OSError) as exc:
        raise click.ClickException(str(exc)) from None


if __name__ == "__main__":
    main()
