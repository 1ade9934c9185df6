"""GNU getopt_long as Slurm's commands parse their arguments (pure), with glibc's messages: short
options bundled (-hl), a required argument attached or next (-oFMT, -o FMT), an optional one only
attached (-j12, --jobs=12), long options by any unambiguous prefix, operands moved after the
options (`sprio 12 -j`), `--` ending the options. click cannot take an optional argument the way
getopt does, nor say what getopt says."""
from __future__ import annotations

from dataclasses import dataclass

NO, REQUIRED, OPTIONAL = 0, 1, 2


class GetoptError(Exception):
    """A wrong option: the message getopt prints (the command then says how to get help)."""


@dataclass(frozen=True)
class LongOption:
    name: str
    has_arg: int  # NO, REQUIRED or OPTIONAL
    key: str  # what it stands for: its short letter, or a name of its own


def _short_table(shortopts: str) -> dict[str, int]:
    """'hj::lo:' -> {'h': NO, 'j': OPTIONAL, 'l': NO, 'o': REQUIRED}."""
    table, i = {}, 0
    while i < len(shortopts):
        letter, i = shortopts[i], i + 1
        colons = len(shortopts[i:]) - len(shortopts[i:].lstrip(":"))
        table[letter] = min(colons, 2)
        i += min(colons, 2)
    return table


def _long(prog: str, text: str, longopts: list[LongOption]) -> tuple[LongOption, str | None]:
    """The option a `--text` names (exactly, or by a prefix all its matches agree on) and its
    attached value."""
    name, eq, value = text.partition("=")
    found = next((o for o in longopts if o.name == name), None)
    if found is None:
        matches = [o for o in longopts if o.name.startswith(name)]
        if not matches:
            raise GetoptError(f"{prog}: unrecognized option '--{text}'")
        found = matches[0]
        differ = [o for o in matches[1:] if (o.has_arg, o.key) != (found.has_arg, found.key)]
        if differ:
            listed = " ".join(f"'--{o.name}'" for o in [found, *differ])
            raise GetoptError(f"{prog}: option '--{text}' is ambiguous; possibilities: {listed}")
    if eq and found.has_arg == NO:
        raise GetoptError(f"{prog}: option '--{found.name}' doesn't allow an argument")
    return found, value if eq else None


def getopt_long(prog: str, argv: list[str], shortopts: str,
                longopts: list[LongOption]) -> tuple[list[tuple[str, str | None]], list[str]]:
    """argv (without the program) -> ([(key, value or None), ...] in order, operands)."""
    shorts = _short_table(shortopts)
    opts: list[tuple[str, str | None]] = []
    operands: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if arg == "--":
            operands.extend(argv[i:])
            break
        if arg.startswith("--"):
            option, value = _long(prog, arg[2:], longopts)
            if option.has_arg == REQUIRED and value is None:
                if i == len(argv):
                    raise GetoptError(f"{prog}: option '--{option.name}' requires an argument")
                value, i = argv[i], i + 1
            opts.append((option.key, value))
            continue
        if not arg.startswith("-") or arg == "-":
            operands.append(arg)
            continue
        k = 1
        while k < len(arg):
            letter = arg[k]
            k += 1
            if letter not in shorts or letter == ":":
                raise GetoptError(f"{prog}: invalid option -- '{letter}'")
            kind = shorts[letter]
            if kind == NO:
                opts.append((letter, None))
                continue
            rest = arg[k:]
            if rest:
                opts.append((letter, rest))
            elif kind == OPTIONAL:
                opts.append((letter, None))
            elif i < len(argv):
                opts.append((letter, argv[i]))
                i += 1
            else:
                raise GetoptError(f"{prog}: option requires an argument -- '{letter}'")
            break
    return opts, operands
