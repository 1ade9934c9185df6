"""hai-dev: a throwaway cluster on this machine (controller on SQLite + N local agents).

`hai-dev up` writes configs into DIR, starts the daemons in the background with pid files and
logs there, waits until every node responds, and prints the line that points the CLI at it.
`hai-dev down` stops exactly what `up` started, and the jobs still running in it.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import click

from .cli.client import ClientError, ControllerClient


def _write(path: Path, text: str) -> None:
    path.write_text(text)


def _spawn(argv: list[str], log: Path, pidfile: Path) -> int:
    with open(log, "ab") as out:
        # cwd=/: `python -m` must import the installed package, not one in the caller's directory.
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, cwd="/")
    pidfile.write_text(f"{proc.pid}\n")
    return proc.pid


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _stop(pid: int, timeout: float = 10.0) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _alive(pid):
        try:  # reap it if it is our child (it is not, normally)
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.05)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)


@click.group()
def main() -> None:
    """Run a throwaway hai-cluster on this machine."""


@main.command()
@click.option("--dir", "directory", required=True, type=click.Path(file_okay=False), help="state directory")
@click.option("--nodes", default=2, show_default=True, type=click.IntRange(1, 64))
@click.option("--gpus-per-node", default=4, show_default=True, type=click.IntRange(0, 64))
@click.option("--cpus-per-node", default=0, show_default=True, type=click.IntRange(0, 4096),
              help="CPUs each node offers to jobs; 0 = the machine's count")
@click.option("--gpu-backend", type=click.Choice(["auto", "simulated"]), default=None,
              help="default: auto for one node (real GPUs if NVML finds any), simulated for several")
@click.option("--tick", default=0.5, show_default=True, type=float, help="scheduler tick, seconds")
@click.option("--timeout", default=60.0, show_default=True, type=float, help="seconds to wait for the nodes")
@click.option("--policy", type=click.Choice(["mlfq", "fifo"]), default="mlfq", show_default=True)
@click.option("--thresholds", help="MLFQ level thresholds in GPU-seconds, e.g. 10,1000 (default: production's)")
@click.option("--quanta", help="MLFQ quantum per level in seconds, e.g. 2,5,10 (default: production's)")
def up(directory: str, nodes: int, gpus_per_node: int, cpus_per_node: int, gpu_backend: str | None, tick: float,
       timeout: float, policy: str, thresholds: str | None, quanta: str | None) -> None:
    """Start a controller and NODES agents; print the export line for the CLI."""
    d = Path(directory).resolve()
    d.mkdir(parents=True, exist_ok=True)
    if (d / "cluster.json").exists():
        raise click.ClickException(f"a dev cluster is already set up in {d}; run `hai-dev down --dir {d}` first")
    scheduler = f'[scheduler]\npolicy = "{policy}"\n'
    for key, value in (("thresholds", thresholds), ("quanta", quanta)):
        if value:
            try:
                numbers = [float(x) for x in value.split(",")]
            except ValueError:
                raise click.BadParameter(f"--{key} must be comma-separated numbers, got {value!r}") from None
            scheduler += f"{key} = {numbers}\n"
    backend = gpu_backend or ("auto" if nodes == 1 else "simulated")
    names = [f"node{i}" for i in range(1, nodes + 1)]
    node_tables = []
    pids: dict[str, int] = {}
    for name in names:
        nd = d / name
        nd.mkdir(exist_ok=True)
        _write(nd / "agent.toml",
               f'[agent]\nname = "{name}"\nsocket = "{nd}/agent.sock"\nspool = "{nd}/spool"\n'
               f'allow_root_jobs = true  # a dev cluster runs jobs as whoever started it\n'
               f'cpus = {cpus_per_node}\n\n'
               f'[gpus]\nbackend = "{backend}"\nsimulated_count = {gpus_per_node}\n')
        node_tables.append(f'[[nodes]]\nname = "{name}"\naddress = "127.0.0.1"\ntransport = "local"\n'
                           f'agent_socket = "{nd}/agent.sock"\n')
        pids[name] = _spawn([sys.executable, "-m", "hai_cluster.agent.daemon", "--config", str(nd / "agent.toml")],
                            nd / "agent.log", nd / "agent.pid")
    _write(d / "controller.toml",
           f'[controller]\nsocket = "{d}/controller.sock"\ndatabase = "sqlite:///{d}/hai.db"\n'
           f'state_dir = "{d}"\ntick_seconds = {tick}\n\n{scheduler}\n' + "\n".join(node_tables))
    pids["controller"] = _spawn([sys.executable, "-m", "hai_cluster.controller.daemon", "--config",
                                 str(d / "controller.toml")], d / "controller.log", d / "controller.pid")
    (d / "cluster.json").write_text(json.dumps({"pids": pids, "nodes": names}))
    client = ControllerClient(str(d / "controller.sock"), timeout=10)
    deadline = time.monotonic() + timeout
    last = "controller not started"
    while time.monotonic() < deadline:
        dead = [n for n, pid in pids.items() if not _alive(pid)]
        if dead:
            raise click.ClickException(f"{', '.join(dead)} exited at start; see the logs in {d}")
        try:
            reply = client.call("nodes", {})
            up_nodes = [n["name"] for n in reply["nodes"] if n["responding"]]
            if len(up_nodes) == nodes:
                break
            last = f"{len(up_nodes)}/{nodes} nodes responding"
        except ClientError as exc:
            last = str(exc)
            client.close()
        time.sleep(0.2)
    else:
        raise click.ClickException(f"cluster did not come up within {timeout:.0f} s ({last}); logs in {d}")
    client.close()
    click.echo(f"export HAI_CONTROLLER={d}/controller.sock")


@main.command()
@click.option("--dir", "directory", required=True, type=click.Path(file_okay=False), help="state directory")
def down(directory: str) -> None:
    """Stop the dev cluster in DIR and the jobs still running in it."""
    d = Path(directory).resolve()
    try:
        info = json.loads((d / "cluster.json").read_text())
    except FileNotFoundError:
        raise click.ClickException(f"no dev cluster in {d}") from None
    _stop(info["pids"]["controller"])
    for name in info["nodes"]:
        _stop(info["pids"][name])
        for pidfile in (d / name / "spool" / "runs").glob("*/shepherd.pid"):
            # Shepherds outlive their agent by design; in a throwaway cluster they go too.
            try:
                _stop(int(pidfile.read_text().split()[0]), timeout=5)
            except (ValueError, OSError):
                pass
    (d / "cluster.json").unlink()
    click.echo(f"stopped the dev cluster in {d}")
