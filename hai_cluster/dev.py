"""hai-dev: a throwaway cluster on this machine (controller on SQLite + N local agents).

`hai-dev up` writes configs into DIR, starts the daemons in the background with their logs there,
records what it started in DIR/cluster.json, waits until every node responds, and prints the line
that points the CLI at it. `hai-dev down` stops exactly what `up` started, and the jobs still
running in it.

hai-dev is often run as root, with DIR under /tmp, so DIR must be the caller's alone: one that
`up` creates (0700), or one that already is the caller's and writable by nobody else, under
ancestors nobody else can rename (safefs.py). Every file is created there exclusively (a FIFO or a
config someone planted is refused, never read back by a daemon), and `down` signals only the
processes it can prove it or the agents started (devprocs.py), never whatever pid a file lists.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time

import click

from . import devprocs, safefs
from .agent import spool
from .cli.client import ClientError, ControllerClient

CLUSTER = "cluster.json"
CONTROLLER_MODULE = "hai_cluster.controller.daemon"
AGENT_MODULE = "hai_cluster.agent.daemon"
RUN_GRACE = 10.0  # seconds a job gets to leave after its shepherd's SIGTERM, then SIGKILL


def _toml(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)  # a JSON string is a TOML basic string: a quote in DIR cannot break out


def _open_dir(directory: str, create: bool) -> tuple[int, str]:
    try:
        return safefs.open_private_dir(directory, create=create)
    except safefs.UnsafePath as exc:
        raise click.ClickException(f"refusing to use {directory}: {exc}. hai-dev uses only a directory of "
                                   f"yours that nobody else can write (or one it creates); choose another")
    except FileNotFoundError:
        raise click.ClickException(f"no dev cluster in {directory} (no such directory)") from None


def _spawn(argv: list[str], dir_fd: int, log: str) -> tuple[subprocess.Popen, dict]:
    if safefs.exists(dir_fd, log):  # the previous cluster's log stays, as LOG.1
        os.replace(log, f"{log}.1", src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    out = safefs.create_file(dir_fd, log)
    try:
        # cwd=/: `python -m` must import the installed package, not one in the caller's directory.
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, cwd="/")
    finally:
        os.close(out)
    # Popen returns after the exec: the start time is the daemon's, and it is our child until we exit.
    return proc, {"pid": proc.pid, "starttime": spool.proc_starttime(proc.pid), "argv": argv}


@click.group()
def main() -> None:
    """Run a throwaway hai-cluster on this machine."""


@main.command()
@click.option("--dir", "directory", required=True, type=click.Path(file_okay=False),
              help="state directory: created (0700) if missing, else one of yours that only you can write")
@click.option("--nodes", default=2, show_default=True, type=click.IntRange(1, 64))
@click.option("--gpus-per-node", default=4, show_default=True, type=click.IntRange(0, 64))
@click.option("--cpus-per-node", default=0, show_default=True, type=click.IntRange(0, 4096),
              help="CPUs each node offers to jobs; 0 = the machine's count")
@click.option("--gpu-backend", type=click.Choice(["auto", "simulated"]), default=None,
              help="default: auto for one node (real GPUs if NVML finds any), simulated for several")
@click.option("--tick", default=0.5, show_default=True, type=float, help="scheduler tick, seconds")
@click.option("--timeout", default=60.0, show_default=True, type=float, help="seconds to wait for the nodes")
@click.option("--policy", type=click.Choice(["mlfq", "fifo"]), default="mlfq", show_default=True)
@click.option("--order", type=click.Choice(["gittins", "las"]), default=None,
              help="what sets an MLFQ job's level (default: production's, gittins)")
@click.option("--restart-cost", type=click.FloatRange(min=0), default=None,
              help="seconds a preempted job redoes; gittins: a run keeps its GPUs 10x this long "
                   "(default: production's 30)")
@click.option("--thresholds", help="las: MLFQ level thresholds in GPU-seconds, e.g. 10,1000 (default: production's)")
@click.option("--quanta", help="las: MLFQ quantum per level in seconds, e.g. 2,5,10 (default: production's)")
def up(directory: str, nodes: int, gpus_per_node: int, cpus_per_node: int, gpu_backend: str | None, tick: float,
       timeout: float, policy: str, order: str | None, restart_cost: float | None, thresholds: str | None,
       quanta: str | None) -> None:
    """Start a controller and NODES agents; print the export line for the CLI."""
    scheduler = f'[scheduler]\npolicy = "{policy}"\n'
    if order:
        scheduler += f'order = "{order}"\n'
    if restart_cost is not None:
        if not math.isfinite(restart_cost):
            raise click.BadParameter(f"--restart-cost must be a finite number of seconds, got {restart_cost!r}")
        scheduler += f"restart_cost = {restart_cost!r}\n"
    for key, value in (("thresholds", thresholds), ("quanta", quanta)):
        if value:
            try:
                numbers = [float(x) for x in value.split(",")]
            except ValueError:
                raise click.BadParameter(f"--{key} must be comma-separated numbers, got {value!r}") from None
            scheduler += f"{key} = {numbers}\n"
    if any(ord(c) < 32 or c in "\x7f?#%" for c in directory):
        raise click.BadParameter(f"no control characters or ?#% in DIR (it goes into a database URL): {directory!r}")
    dfd, d = _open_dir(directory, create=True)
    procs: dict[str, subprocess.Popen] = {}
    try:
        if safefs.exists(dfd, CLUSTER):
            raise click.ClickException(f"a dev cluster is already set up in {d}; run `hai-dev down --dir {d}` first")
        _start(dfd, d, procs, nodes, gpus_per_node, cpus_per_node, gpu_backend, tick, scheduler)
        _wait_up(d, procs, nodes, timeout)
    except BaseException as exc:
        _abort(dfd, procs)  # a failed `up` leaves nothing running
        if isinstance(exc, safefs.UnsafePath):
            raise click.ClickException(f"refusing to use {directory}: {exc}") from None
        raise
    finally:
        os.close(dfd)
    click.echo(f"export HAI_CONTROLLER={d}/controller.sock")


def _abort(dfd: int, procs: dict[str, subprocess.Popen]) -> None:
    for proc in procs.values():
        proc.terminate()
    for proc in procs.values():
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
    if procs:
        try:
            os.unlink(CLUSTER, dir_fd=dfd)
        except FileNotFoundError:
            pass


def _start(dfd: int, d: str, procs: dict[str, subprocess.Popen], nodes: int, gpus_per_node: int,
           cpus_per_node: int, gpu_backend: str | None, tick: float, scheduler: str) -> None:
    """Write the configs and start the daemons (into `procs` as they start); record them."""
    backend = gpu_backend or ("auto" if nodes == 1 else "simulated")
    names = [f"node{i}" for i in range(1, nodes + 1)]
    node_tables, records = [], {}
    for name in names:
        nd = f"{d}/{name}"
        nfd = safefs.open_private_subdir(dfd, name, nd, create=True)
        try:
            safefs.write_file(nfd, "agent.toml", replace=True, data=(
                f'[agent]\nname = "{name}"\nsocket = {_toml(nd + "/agent.sock")}\n'
                f'spool = {_toml(nd + "/spool")}\n'
                f'allow_root_jobs = true  # a dev cluster runs jobs as whoever started it\n'
                f'cpus = {cpus_per_node}\n\n'
                f'[gpus]\nbackend = "{backend}"\nsimulated_count = {gpus_per_node}\n').encode())
            procs[name], records[name] = _spawn(
                [sys.executable, "-m", AGENT_MODULE, "--config", f"{nd}/agent.toml"], nfd, "agent.log")
        finally:
            os.close(nfd)
        node_tables.append(f'[[nodes]]\nname = "{name}"\naddress = "127.0.0.1"\ntransport = "local"\n'
                           f'agent_socket = {_toml(nd + "/agent.sock")}\n')
    safefs.write_file(dfd, "controller.toml", replace=True, data=(
        f'[controller]\nsocket = {_toml(d + "/controller.sock")}\ndatabase = {_toml(f"sqlite:///{d}/hai.db")}\n'
        f'state_dir = {_toml(d)}\ntick_seconds = {tick}\n\n{scheduler}\n' + "\n".join(node_tables)).encode())
    procs["controller"], records["controller"] = _spawn(
        [sys.executable, "-m", CONTROLLER_MODULE, "--config", f"{d}/controller.toml"], dfd, "controller.log")
    safefs.write_file(dfd, CLUSTER, json.dumps({"procs": records, "nodes": names}).encode())


def _wait_up(d: str, procs: dict[str, subprocess.Popen], nodes: int, timeout: float) -> None:
    client = ControllerClient(f"{d}/controller.sock", timeout=10)
    deadline = time.monotonic() + timeout
    last = "controller not started"
    try:
        while time.monotonic() < deadline:
            dead = [n for n, proc in procs.items() if proc.poll() is not None]
            if dead:
                raise click.ClickException(f"{', '.join(dead)} exited at start; see the logs in {d}")
            try:
                reply = client.call("nodes", {})
                up_nodes = [n["name"] for n in reply["nodes"] if n["responding"]]
                if len(up_nodes) == nodes:
                    return
                last = f"{len(up_nodes)}/{nodes} nodes responding"
            except ClientError as exc:
                last = str(exc)
                client.close()
            time.sleep(0.2)
        raise click.ClickException(f"cluster did not come up within {timeout:g} s ({last}); logs in {d}")
    finally:
        client.close()


@main.command()
@click.option("--dir", "directory", required=True, type=click.Path(file_okay=False), help="state directory")
@click.option("--remove", is_flag=True, help="then delete the directory (a hai-dev one: it has controller.toml)")
def down(directory: str, remove: bool) -> None:
    """Stop the dev cluster in DIR and the jobs still running in it."""
    dfd, d = _open_dir(directory, create=False)
    try:
        try:
            info = devprocs.read_json(dfd, CLUSTER, f"{d}/{CLUSTER}")
        except safefs.UnsafePath as exc:
            raise click.ClickException(f"refusing to read {d}/{CLUSTER}: {exc}") from None
        if info is None and not remove:
            raise click.ClickException(f"no dev cluster in {d}")
        if info is not None:
            try:
                left = _stop_cluster(dfd, d, info)
            except OSError as exc:
                raise click.ClickException(f"cannot stop the dev cluster in {d}: {exc}") from None
            os.unlink(CLUSTER, dir_fd=dfd)
            click.echo(f"stopped the dev cluster in {d}" + (f" ({left})" if left else ""))
        if remove:
            if not safefs.exists(dfd, "controller.toml"):
                raise click.ClickException(f"{d} does not look like a hai-dev directory (no controller.toml); "
                                           f"not removed")
            shutil.rmtree(d)  # symlink-safe (fd-based); its ancestors were proven stable
            click.echo(f"removed {d}")
    finally:
        os.close(dfd)


def _stop_cluster(dfd: int, d: str, info: object) -> str:
    """Stop the controller, the agents, then every run's shepherd and job; say what survived."""
    recs = info.get("procs") if isinstance(info, dict) else None
    names = info.get("nodes") if isinstance(info, dict) else None
    if not isinstance(recs, dict) or not isinstance(names, list) or not all(
            isinstance(n, str) and n.startswith("node") and n[4:].isdigit() for n in names):
        raise click.ClickException(f"{d}/{CLUSTER} is not one that this hai-dev up wrote (an older one's? "
                                   f"stop its daemons by hand, then remove the file)")
    expected = {"controller": f"{d}/controller.toml", **{n: f"{d}/{n}/agent.toml" for n in names}}
    survivors = []
    for group in (["controller"], names):  # the controller first: it dispatches no more runs
        procs = []
        for what in group:
            rec = recs.get(what)
            argv = rec.get("argv") if isinstance(rec, dict) else None
            if isinstance(argv, list) and argv[-2:] == ["--config", expected[what]]:
                p = devprocs.claim_daemon(what, rec)
                if p is not None:
                    procs.append(p)
        survivors += devprocs.kill(devprocs.stop(procs, 10.0))
        for p in procs:
            p.close()
    ended, survivors_runs = _stop_runs(dfd, d, names)
    survivors += survivors_runs
    notes = [f"{ended} job run(s) ended"] if ended else []
    if survivors:
        notes.append("still alive after SIGKILL: " + ", ".join(f"{p.what} (pid {p.pid})" for p in survivors))
    return "; ".join(notes)


def _runs(dfd: int, d: str, names: list[str]) -> list[tuple[devprocs.Proc | None, devprocs.Proc | None]]:
    """(shepherd, job) of every run in the nodes' spools whose shepherd or job is alive."""
    out = []
    for name in names:
        path, fds = f"{d}/{name}", []
        try:
            fds.append(safefs.open_private_subdir(dfd, name, path))
            for part in ("spool", spool.RUNS):
                path += f"/{part}"
                fds.append(safefs.open_private_subdir(fds[-1], part, path))
            for entry in os.listdir(fds[-1]):
                if spool.parse_run_dir_name(entry) is None:
                    continue
                run_dir = f"{path}/{entry}"
                rfd = safefs.open_private_subdir(fds[-1], entry, run_dir)
                try:
                    shepherd = devprocs.read_json(rfd, spool.SHEPHERD, f"{run_dir}/{spool.SHEPHERD}")
                    job = devprocs.read_json(rfd, spool.JOB, f"{run_dir}/{spool.JOB}")
                finally:
                    os.close(rfd)
                pair = devprocs.claim_run(run_dir, shepherd, job)
                if pair != (None, None):
                    out.append(pair)
        except FileNotFoundError:
            pass  # no spool (the agent never started), or a run removed meanwhile
        except safefs.UnsafePath as exc:
            click.echo(f"hai-dev: not looking into {path}: {exc}", err=True)
        finally:
            for fd in fds:
                os.close(fd)
    return out


def _stop_runs(dfd: int, d: str, names: list[str]) -> tuple[int, list[devprocs.Proc]]:
    """Shepherds outlive their agent by design; in a throwaway cluster they go too. SIGTERM makes a
    shepherd end its job as on a node going down (signal, grace); a job still there after RUN_GRACE
    is killed, and then its shepherd, which cleans up after it, leaves."""
    shepherds: dict[int, devprocs.Proc] = {}
    jobs: dict[int, devprocs.Proc] = {}
    deadline = time.monotonic() + RUN_GRACE
    try:
        while True:  # rescan: a shepherd the agent forked as it stopped records itself a moment later
            for pair in _runs(dfd, d, names):
                for p, seen in zip(pair, (shepherds, jobs)):
                    if p is not None and p.pid in seen:
                        p.close()  # claimed on an earlier pass
                    elif p is not None:
                        seen[p.pid] = p
                        if seen is shepherds:
                            p.signal(signal.SIGTERM)
            if not any(s.alive() for s in shepherds.values()) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        devprocs.kill(list(jobs.values()))  # those still there (and any whose shepherd died before)
        survivors = devprocs.kill(devprocs.wait(list(shepherds.values()), 5.0))
        survivors += devprocs.wait(list(jobs.values()), 0)
        return len(shepherds), survivors
    finally:
        for p in (*shepherds.values(), *jobs.values()):
            p.close()
