"""hstat: live GPU telemetry, like htop for the cluster.

`hstat` shows nodes, their GPUs and the running jobs, refreshed in place (rich Live) until ^C;
`hstat --once` prints them once as plain tables. `hstat JOB` shows one job's runs (with their
rollups) and its recent history, with a small chart of its GPU utilization."""
from __future__ import annotations

import sys
import time

import click

from .client import ClientError, ControllerClient
from .common import call, fail, fit_columns, print_table, shown, terminal_columns
from .gpuview import (GPU_DROPPABLE, GPU_HEADERS, GPU_RIGHT, JOB_DROPPABLE, JOB_HEADERS, JOB_RIGHT, NODE_DROPPABLE,
                      NODE_HEADERS, NODE_RIGHT, clock, gpu_rows, job_rows, node_rows)
from .telemetry_fmt import energy, mib, num, pct, sparkline, used_of_share

HISTORY_ROWS = 10


def tables(reply: dict, width: int) -> list[tuple[str, list[str], list[list[str]], list[int], list[str]]]:
    """The three tables of the cluster view, each narrowed to the terminal's width by leaving out
    its least needed columns: (title, headers, rows, right-aligned, left out)."""
    out = []
    for title, headers, rows, right, droppable in (
            ("nodes", NODE_HEADERS, node_rows(reply), NODE_RIGHT, NODE_DROPPABLE),
            ("GPUs", GPU_HEADERS, gpu_rows(reply), GPU_RIGHT, GPU_DROPPABLE),
            ("running jobs", JOB_HEADERS, job_rows(reply), JOB_RIGHT, JOB_DROPPABLE)):
        out.append((title, *fit_columns(headers, rows, right, droppable, width)))
    return out


def _left_out(dropped: list[str]) -> str:
    return f"({', '.join(dropped)} left out to fit the terminal; wider shows them)" if dropped else ""


def print_cluster(reply: dict) -> None:
    width = terminal_columns() if sys.stdout.isatty() else 10**6  # piped: every column
    for title, headers, rows, right, dropped in tables(reply, width):
        if title == "running jobs" and not rows:
            print("no running jobs")
            continue
        print_table(headers, rows, right=right)
        if dropped:
            print(_left_out(dropped))
        if title != "running jobs":
            print()
    for e in reply["events"][-5:]:
        print(f"{clock(e['t'])} node {e['node']} GPU {e['gpu']}: {e['kind']} ({e['value']})")


def _table(title: str, headers, rows, right):
    from rich.table import Table
    from rich.text import Text
    table = Table(title=title, title_justify="left", box=None, header_style="bold", pad_edge=False,
                  padding=(0, 1, 0, 0))  # one space between columns, as fit_columns counts
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
        parts = [Text(f"hstat  {clock(reply['now'])}  every {interval:g}s  (^C to quit)", style="bold")]
        for title, headers, rows, right, dropped in tables(reply, terminal_columns()):
            parts.append(_table(title, headers, rows, right))
            if dropped:
                parts.append(Text(_left_out(dropped), style="dim"))
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
