"""A fast start for the listings that tools poll (squeue, sacct): their common option forms are
parsed here, without importing click (~20 ms of a ~60 ms start, docs/BENCHMARKS.md), and
everything else (--help, combined flags, a misspelt option, a missing value) goes to the click
command built from the same option table, which answers as it always did.

The fast parse accepts only forms whose meaning is plain: `-o VALUE`, `-oVALUE`, `--format VALUE`,
`--format=VALUE`, single flags (`-h`, `--noheader`), and gives the command function what click
would: flags True/False, repeated options a tuple, counts an int, absent values None."""
from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of the start this module is for
    from collections.abc import Callable, Sequence

KINDS = ("flag", "value", "multiple", "count", "optional")


class Option:
    __slots__ = ("names", "dest", "kind", "help")

    def __init__(self, names: tuple[str, ...], dest: str, kind: str, help: str | None) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown option kind {kind!r}")
        self.names = names  # -o, --format
        self.dest = dest  # the command function's argument
        self.kind = kind  # "optional": a value that may be left out (squeue -s): click's alone
        self.help = help  # None: hidden


def _default(o: Option):
    return {"flag": False, "multiple": (), "count": 0}.get(o.kind)


def parse_simple(options: Sequence[Option], argv: Sequence[str]) -> dict | None:
    """The keyword arguments click would pass for argv, or None when argv uses a form left to click."""
    by_name = {n: o for o in options for n in o.names}
    values = {o.dest: _default(o) for o in options}
    given: set[str] = set()
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if arg.startswith("--"):
            name, eq, value = arg.partition("=")
            inline = bool(eq)
        elif arg.startswith("-") and len(arg) > 1:
            name, value = arg[:2], arg[2:]
            inline = bool(value)
        else:
            return None  # an argument, or "-": click's error
        opt = by_name.get(name)
        if opt is None or opt.kind == "optional":
            return None
        if opt.kind in ("flag", "count"):
            if inline:
                return None  # -hl, --long=x
            values[opt.dest] = True if opt.kind == "flag" else values[opt.dest] + 1
            continue
        if not inline:
            if i >= len(argv):
                return None  # the value is missing: click says so
            value = argv[i]
            i += 1
        if not value or value.startswith("-"):
            return None  # an empty value, or one that looks like an option: click's rules
        if opt.kind == "multiple":
            values[opt.dest] += (value,)
        elif opt.dest in given:
            return None  # given twice
        else:
            values[opt.dest] = value
        given.add(opt.dest)
    return values


def command_of(fn: Callable, options: Sequence[Option]):
    """The click command of fn with these options (built only when the fast parse declines)."""
    import click

    for o in reversed(options):
        kw: dict = {"help": o.help} if o.help else {"hidden": True}
        if o.kind == "flag":
            kw["is_flag"] = True
        elif o.kind == "multiple":
            kw["multiple"] = True
        elif o.kind == "count":
            kw["count"] = True
        elif o.kind == "optional":
            kw.update(is_flag=False, flag_value="", default=None)
        fn = click.option(*o.names, o.dest, **kw)(fn)
    return click.command(context_settings={"help_option_names": ["--help"]})(fn)


def run_main(fn: Callable, options: Sequence[Option], argv: list[str] | None,
             click_command: Callable[[], Callable]) -> int:
    """Run fn on argv's plain forms, else the click command; ends as click's standalone mode
    does (status 0; a closed pipe status 1, quietly; ^C "Aborted!", status 1)."""
    args = sys.argv[1:] if argv is None else list(argv)
    kw = parse_simple(options, args)
    if kw is None:
        return click_command()(args)
    try:
        fn(**kw)
        sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the flush at exit must not fail again
        return 1
    except KeyboardInterrupt:
        print("Aborted!", file=sys.stderr)
        return 1
    return 0
