"""hinfo: node and partition state, like sinfo, with GPUs."""
from __future__ import annotations

import json
import sys

import click

from ..core.hostlist import compress
from ..core.timefmt import format_limit
from .common import call, fail, print_table
from .gpuview import GPU_HEADERS, GPU_RIGHT, gpu_rows


def node_state(n: dict) -> str:
    """sinfo's words: down, drain, idle, mix, alloc; '*' marks a node that is not responding."""
    if n["state"] in ("down", "drain"):
        base = n["state"]
    elif n["gpus_alloc"] == 0 and n["jobs"] == 0:
        base = "idle"
    elif (n["gpus_total"] and n["gpus_alloc"] >= n["gpus_total"]) or (n["cpus"] and n["cpus_alloc"] >= n["cpus"]):
        base = "alloc"
    else:
        base = "mix"
    return base if n["responding"] else base + "*"


@click.command(context_settings={"help_option_names": ["--help"]})
@click.option("-N", "--Node", "per_node", is_flag=True, help="one line per node")
@click.option("-h", "--noheader", is_flag=True, help="no header line")
@click.option("-p", "--partition", "partition", help="only this partition")
@click.option("-t", "--states", "states", help="only nodes in these states, e.g. idle,mix or drain,down")
@click.option("--gpus", "per_gpu", is_flag=True, help="one line per GPU, with its latest telemetry (with -N)")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def main(per_node, noheader, partition, states, per_gpu, as_json):
    """Show nodes, their state and their GPUs."""
    if per_gpu:
        return gpus_view(noheader, partition, as_json)
    wanted = {s.strip().lower().rstrip("*") for s in states.split(",")} if states else None
    known = {"idle", "mix", "alloc", "drain", "down"}
    if wanted and not wanted <= known:
        fail("hinfo", f"invalid node state in {states!r}; valid: {', '.join(sorted(known))}")
    reply = call("hinfo", "nodes", {})
    nodes = [n for n in reply["nodes"] if not partition or partition in n["partitions"]]
    for n in nodes:
        n["state_text"] = node_state(n)
        n["link_error"] = reply["links"].get(n["name"])
    if wanted:
        nodes = [n for n in nodes if n["state_text"].rstrip("*") in wanted]
    if as_json:
        json.dump({"nodes": nodes}, sys.stdout, indent=2, default=str)
        print()
        return
    if per_node:
        rows = [[n["name"], ",".join(n["partitions"]), n["state_text"], n["cpus"],
                 f"{n['gpus_alloc']}/{n['gpus_total']}", n["gpu_backend"] or "-", n.get("isolation") or "-",
                 n["reason"] or (n["link_error"] if not n["responding"] else "") or "none"]
                for n in nodes]
        print_table(["NODELIST", "PARTITION", "STATE", "CPUS", "GPUS(A/T)", "GPU_BACKEND", "ISOLATION", "REASON"], rows,
                    header=not noheader, right=[3, 4])
        return
    groups: dict[tuple[str, str], list[dict]] = {}
    for n in nodes:
        for p in n["partitions"] or ["-"]:
            if partition and p != partition:
                continue
            groups.setdefault((p, n["state_text"]), []).append(n)
    rows = []
    parts = {p["name"]: p for p in reply.get("partitions", ())}
    order = {name: i for i, name in enumerate(parts)}
    for (p, state), members in sorted(groups.items(), key=lambda kv: (order.get(kv[0][0], len(order)), kv[0])):
        alloc = sum(m["gpus_alloc"] for m in members)
        total = sum(m["gpus_total"] for m in members)
        info = parts.get(p, {})
        rows.append([p + ("*" if info.get("default") else ""), "up", format_limit(info.get("max_time")), len(members),
                     state, f"{alloc}/{total}", compress([m["name"] for m in members])])
    print_table(["PARTITION", "AVAIL", "TIMELIMIT", "NODES", "STATE", "GPUS(A/T)", "NODELIST"], rows,
                header=not noheader, right=[2, 3, 5])


def gpus_view(noheader: bool, partition: str | None, as_json: bool) -> None:
    """hinfo -N --gpus: every GPU, the job holding it and its latest reading."""
    reply = call("hinfo", "telemetry", {})
    if partition:
        wanted = {n["name"] for n in call("hinfo", "nodes", {})["nodes"] if partition in n["partitions"]}
        reply["nodes"] = [n for n in reply["nodes"] if n["name"] in wanted]
    if as_json:
        json.dump({"nodes": reply["nodes"]}, sys.stdout, indent=2, default=str)
        print()
        return
    print_table(GPU_HEADERS, gpu_rows(reply), header=not noheader, right=GPU_RIGHT)
