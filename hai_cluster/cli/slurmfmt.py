"""Slurm's output formats, exactly (pure: text in, lines out), for the Slurm-named commands.

- squeue/sinfo `-o "%.18i|%T"`: literal text kept, `%[.][W]X` a field, `.` right-justified, `W`
  its width (the value padded, and cut, to W; no W: the value as it is).
- squeue/sinfo `-O "jobid:.10,state"`: fields by name, `:[.]W` as above and 20 wide by default,
  text after the width kept after the field.
- sacct's fixed columns: every field its width (negative: left-justified), one space after each, a
  rule of dashes under the header, a string longer than its column cut with a `+` at its end;
  `-P`/`-p` join with `|` (`-p` ends every field with one).
Checked against Slurm 22.05 (src/squeue/opts.c, src/common/print_fields.c)."""
from __future__ import annotations

from dataclasses import dataclass


def slurm_bytes(n: int | None) -> str:
    """A size as sacct prints MaxRSS (Slurm's convert_num_unit with CONVERT_NUM_UNIT_EXACT, from
    bytes): divided by 1024 while that loses nothing but a half, K, M, G... after it; "" for none."""
    if n is None:
        return ""
    if n == 0:
        return "0"
    num, unit = float(n), 0
    while num >= 1024 and int(num) % 512 == 0:
        num /= 1024
        unit += 1
    suffix = "\0KMGTP?"[unit] if unit else ""
    return f"{int(num)}{suffix}" if int(num) == num else f"{num:.2f}{suffix}"


class FormatError(ValueError):
    """A format that names a field this command does not have."""


@dataclass(frozen=True)
class Column:
    field: str  # a squeue letter, or a field's name
    width: int  # 0: as wide as the value
    right: bool
    prefix: str = ""  # literal text before it (only the first column has one)
    suffix: str = ""  # literal text after it


def parse_letters(fmt: str, known) -> list[Column]:
    """squeue -o: '%.18i|%T' -> columns. Unknown letters raise FormatError."""
    first, *tokens = fmt.split("%")
    columns: list[Column] = []
    prefix = first
    for token in tokens:
        i = 0
        right = token[:1] == "."
        i += right
        digits = ""
        while i < len(token) and token[i].isdigit():
            digits += token[i]
            i += 1
        if i == len(token):  # "%" at the end, or "%%" (Slurm prints nothing for either)
            continue
        letter = token[i]
        if letter not in known:
            raise FormatError(f"Invalid job format specification: {letter}")
        columns.append(Column(letter, int(digits or 0), right, prefix, token[i + 1:]))
        prefix = ""
    if not columns:
        raise FormatError(f"no fields in format {fmt!r}")
    return columns


def parse_names(fmt: str, known) -> list[Column]:
    """squeue -O: 'jobid:.10,state,name:5' -> columns (names any case; 20 wide by default)."""
    columns = []
    for token in fmt.split(","):
        name, colon, size = token.partition(":")
        key = name.strip().lower()
        if key not in known:
            raise FormatError(f"Invalid job format specification: {name}")
        width, right, suffix = 20, False, ""
        if colon:
            right = size.startswith(".")
            size = size[right:]
            digits = len(size) - len(size.lstrip("0123456789"))
            width, suffix = int(size[:digits] or 0), size[digits:]
        columns.append(Column(key, width, right, "", suffix))
    if not columns:
        raise FormatError("Format long option lacks specification")
    return columns


def cell(text: str, width: int, right: bool) -> str:
    """printf's %*.*s / %-*.*s: padded and cut to width; 0: as it is."""
    if not width:
        return text
    text = text[:width]
    return text.rjust(width) if right else text.ljust(width)


def render(columns: list[Column], headers: list[str], rows: list[list[str]], header: bool = True) -> list[str]:
    """The lines of a squeue/sinfo listing: the header (unless not), then one per row."""
    line = line_format(columns)
    return ([line % tuple(headers)] if header else []) + [line % tuple(r) for r in rows]


def line_format(columns: list[Column]) -> str:
    """One %-format for a whole line: %W.Ws / %-W.Ws pad and cut a value as cell() does, at C
    speed (a listing of 10,000 jobs built its lines cell by cell in 50 ms)."""
    def spec(c: Column) -> str:
        field = f"%{'' if c.right else '-'}{c.width}.{c.width}s" if c.width else "%s"
        return c.prefix.replace("%", "%%") + field + c.suffix.replace("%", "%%")
    return "".join(spec(c) for c in columns)


@dataclass(frozen=True)
class Field:
    """One sacct column: its name as given (the header), its width (negative: left-justified) and
    whether it is a number (printf %u: never cut)."""
    name: str
    width: int
    number: bool = False


def sacct_lines(fields: list[Field], rows: list[list[str]], *, header: bool = True,
                parsable: str | None = None) -> list[str]:
    """sacct's output. parsable: None (columns), "P" (--parsable2: '|' between fields) or "p"
    (--parsable: '|' after every field)."""
    if parsable is not None:
        end = "|" if parsable == "p" else ""
        lines = ["|".join(f.name for f in fields) + end] if header else []
        return lines + ["|".join(r) + end for r in rows]

    def head(f: Field) -> str:
        width = abs(f.width)
        name = f.name[:width]
        return (name.rjust(width) if f.width > 0 else name.ljust(width)) + " "

    lines = []
    if header:
        lines.append("".join(head(f) for f in fields))
        lines.append("".join("-" * abs(f.width) + " " for f in fields))
    if not rows:
        return lines
    # Column by column: a text longer than its column ends in "+" (numbers are never cut); then
    # one %-format pads every line at C speed (10,000 rows cell by cell took ~30 ms).
    columns = [list(c) for c in zip(*rows)]
    for f, values in zip(fields, columns):
        width = abs(f.width)
        if not f.number and max(map(len, values)) > width:
            values[:] = [v[:width - 1] + "+" if len(v) > width else v for v in values]
    line = "".join(f"%{'' if f.width > 0 else '-'}{abs(f.width)}s " for f in fields)
    return lines + [line % r for r in zip(*columns)]
