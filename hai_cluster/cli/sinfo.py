"""sinfo, as Slurm prints it: partitions and their nodes grouped by state (or one line per node with
-N), with sinfo's default and long formats, `-o`/`-O`, `-s` and `-h`. Checked against Slurm 22.05."""
from __future__ import annotations

import sys
import time

import click

from ..core.hostlist import compress
from ..core.timefmt import format_duration
from .common import call, check_cluster, fail
from .hinfo import node_state
from .slurmfmt import Column, FormatError, parse_letters, parse_names, render

PROG = "sinfo"
DEFAULT_FORMAT = "%#P %.5a %.10l %.6D %.6t %N"
LONG_FORMAT = "%#P %.5a %.10l %.10s %.4r %.8h %.10g %.6D %.11T %N"
NODE_FORMAT = "%#N %.6D %#P %6t"
NODE_LONG_FORMAT = "%#N %.6D %#P %.11T %.4c %.8z %.6m %.8d %.6w %.8f %20E"
SUMMARY_FORMAT = "%#P %.5a %.10l %.16F %N"
MIN_FIELD = 9  # sinfo's MIN_PART_FIELD_SIZE / MIN_NODE_FIELD_SIZE: what %#P and %#N are at least

# compact state -> the long name (%T)
LONG_STATE = {"idle": "idle", "mix": "mixed", "alloc": "allocated", "drain": "drained", "drng": "draining",
              "down": "down", "maint": "maint", "resv": "reserved", "mix$": "mixed$", "alloc$": "allocated$"}


def _limit(seconds) -> str:
    return "infinite" if seconds is None else format_duration(seconds)


def state_of(n: dict) -> str:
    """sinfo's compact state: hinfo's, with a drained node that still runs jobs `drng`; in a
    reservation open now an idle node is `resv` (`maint` for Flags=MAINT) and a busy one in a MAINT
    window has a `$` (`mix$`), as Slurm 22.05's sinfo shows them."""
    text = node_state(n)
    base = text.rstrip("*")
    if base == "drain" and n["jobs"]:
        base = "drng"
    elif base == "idle" and n.get("reserved"):
        base = "maint" if n["reserved"] == "MAINT" else "resv"
    elif base in ("mix", "alloc") and n.get("reserved") == "MAINT":
        base += "$"
    return base + text[len(text.rstrip("*")):]


def _base(m: dict) -> str:
    return m["state_c"].rstrip("*$")


def _counts(members: list[dict]) -> str:
    """%F: nodes allocated/idle/other/total, as Slurm 22.05's sinfo counts them: a node running
    jobs is allocated (a draining one too), a drained or down one other, the rest idle (reserved,
    maint and not responding ones included: checked on the peer)."""
    a = sum(1 for m in members if _base(m) in ("alloc", "mix", "drng"))
    o = sum(1 for m in members if _base(m) in ("drain", "down"))
    return f"{a}/{len(members) - a - o}/{o}/{len(members)}"


def _alloc_idle(members: list[dict]) -> str:
    """%A: the first two of %F."""
    return "/".join(_counts(members).split("/")[:2])


def _cpu_counts(members: list[dict]) -> str:
    """%C: CPUs allocated/idle/other/total; a drained or down node's unallocated CPUs are other."""
    alloc = sum(m["cpus_alloc"] for m in members)
    total = sum(m["cpus"] for m in members)
    other = sum(m["cpus"] - m["cpus_alloc"] for m in members if _base(m) in ("drain", "drng", "down"))
    return f"{alloc}/{total - alloc - other}/{other}/{total}"


# letter -> (header, getter(group): a group is the nodes of one line, with its partition)
LETTERS = {
    "P": ("PARTITION", lambda g: g["partition"] + ("*" if g["default"] else "")),
    "R": ("PARTITION", lambda g: g["partition"]),
    "a": ("AVAIL", lambda g: "up"),
    "l": ("TIMELIMIT", lambda g: _limit(g["max_time"])),
    "L": ("DEFAULTTIME", lambda g: "n/a"),
    "s": ("JOB_SIZE", lambda g: "1-infinite"),
    "r": ("ROOT", lambda g: "no"),
    "h": ("OVERSUBSCRIBE", lambda g: "NO"),
    "g": ("GROUPS", lambda g: "all"),
    "D": ("NODES", lambda g: str(len(g["members"]))),
    "t": ("STATE", lambda g: g["members"][0]["state_c"]),
    "T": ("STATE", lambda g: LONG_STATE.get(g["members"][0]["state_c"].rstrip("*"), "unknown")
          + ("*" if g["members"][0]["state_c"].endswith("*") else "")),
    "N": ("NODELIST", lambda g: compress([m["name"] for m in g["members"]])),
    "n": ("HOSTNAMES", lambda g: compress([m["name"] for m in g["members"]])),
    "c": ("CPUS", lambda g: str(g["members"][0]["cpus"])),
    "C": ("CPUS(A/I/O/T)", lambda g: _cpu_counts(g["members"])),
    "F": ("NODES(A/I/O/T)", lambda g: _counts(g["members"])),
    "A": ("NODES(A/I)", lambda g: _alloc_idle(g["members"])),
    "G": ("GRES", lambda g: f"gpu:{g['members'][0]['gpus_total']}" if g["members"][0]["gpus_total"] else "(null)"),
    "m": ("MEMORY", lambda g: str(g["members"][0]["mem_mb"])),
    "z": ("S:C:T", lambda g: f"{g['members'][0]['cpus']}:1:1"),
    "d": ("TMP_DISK", lambda g: "0"),
    "w": ("WEIGHT", lambda g: "1"),
    "f": ("AVAIL_FEATURES", lambda g: ",".join(g["members"][0].get("features") or ()) or "(null)"),
    "b": ("ACTIVE_FEATURES", lambda g: ",".join(g["members"][0].get("features") or ()) or "(null)"),
    "E": ("REASON", lambda g: g["members"][0]["reason"] or "none"),
}
NAMES = {"partition": "P", "partitionname": "R", "available": "a", "time": "l", "defaulttime": "L",
         "size": "s", "root": "r", "oversubscribe": "h", "groups": "g", "nodes": "D", "statecompact": "t",
         "statelong": "T", "nodelist": "N", "nodehost": "n", "cpus": "c", "cpusstate": "C", "nodeaiot": "F", "nodeai": "A",
         "gres": "G", "memory": "m", "socketcorethread": "z", "disk": "d", "weight": "w", "features": "f",
         "featuresact": "b",
         "reason": "E"}
NODE_WISE = {"N", "n", "D", "F", "C"}  # letters that describe a line's nodes together: not what splits lines


@click.command(context_settings={"help_option_names": ["--help"]})
@click.option("-N", "--Node", "per_node", is_flag=True, help="one line per node")
@click.option("-l", "--long", "long_", is_flag=True, help="more columns, and the time")
@click.option("-s", "--summarize", is_flag=True, help="one line per partition")
@click.option("-h", "--noheader", is_flag=True, help="no header line")
@click.option("-p", "--partition", "partition", help="only this partition")
@click.option("-t", "--states", "states", help="only nodes in these states (idle,mix,alloc,drain,down)")
@click.option("-n", "--nodes", "node_names", help="only these nodes")
@click.option("-o", "--format", "fmt", help="fields: %[.][size]letter")
@click.option("-O", "--Format", "fmt_long", help="fields by name: name[:[.][size]],...")
@click.option("-R", "--list-reasons", is_flag=True, help="why nodes are down or drained")
@click.option("-M", "--clusters", help="only the local cluster")
def main(per_node, long_, summarize, noheader, partition, states, node_names, fmt, fmt_long, list_reasons, clusters):
    """Nodes and partitions, as Slurm's sinfo prints them."""
    check_cluster(PROG, clusters)
    widened: set[int] = set()
    try:
        if list_reasons:
            columns = [Column("E", 20, False, "", " "), Column("N", 0, False)]
        elif fmt_long is not None:
            columns = [Column(NAMES[c.field], c.width, c.right, c.prefix, c.suffix)
                       for c in parse_names(fmt_long, NAMES)]
        else:
            fmt = fmt or (SUMMARY_FORMAT if summarize else (NODE_LONG_FORMAT if long_ else NODE_FORMAT) if per_node
                          else LONG_FORMAT if long_ else DEFAULT_FORMAT)
            columns = parse_letters(fmt.replace("%#", "%"), LETTERS)
            widened = {i for i, tok in enumerate(t for t in fmt.split("%")[1:] if t) if tok.startswith("#")}
    except FormatError as exc:
        fail(PROG, str(exc).replace("job format", "node format"))
    reply = call(PROG, "nodes", {})
    wanted = {s.strip().lower().rstrip("*") for s in states.split(",")} if states else None
    known = set(LONG_STATE) | {"mixed", "allocated", "drained", "draining", "reserved"}
    if wanted and not wanted <= known:
        fail(PROG, f"Invalid node state specified: {', '.join(sorted(wanted - known))}")
    picked = set(node_names.split(",")) if node_names else None
    parts = {p["name"]: p for p in reply["partitions"]}
    nodes = []
    for n in reply["nodes"]:
        n["state_c"] = state_of(n)
        base = n["state_c"].rstrip("*")
        if wanted and base not in wanted and LONG_STATE.get(base) not in wanted:
            continue
        if picked is not None and n["name"] not in picked:
            continue
        if list_reasons and n["state"] not in ("drain", "down") and n["responding"]:
            continue
        nodes.append(n)
    letters = [c.field for c in columns]
    groups: dict[tuple, dict] = {}
    for p_name, p in parts.items():
        if partition and p_name != partition:
            continue
        for n in nodes:
            if p_name not in n["partitions"]:
                continue
            g = {"partition": p_name, "default": p["default"], "max_time": p["max_time"], "members": [n]}
            if per_node:
                key = (p_name, n["name"])
            elif summarize:
                key = (p_name,)
            else:
                key = (p_name,) + tuple(LETTERS[x][1](g) for x in letters if x not in NODE_WISE)
            groups.setdefault(key, {**g, "members": []})["members"].append(n)
    lines_groups = list(groups.values())
    if per_node:
        lines_groups.sort(key=lambda g: g["members"][0]["name"])
    if widened:  # %#P / %#N: as wide as the widest, at least 9
        sized = []
        for i, c in enumerate(columns):
            if i in widened and c.field in ("P", "N", "R", "n"):
                width = max([MIN_FIELD] + [len(LETTERS[c.field][1](g)) for g in lines_groups])
                c = Column(c.field, width, c.right, c.prefix, c.suffix)
            sized.append(c)
        columns = sized
    rows = [[LETTERS[c.field][1](g) for c in columns] for g in lines_groups]
    lines = render(columns, [LETTERS[c.field][0] for c in columns], rows, header=not noheader)
    if long_:
        lines.insert(0, time.strftime("%a %b %d %H:%M:%S %Y", time.localtime(reply["now"])))
    if lines:
        sys.stdout.write("\n".join(lines) + "\n")
