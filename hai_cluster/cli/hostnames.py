"""scontrol's `show hostnames`, `show hostlist` and `show hostlistsorted`, with Slurm 22.05's
messages and exit codes (checked against it): no controller is asked, so they work anywhere,
inside jobs too, where scripts read their head node with them."""
from __future__ import annotations

import os
import sys

from ..core.hostlist import expand, ranged
from ..core.usertext import printable

MAX_FILE = 1024 * 1024  # a host file over 1 MiB is almost certainly not one (Slurm's bound too)


def print_hostnames(prog: str, text: str | None) -> int:
    """One host per line, in the order written; no list (nor SLURM_NODELIST) is only an error
    message: Slurm exits 0 then, and on an invalid list too."""
    if text is None:
        text = os.environ.get("SLURM_NODELIST")
    if text is None:
        print(f"{prog}: error: host list is empty", file=sys.stderr)
        return 0
    try:
        names = expand(text)
    except ValueError as exc:
        print(f"Invalid hostlist: {printable(text)} ({exc})", file=sys.stderr)
        return 0
    sys.stdout.write("".join(f"{n}\n" for n in names))
    return 0


def print_hostlist(text: str | None, *, sort: bool) -> int:
    """A list of names (commas), or an absolute path of a file of them (commas or lines), or "-"
    for standard input, as one hostlist expression."""
    if text is None:
        print("invalid encode argument", file=sys.stderr)
        return 1
    if text == "-" or text.startswith("/"):
        path = "/dev/stdin" if text == "-" else text
        try:
            if text == "-":
                data = sys.stdin.buffer.read(MAX_FILE + 1)
            else:
                with open(path, "rb") as f:
                    data = f.read(MAX_FILE + 1)
        except OSError:
            print(f"Can not open {printable(path)}", file=sys.stderr)
            return 1
        if len(data) > MAX_FILE:
            print(f"File {printable(path)} is too large", file=sys.stderr)
            return 1
        text = data.decode("utf-8", "replace").replace("\n", ",")
        while ",," in text:
            text = text.replace(",,", ",")
        text = text.strip(",")
    try:
        line = ranged(expand(text), sort=sort)
    except ValueError as exc:
        print(f"Invalid hostlist: {printable(text)} ({exc})", file=sys.stderr)
        return 1
    print(line)
    return 0
