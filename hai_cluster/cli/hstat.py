"""hstat: live GPU telemetry, like htop for the cluster.

`hstat` shows nodes, their GPUs and the running jobs, refreshed in place (rich Live) until ^C;
`hstat --once` prints them once as plain tables. `hstat JOB` shows one job's runs (with their
rollups) and its recent history, with a small chart of its GPU utilization."""
from __future__ import annotations

import sys
import time

import click

from .client import ClientError, ControllerClient
from .common import call, fail, print_table, shown
from .gpuview import (GPU_HEADERS, GPU_RIGHT, JOB_HEADERS, JOB_RIGHT, NODE_HEADERS, NODE_RIGHT, clock, gpu_rows,
                      job_rows, node_rows)
from .telemetry_fmt import energy, mib, num, pct, sparkline, used_of_share

HISTORY_ROWS = 10


def print_cluster(reply: dict) -> None:
    print_table(NODE_HEADERS, node_rows(reply), right=NODE_RIGHT)
    print()
    print_table(GPU_HEADERS, gpu_rows(reply), right=GPU_RIGHT)
    print()
    if reply["jobs"]:
        print_table(JOB_HEADERS, job_rows(reply), right=JOB_RIGHT)
    else:
        print("no running jobs")
    for e in reply["events"][-5:]:
        print(f"{clock(e['t'])} node {e['node']} GPU {e['gpu']}: {e['kind']} ({e['value']})")


def _table(title: str, headers, rows, right):
    from rich.table import Table
    from rich.text import Text
    table = Table(title=title, title_justify="left", box=None, header_style="bold", pad_edge=False)
    for i, h in enumerate(headers):
        table.add_column(h, justify="right" if i in right else "left", no_wrap=True)
    for row in rows:
        table.add_row(*(Text(str(c)) for c in row))  # job names are the users': never markup
    return table


def live(interval: float) -> None:
    from rich.console import Group
    from rich.live import Live
    from rich.text import Text

    client = ControllerClient()

    def view():
        try:
            try:
                reply = shown(client.call("telemetry", {}))
            except ClientError:  # e.g. dropped as idle (a long -i): a read, so ask again at once
                client.close()
                reply = shown(client.call("telemetry", {}))
        except ClientError as exc:
            client.close()
            return Text(f"hstat: {exc} (retrying)", style="red")
        parts = [Text(f"hstat  {clock(reply['now'])}  every {interval:g}s  (^C to quit)", style="bold"),
                 _table("nodes", NODE_HEADERS, node_rows(reply), NODE_RIGHT),
                 _table("GPUs", GPU_HEADERS, gpu_rows(reply), GPU_RIGHT),
                 _table("running jobs", JOB_HEADERS, job_rows(reply), JOB_RIGHT)]
        parts += [Text(f"{clock(e['t'])} node {e['node']} GPU {e['gpu']}: {e['kind']} ({e['value']})", style="yellow")
                  for e in reply["events"][-5:]]
        return Group(*parts)
    try:
        with Live(view(), auto_refresh=False, screen=False) as display:
            while True:
                time.sleep(interval)
                display.update(view(), refresh=True)
    except KeyboardInterrupt:
        pass
    finally:
        client.close()


def print_job(reply: dict) -> None:
    job, runs, points = reply["job"], reply["runs"], reply["history"]
    print(f"job {job['id']} ({job['name']}, {job['user']}): {job['state']}"
          + (f" on {job['nodelist']}" if job.get("nodelist") else "")
          + (", GPUs idle" if job.get("idle") else ""))
    if runs:
        print_table(["RUN", "STATE", "NODELIST", "GPUS", "GPU_UTIL", "MAX_UTIL", "MAX_GPU_MEM", "ENERGY", "CPU",
                     "SAMPLES"],
                    [[str(r["attempt"]), r["state"], r["nodelist"], f"{r.get('gpu_charge') or r['gpus']:g}",
                      pct(r.get("gpu_util_mean"), 1),
                      pct(r.get("gpu_util_max")), mib(r.get("gpu_mem_max_mb")), energy(r.get("energy_j")) or "-",
                      pct(r.get("cpu_mean"), 1), str(r.get("telemetry_samples") or 0)] for r in runs],
                    right=[0, 3, 4, 5, 6, 7, 8, 9])
    if job.get("gpu_util") is not None:  # the live run's rollup so far (stored ones lag a little)
        print(f"live run: GPU util now {pct(job['gpu_util'])}, mean {pct(job.get('run_gpu_util_mean'), 1)}, "
              f"max {pct(job.get('run_gpu_util_max'))}, peak GPU memory "
              f"{used_of_share(job.get('run_gpu_mem_max_mb'), job.get('gpu_share_mb'))}, "
              f"energy {energy(job.get('run_energy_j')) or '0'} J")
    if not points:
        print("no recent samples")
        return
    print()
    print(f"GPU utilization, last {min(len(points), 60)} samples ({clock(points[0]['t'])} .. {clock(points[-1]['t'])}):")
    print(f"100% |{sparkline([p['gpu_util'] for p in points])}|")
    print(f"GPU memory (peak {mib(max(p['gpu_mem_mb'] or 0 for p in points))}):")
    top = max(p["gpu_mem_mb"] or 0 for p in points) or 1
    print(f"     |{sparkline([p['gpu_mem_mb'] for p in points], top=top)}|")
    print()
    print_table(["TIME", "NODE", "GPU_UTIL", "GPU_MEM", "POWER", "CPU"],
                [[clock(p["t"]), p["node"], pct(p["gpu_util"]), mib(p["gpu_mem_mb"]), num(p["power_w"], "W"),
                  pct(p["cpu_pct"])] for p in points[-HISTORY_ROWS:]], right=[2, 3, 4, 5])


@click.command(context_settings={"help_option_names": ["--help"]})
@click.argument("job", required=False)
@click.option("--once", is_flag=True, help="print the tables once, as plain text, and exit")
@click.option("-i", "--interval", type=click.FloatRange(min=0.2), default=2.0, show_default=True,
              help="seconds between refreshes of the live view")
def main(job, once, interval):
    """Live GPU telemetry of the nodes and running jobs; with JOB, that job's history."""
    if job is not None:
        try:
            job_id = int(job)
        except ValueError:
            fail("hstat", f"invalid job id {job!r}")
        print_job(call("hstat", "telemetry", {"job_id": job_id}))
        return
    if once or not sys.stdout.isatty():
        print_cluster(call("hstat", "telemetry", {}))
        return
    live(interval)
