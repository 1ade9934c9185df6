"""Controller takeover time: two controllers on a private PostgreSQL, one local agent; SIGKILL the
active one and time until the standby serves clients and until it has the node back.

    .venv/bin/python scripts/benchmarks/takeover.py [--leases 2,5,15] [--reps 3]

Prints a markdown table (docs/RELIABILITY.md quotes it). Needs root and the PostgreSQL server
binaries (the same as the tests). The takeover is bounded by lease_duration (the standby takes the
lease once the dead one's has expired on the database's clock) plus its poll (min(1 s, lease/10))
plus the start of a controller (recovery, agent links)."""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from hai_cluster.cli.client import ClientError, ControllerClient  # noqa: E402
from scripts.benchmarks.polling import wait_until  # noqa: E402
from tests.infra.postgres import PrivatePostgres  # noqa: E402


def _answer(sock: str):
    client = ControllerClient(sock, timeout=5)
    try:
        return client.call("nodes", {})
    except ClientError:
        return None
    finally:
        client.close()


def _wait(pred, timeout: float = 120.0, interval: float = 0.02):
    return wait_until(pred, timeout, "the controller", interval)


def _daemon(module: str, config: Path, log: Path) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", module, "--config", str(config)], stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)


def measure(lease: float, reps: int, pg: PrivatePostgres) -> list[tuple[float, float]]:
    db = f"takeover_{int(lease * 1000)}_{os.getpid()}"
    url = pg.create_database(db)
    base = Path(tempfile.mkdtemp(prefix="hai-takeover-", dir="/tmp"))
    procs: dict[str, subprocess.Popen] = {}
    try:
        (base / "agent.toml").write_text(f'[agent]\nname = "n1"\nsocket = "{base}/agent.sock"\n'
                                         f'spool = "{base}/spool"\n[gpus]\nbackend = "simulated"\n')
        for name in ("a", "b"):
            (base / f"{name}.toml").write_text(
                f'[controller]\nsocket = "{base}/{name}.sock"\ndatabase = "{url}"\ntick_seconds = 0.3\n'
                f'lease_duration = {lease}\nping_interval = 0.5\n'
                f'[[nodes]]\nname = "n1"\ntransport = "local"\nagent_socket = "{base}/agent.sock"\n')
        procs["agent"] = _daemon("hai_cluster.agent.daemon", base / "agent.toml", base / "agent.log")
        procs["a"] = _daemon("hai_cluster.controller.daemon", base / "a.toml", base / "a.log")
        _wait(lambda: (_answer(f"{base}/a.sock") or {}).get("nodes"))
        procs["b"] = _daemon("hai_cluster.controller.daemon", base / "b.toml", base / "b.log")
        active, standby = "a", "b"
        results = []
        for _ in range(reps):
            time.sleep(min(lease, 3.0))  # the standby has seen the lease; a renewal or two went by
            t0 = time.monotonic()
            procs[active].send_signal(signal.SIGKILL)
            procs[active].wait()
            sock = f"{base}/{standby}.sock"
            serving = _wait(lambda: _answer(sock) is not None and time.monotonic()) - t0
            _wait(lambda: any(n["responding"] for n in (_answer(sock) or {}).get("nodes", [])))
            results.append((serving, time.monotonic() - t0))
            procs[active] = _daemon("hai_cluster.controller.daemon", base / f"{active}.toml", base / f"{active}.log")
            active, standby = standby, active
        return results
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
        shutil.rmtree(base, ignore_errors=True)
        pg.drop_database(db)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--leases", default="2,5,15", help="lease_duration values, seconds")
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    rows = ["| lease_duration | takeovers | serving clients (median, max) | node back (median, max) |",
            "|---|---|---|---|"]
    with PrivatePostgres(database=None) as pg:
        for lease in (float(x) for x in args.leases.split(",")):
            r = measure(lease, args.reps, pg)
            serve, nodes = [x[0] for x in r], [x[1] for x in r]
            rows.append(f"| {lease:g} s | {len(r)} | {statistics.median(serve):.2f} s, {max(serve):.2f} s | "
                        f"{statistics.median(nodes):.2f} s, {max(nodes):.2f} s |")
            print(rows[-1], file=sys.stderr, flush=True)
    print("\n".join(rows))


if __name__ == "__main__":
    main()
