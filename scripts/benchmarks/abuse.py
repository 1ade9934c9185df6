"""One user floods the controller with submissions; how fast is everyone else answered?

A local cluster (controller + one agent, SQLite) with `[limits] max_pending = LIMIT`. FLOODERS
processes run as the test user `haitest`, each submitting held jobs in a loop as fast as the
controller answers, and keep going after the limit refuses them (as a runaway script would). The
benchmark meanwhile times `ping` and a `jobs` listing of another user, first on the idle
controller, then during the flood. Needs root and the test users (as scripts/test makes them):

    .venv/bin/python scripts/benchmarks/abuse.py [--limit 2000] [--flooders 4] [--seconds 20]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hai_cluster.cli.client import ClientError, ControllerClient  # noqa: E402
from tests.e2e.harness import BIN, OTHER_USER, TEST_USER, ensure_user, start_local_cluster, user_dir  # noqa: E402

FLOOD = """
import os, sys, time
from hai_cluster.cli.client import ClientError, ControllerClient
c = ControllerClient()
body = {"script": "#!/bin/sh\\ntrue\\n", "cwd": os.getcwd(), "option_args": ["--hold"]}
ok = refused = 0
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    try:
        c.call("submit", body)
        ok += 1
    except ClientError as exc:
        refused += 1
        last = str(exc)
print(ok, refused, last if refused else "")
"""


def timed(client: ControllerClient, method: str, body: dict, seconds: float) -> list[float]:
    out = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t = time.perf_counter()
        client.call(method, body)
        out.append((time.perf_counter() - t) * 1000)
        time.sleep(0.02)
    return out


def summary(ms: list[float]) -> str:
    ms = sorted(ms)
    return f"n={len(ms):5d}  p50={statistics.median(ms):7.2f} ms  p99={ms[int(len(ms) * 0.99) - 1]:7.2f} ms"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=int, default=2000)
    ap.add_argument("--flooders", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=20.0)
    args = ap.parse_args()
    pw = ensure_user(TEST_USER)
    ensure_user(OTHER_USER)
    cluster = start_local_cluster(controller_toml=f"[limits]\nmax_pending = {args.limit}\n")
    try:
        client = ControllerClient(cluster.socket)
        listing = {"users": [OTHER_USER]}
        idle = {m: timed(client, m, b, 3.0) for m, b in (("ping", {}), ("jobs", listing))}
        d = user_dir(cluster.workdir, TEST_USER)
        (d / "flood.py").write_text(FLOOD)
        procs = [subprocess.Popen([str(BIN / "python"), str(d / "flood.py"), str(args.seconds)], cwd=d,
                                  user=pw.pw_uid, group=pw.pw_gid, extra_groups=[], stdout=subprocess.PIPE,
                                  text=True, env={"HAI_CONTROLLER": cluster.socket, "PATH": "/usr/bin:/bin"})
                 for _ in range(args.flooders)]
        time.sleep(1.0)
        busy = {m: timed(client, m, b, args.seconds / 2 - 1) for m, b in (("ping", {}), ("jobs", listing))}
        results = [p.communicate()[0].split(" ", 2) for p in procs]
        accepted = sum(int(r[0]) for r in results)
        refused = sum(int(r[1]) for r in results)
        print(f"{args.flooders} flooders as {TEST_USER} for {args.seconds:g} s: {accepted} accepted "
              f"(limit {args.limit}), {refused} refused ({refused / args.seconds:.0f}/s)")
        print(f"refusal: {next((r[2].strip() for r in results if r[2].strip()), '-')}")
        for m in ("ping", "jobs"):
            print(f"{m:5s} idle:  {summary(idle[m])}")
            print(f"{m:5s} flood: {summary(busy[m])}")
        client.close()
    except ClientError as exc:
        print(f"benchmark failed: {exc}", file=sys.stderr)
        sys.exit(1)
    finally:
        cluster.close()


if __name__ == "__main__":
    main()
