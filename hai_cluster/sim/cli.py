"""hai-sim: `hai-sim run TRACE --cluster 16x8 --policy mlfq --policy fifo ...`."""
from __future__ import annotations

import dataclasses
import importlib.util
import sys
import tomllib
from typing import Any, Sequence

import click

from ..core.hostlist import expand
from ..core.reservation import PERIODS, Reservation, ReservationError, parse_flags
from ..scheduling.registry import POLICIES, SHARING_POLICIES, make_policy
from .cluster import Cluster, parse_cluster
from .engine import PolicyError, SimulationError
from .traces import TraceError, load_trace, prepare
from .runner import Point, parse_sweep, points, run_all

PROG = "hai-sim"


class UsageProblem(click.ClickException):
    """Bad input (trace, cluster, options): one line, exit 2."""
    exit_code = 2


class SimFailure(click.ClickException):
    """A policy bug or a replay that cannot finish: one line, exit 1."""
    exit_code = 1


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Replay GPU-cluster traces through hai-cluster's scheduling policies."""


def _option_value(text: str) -> Any:
    """A TOML literal (3600, [1, 2], true, "x"), else the plain string."""
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text
    return tuple(value) if isinstance(value, list) else value


def policy_options(specs: Sequence[str], mlfq_config: str | None) -> dict[str, dict[str, Any]]:
    """-o POLICY.KEY=VALUE options, and the [scheduler] table of a controller.toml for mlfq."""
    out: dict[str, dict[str, Any]] = {}
    for spec in specs:
        lhs, sep, value = spec.partition("=")
        name, dot, key = lhs.strip().partition(".")
        if not sep or not dot or not key:
            raise ValueError(f"bad option {spec!r}: expected POLICY.KEY=VALUE, e.g. tiresias.thresholds=[3600,36000]")
        out.setdefault(name, {})[key.strip()] = _option_value(value.strip())
    if mlfq_config:
        overrides = out.pop("mlfq", {})
        config = mlfq_from_toml(mlfq_config)
        try:
            out["mlfq"] = {"config": dataclasses.replace(config, **overrides)}
        except TypeError as exc:
            raise ValueError(f"bad mlfq option: {exc}") from None
    return out


def mlfq_from_toml(path: str):
    """The MLFQ settings of a controller.toml ([scheduler]) or of a file holding just that table,
    read by the controller's own parser, so hai-sim replays exactly what the controller would run."""
    from ..config import ConfigError, parse_scheduler
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file") from None
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"{path}: {exc}") from None
    table = doc.get("scheduler", doc)
    try:
        return parse_scheduler(path, table).mlfq
    except ConfigError as exc:
        raise ValueError(str(exc)) from None


@cli.command()
@click.argument("trace")
@click.option("--cluster", "cluster_spec", default="16x8", show_default=True, help="NODESxGPUS")
@click.option("--gpu-sharing", is_flag=True,
              help="jobs asking for a fraction of a GPU share cards (mlfq, fifo); else each takes a whole card")
@click.option("-p", "--policy", "policies", multiple=True,
              help="policy to replay (repeat; default: every registered one)")
@click.option("--baseline", default="fifo", show_default=True, help="policy the JCT ratios are relative to")
@click.option("--restart-cost", type=float, default=30.0, show_default=True,
              help="seconds of work redone on every GPU of a job after each preemption")
@click.option("--restart-cost-per-gpu", type=float, default=0.0, show_default=True,
              help="extra redo seconds per GPU of the job (bigger jobs restore slower)")
@click.option("--sweep", "sweeps", multiple=True, metavar="KEY=V1,V2",
              help="repeat the runs for each value: restart-cost, restart-cost-per-gpu, load-scale")
@click.option("--load-scale", type=float, default=1.0, show_default=True,
              help="divide inter-arrival times by this (2 = twice the load)")
@click.option("--limit", type=int, help="only the first N jobs")
@click.option("--seed", type=int, help="shuffle jobs that arrive at the same instant (default: file order)")
@click.option("--vc", help="Philly traces: the virtual cluster to replay")
@click.option("--csv", "csv_path", metavar="FILE", help="per-job results")
@click.option("--json", "json_path", metavar="FILE", help="summary as JSON")
@click.option("--plot", "plot_path", metavar="FILE.png", help="JCT CDF and utilization over time (matplotlib)")
@click.option("--mlfq-config", metavar="FILE.toml", help="controller.toml (or its [scheduler] table) for mlfq")
@click.option("--reservation", "reservations", multiple=True, metavar="NODES:START:SECONDS[:FLAGS]",
              help="hold NODES (a hostlist of the cluster's node01...) from START (seconds on the trace's clock) "
                   "for SECONDS, as scontrol create reservation does: no trace job may use them then; FLAGS "
                   "as its Flags= (DAILY or WEEKLY: the window comes back every day or week)")
@click.option("--known-sizes", is_flag=True,
              help="a bound, not a cluster: the size model that mlfq's order reads is the trace's own "
                   "distribution of job sizes from the start (still no job's own duration), learning "
                   "nothing during the replay")
@click.option("-o", "--option", "options", multiple=True, metavar="POLICY.KEY=VALUE",
              help="a policy setting, e.g. mlfq.quanta=[300,900,1800] or tiresias.thresholds=[3600,36000]")
def run(trace, cluster_spec, gpu_sharing, policies, baseline, restart_cost, restart_cost_per_gpu, sweeps, load_scale,
        limit, seed, vc, csv_path, json_path, plot_path, mlfq_config, reservations, known_sizes, options):
    """Replay TRACE on a simulated cluster under each policy and compare them."""
    try:
        cluster = dataclasses.replace(parse_cluster(cluster_spec), gpu_sharing=gpu_sharing)
        names = list(dict.fromkeys(policies or POLICIES))
        unknown = [n for n in names + [baseline] if n not in POLICIES]
        if unknown:
            raise ValueError(f"unknown policy {unknown[0]!r} (known: {', '.join(sorted(POLICIES))})")
        if baseline not in names:
            names.append(baseline)  # ratios need it
        if gpu_sharing and set(names) - set(SHARING_POLICIES):
            raise ValueError(f"--gpu-sharing works with the {' and '.join(SHARING_POLICIES)} policies (they place "
                             f"card shares), not {', '.join(sorted(set(names) - set(SHARING_POLICIES)))}")
        opts = policy_options(options, mlfq_config)
        if set(opts) - set(names):
            raise ValueError(f"options for a policy not being run: {', '.join(sorted(set(opts) - set(names)))}")
        for name in names:  # refuse bad options now, not after the other replays ran
            try:
                make_policy(name, **opts.get(name, {}))
            except (TypeError, ValueError) as exc:
                raise ValueError(f"policy options: {exc}") from None
        if plot_path:
            if importlib.util.find_spec("matplotlib") is None:
                raise ValueError("--plot needs matplotlib: pip install 'hai-cluster[plot]'")
        sweep = parse_sweep(sweeps)
        pts = points(Point(restart_cost, restart_cost_per_gpu, load_scale), sweep)
        for pt in pts:
            if pt.restart_cost < 0 or pt.restart_cost_per_gpu < 0:
                raise ValueError("restart costs must not be negative")
            if pt.load_scale <= 0:
                raise ValueError(f"--load-scale must be positive, got {pt.load_scale:g}")
        held = [sim_reservation(i, text, cluster) for i, text in enumerate(reservations)]
        tr = load_trace(trace, vc=vc)
        selected = prepare(tr.jobs, limit=limit, seed=seed)
    except (TraceError, ValueError) as exc:
        raise UsageProblem(str(exc)) from None
    jobs = [j for j in selected if cluster.can_run(j.gpus)]
    skipped = [{"id": j.id, "gpus": j.gpus, "reason": f"needs more GPUs than {cluster} has"}
               for j in selected if not cluster.can_run(j.gpus)]
    skipped += [{"id": j.id, "gpus": j.gpus, "reason": why} for j, why in tr.skipped]
    if skipped:
        click.echo(f"{PROG}: skipping {len(skipped)} job(s) that cannot run on {cluster} (listed in --json)", err=True)
    if not jobs:
        raise UsageProblem(f"no job in {trace} can run on {cluster}")
    try:
        runs = _run_with_progress(jobs, cluster, names, pts, list(sweep), opts, held, known_sizes)
    except (PolicyError, SimulationError) as exc:
        raise SimFailure(str(exc)) from None
    from rich.console import Console
    from .report import render, summary_doc, write_csv, write_json, write_plot
    doc = summary_doc(runs, baseline=baseline, cluster=str(cluster), skipped=skipped,
                      trace={"path": trace, "format": tr.format, "jobs": len(jobs), "vc": vc, "limit": limit,
                             "seed": seed, "known_sizes": known_sizes})
    try:  # files first: a closed stdout (| head) must not lose them
        if csv_path:
            write_csv(csv_path, runs)
        if json_path:
            write_json(json_path, doc)
        if plot_path:
            write_plot(plot_path, runs, f"{trace} on {cluster}")
    except OSError as exc:
        raise UsageProblem(f"cannot write {exc.filename}: {exc.strerror}") from None
    console = Console() if sys.stdout.isatty() else Console(width=max(100, 26 + 20 * len(runs)))
    render(doc, console)


def sim_reservation(i: int, text: str, cluster: Cluster) -> Reservation:
    """--reservation NODES:START:SECONDS[:FLAGS] -> a reservation no trace job belongs to (a window
    the nodes are out of the trace's use: maintenance, a demo), with scontrol's Flags=."""
    nodes, sep, rest = text.partition(":")
    start, sep2, rest = rest.partition(":")
    seconds, _, flag_text = rest.partition(":")
    try:
        names = expand(nodes)
        begin, length = float(start), float(seconds)
    except ValueError:
        raise ValueError(f"--reservation {text}: expected NODES:START:SECONDS, e.g. node[01-04]:3600:7200") from None
    if not sep or not sep2 or length <= 0 or begin < 0:
        raise ValueError(f"--reservation {text}: expected NODES:START:SECONDS with SECONDS > 0")
    if unknown := sorted(set(names) - set(cluster.node_names())):
        raise ValueError(f"--reservation {text}: {unknown[0]} is not a node of {cluster} "
                         f"({cluster.node_names()[0]}...)")
    try:
        flags = parse_flags(flag_text)
    except ReservationError as exc:
        raise ValueError(f"--reservation {text}: {exc}") from None
    for f in flags:
        if f in PERIODS and length > PERIODS[f]:
            raise ValueError(f"--reservation {text}: a {f} window lasts at most {PERIODS[f]} s")
    return Reservation(f"sim{i}", tuple(sorted(set(names))), begin, begin + length, users=("root",), flags=flags)


def _run_with_progress(jobs, cluster: Cluster, names, pts, swept, opts, held=(), known_sizes=False):
    """A rich progress bar (one line per run) on a terminal; silence when stderr is not one."""
    if not sys.stderr.isatty():
        return run_all(jobs, cluster, names, pts, swept=swept, options=opts, reservations=held,
                       known_sizes=known_sizes)
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    progress = Progress(TextColumn("{task.description:<24}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=Console(stderr=True), transient=False)
    tasks: dict[str, int] = {}

    def update(label: str, done: int, total: int) -> None:
        if label not in tasks:
            tasks[label] = progress.add_task(label, total=total)
        progress.update(tasks[label], completed=done)
    with progress:
        return run_all(jobs, cluster, names, pts, swept=swept, options=opts, progress=update, reservations=held,
                       known_sizes=known_sizes)


def main(argv: Sequence[str] | None = None) -> None:
    """Console entry point: every error is one line on stderr (exit 2 for bad input)."""
    try:
        cli.main(args=list(argv) if argv is not None else None, prog_name=PROG, standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        click.echo(f"{PROG}: error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo(f"{PROG}: interrupted", err=True)
        sys.exit(130)
    except KeyboardInterrupt:
        click.echo(f"{PROG}: interrupted", err=True)
        sys.exit(130)
    except BrokenPipeError:  # stdout closed early (| head): not an error worth a traceback
        sys.stderr.close()
        sys.exit(0)


if __name__ == "__main__":
    main()
