"""What every command shares: reaching the controller, failing clearly, printing tables."""
from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # typing (and collections) cost every command's start ms: only for checkers
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any, NoReturn

from ..core.usertext import printable
from .client import ClientError, ControllerClient


def iso_time(t: float | None, missing: str = "Unknown") -> str:
    """A time as Slurm's tools print one (2026-12-03T14:05:00, local time), `missing` without one."""
    import time
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t)) if t else missing


def fail(prog: str, message: str, code: int = 1) -> NoReturn:
    """Print `message` (each of its lines: a refused submission lists every refusal) and exit."""
    for line in message.split("\n"):
        print(f"{prog}: error: {printable(line)}", file=sys.stderr)
    sys.exit(code)


def shown(reply: Any) -> Any:
    """A reply made safe to print: every string in it one line of printable characters. Names,
    reasons and messages come from other users and from jobs; a job named with ESC sequences or a
    newline must not rewrite the terminal of whoever lists it, nor forge a line in its table."""
    if isinstance(reply, str):
        return printable(reply)
    if isinstance(reply, list):
        return [shown(v) for v in reply]
    if isinstance(reply, dict):
        return {shown(k): shown(v) for k, v in reply.items()}
    return reply


_SCALARS = frozenset({str, int, float, bool, type(None)})  # str() of any but str is printable


def shown_listing(reply: dict, keys: Sequence[str]) -> dict:
    """shown(reply), fast for a listing: when every key and value of its `keys` rows (dicts) is
    text or a number and all the text is printable (the common case), one check of them all at
    C speed, and the rows as they are; else shown() (squeue of 10,000 jobs: shown() walked
    290,000 values, a third of its time)."""
    from itertools import chain

    out = shown({k: v for k, v in reply.items() if k not in keys})
    for key in keys:
        rows = reply[key]
        plain = False
        if set(map(type, rows)) <= {dict}:
            names, values = set(chain.from_iterable(rows)), list(chain.from_iterable(map(dict.values, rows)))
            plain = (set(map(type, names)) | set(map(type, values))) <= _SCALARS and \
                " ".join(map(str, chain(names, values))).isprintable()
        out[key] = rows if plain else shown(rows)
    return out


def call(prog: str, method: str, body: Any = None) -> Any:
    """The controller's reply to `method`, made safe to print (shown); failures end the command."""
    client = ControllerClient()
    try:
        return shown(client.call(method, body))
    except ClientError as exc:
        fail(prog, str(exc))
    finally:
        client.close()


def call_pages(prog: str, method: str, body: dict, keys: Sequence[str] = ("jobs",)) -> Any:
    """A listing's every page (the controller answers PAGE_ROWS rows at a time: it builds each
    reply on its event loop), its `keys` lists joined, made safe to print."""
    client = ControllerClient()
    merged = None
    try:
        after = None
        while True:
            reply = client.call(method, body if after is None else {**body, "after": after})
            if merged is None:
                merged = reply
            else:
                for key in keys:
                    merged[key].extend(reply[key])
            if not reply.get("more"):
                return shown_listing(merged, keys)
            after = reply["next"]
    except ClientError as exc:
        fail(prog, str(exc))
    finally:
        client.close()


def split_list(values: Sequence[str] | None) -> list[str] | None:
    """Slurm-style comma lists, also given as repeated options."""
    if not values:
        return None
    return [v for value in values for v in value.split(",") if v]


RICH_MAX_ROWS = 500  # rich lays out a table in Python: beyond this, plain columns print far faster


def terminal_columns() -> int:
    try:
        return os.get_terminal_size(sys.stdout.fileno()).columns
    except (OSError, ValueError):  # not a terminal after all (a test's stand-in): the usual 80
        return 80


def fit_columns(headers: Sequence[str], rows: Sequence[Sequence[Any]], right: Sequence[int],
                droppable: Sequence[str], width: int) -> tuple[list[str], list[list[str]], list[int], list[str]]:
    """The table narrowed to `width` columns of text by leaving out whole columns, the first of
    `droppable` first (a value is never cut): (headers, rows, right, the headers left out)."""
    keep = list(range(len(headers)))
    cells = [[str(c) for c in row] for row in rows]

    def wide(cols: list[int]) -> int:
        return sum(max([len(headers[i])] + [len(r[i]) for r in cells]) for i in cols) + len(cols) - 1

    dropped = []
    for name in droppable:
        if wide(keep) <= width:
            break
        if name in headers and headers.index(name) in keep:
            keep.remove(headers.index(name))
            dropped.append(name)
    return ([headers[i] for i in keep], [[r[i] for i in keep] for r in cells],
            [n for n, i in enumerate(keep) if i in right], dropped)


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, header: bool = True,
                right: Sequence[int] = ()) -> None:
    """A rich table on a terminal, plain aligned columns when piped (for scripts and grep)."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    # rich cuts a value that does not fit the terminal ("1234_[3-..."): then plain lines, which
    # the terminal wraps, so no value is ever shown cut
    fits = sum(widths) + len(widths) - 1 <= terminal_columns()
    if sys.stdout.isatty() and len(cells) <= RICH_MAX_ROWS and fits:
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text
        table = Table(box=None, show_header=header, header_style="bold", pad_edge=False, padding=(0, 1, 0, 0))
        for i, h in enumerate(headers):
            table.add_column(h, justify="right" if i in right else "left", no_wrap=True)
        for row in cells:
            table.add_row(*map(Text, row))  # Text: a name like "[/x]" or "[link=...]" is not markup
        Console().print(table)
        return
    # One format string for every line and one write: 10,000 rows in a few ms.
    fmt = " ".join(f"{{:{'>' if i in right else '<'}{w}}}" for i, w in enumerate(widths))
    lines = [fmt.format(*headers).rstrip()] if header else []
    lines += [fmt.format(*row).rstrip() for row in cells]
    if lines:
        sys.stdout.write("\n".join(lines) + "\n")


def check_cluster(prog: str, clusters: str | None) -> None:
    """-M/--clusters: this cluster's name (or `all`) is accepted; a cluster manages only itself."""
    if not clusters:
        return
    local = call(prog, "ping")["cluster"]
    for name in clusters.split(","):
        if name not in (local, "all"):
            fail(prog, f"'{name}' is not this cluster (this is '{local}'; each hai-cluster controller "
                       f"manages one cluster)")
