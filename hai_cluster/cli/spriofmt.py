"""sprio's output, as Slurm 22.05 prints it (src/sprio/opts.c, print.c, sort.c): pure, rows in,
lines out.

- `-o`: text before the first `%` printed first; the rest split at every `%` with the empty pieces
  dropped (so `%%` is no field), each piece `[.][W]X` and text after it; an unknown X is an error
  line and the piece is skipped. Every value is cut to W and padded to W (`.`: right-justified).
- the default columns depend on the weights: a factor of weight 0 is left out (-l shows them all).
- `-w`: the header and one `Weights` line; `-n`: factors normalized (`%.7f`), PRIORITY `%16.14f` of
  itself over 2^32 - 1; else weighted factors (`%.0f`).
- `-S`: letters applied from the last to the first (a stable sort each, `-` before one: descending).
Ours: `%L`, the MLFQ level, at the end of the default columns under the MLFQ."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .slurmfmt import cell

UINT32_MAX = 0xFFFFFFFF
FACTORS = "age assoc fairshare jobsize partition qos".split()
# factor -> (its letters, normalized and weighted): in sprio's order of the default columns
FACTOR_LETTERS = {"age": "aA", "assoc": "bB", "fairshare": "fF", "jobsize": "jJ", "partition": "pP", "qos": "qQ"}
# the factors the controller sends (scheduling/priority.py); the others are 0 here (no weight)
SENT = ("age", "fairshare", "qos")
LONG_FORMAT = "%.15i %9r %.8u %.10Y %.10S %.10A %.10B %.10F %.10J %.10P %.10Q %.11N %.20T"
LONG_NORM_FORMAT = "%.15i %9r %.8u %10y %10a %10b %10f %10j %10p %10q %20t"
LEVEL_COLUMN = " %.5L"


def default_format(*, normalized: bool, long_: bool, users: bool, cluster: bool, weights: dict[str, int],
                   level: bool) -> str:
    """sprio's format when none is given (sprio.c), plus our LEVEL column where levels exist."""
    if long_:
        fmt = LONG_NORM_FORMAT if normalized else LONG_FORMAT
    else:
        fmt = "%.15i %9r" + (" %.8c" if cluster else "") + (" %.8u" if users else "")
        fmt += " %10y" if normalized else " %.10Y %.10S"
        for factor in FACTORS:
            if weights.get(factor):
                letter = FACTOR_LETTERS[factor][0 if normalized else 1]
                fmt += f" %10{letter}" if normalized else f" %.10{letter}"
    return fmt + (LEVEL_COLUMN if level else "")


@dataclass(frozen=True)
class Column:
    letter: str  # "" for the text before the first field
    width: int
    right: bool
    suffix: str


def parse_format(fmt: str, known) -> tuple[list[Column], list[str]]:
    """sprio -o: (columns, error messages for the pieces it skipped)."""
    first = fmt.find("%")
    prefix = fmt if first < 0 else fmt[:first]
    columns = [Column("", 0, False, prefix)] if prefix or first < 0 else []
    errors = []
    for piece in (fmt[first:].split("%") if first >= 0 else ()):
        if not piece:
            continue
        i = 1 if piece[0] == "." else 0
        digits = len(piece[i:]) - len(piece[i:].lstrip("0123456789"))
        letter, suffix = piece[i + digits:i + digits + 1], piece[i + digits + 1:]
        if letter not in known:
            errors.append(f"Invalid job format specification: {letter}")
            continue
        columns.append(Column(letter, int(piece[i:i + digits] or 0), i == 1, suffix))
    return columns, errors


def _factor(row: dict, factor: str) -> float:
    return row[factor] if factor in SENT else 0.0


def _weighted(factor: str) -> Callable:
    return lambda row, w: f"{_factor(row, factor) * w.get(factor, 0):.0f}"


def _normalized(factor: str) -> Callable:
    def value(row, w):  # what sprio prints: the weighted factor over its weight, 0 without one
        weight = w.get(factor, 0)
        return f"{_factor(row, factor) * weight / weight if weight else 0.0:.7f}"
    return value


def _weight(factor: str) -> Callable:
    return lambda w: f"{w.get(factor, 0)}"


# letter -> (header, the Weights line's text, the value of a row)
LETTERS: dict[str, tuple[str, Callable, Callable]] = {
    "i": ("JOBID", lambda w: "Weights", lambda row, w: str(row["job_id"])),
    "r": ("PARTITION", lambda w: "", lambda row, w: row["partition"]),
    "u": ("USER", lambda w: "", lambda row, w: row["user"]),
    "c": ("CLUSTER", lambda w: "", lambda row, w: "(null)"),  # Slurm's, outside a federation
    "Y": ("PRIORITY", lambda w: "", lambda row, w: str(row["priority"])),
    "y": ("PRIORITY", lambda w: "", lambda row, w: f"{row['priority'] / UINT32_MAX:16.14f}"),
    "S": ("SITE", lambda w: "1", lambda row, w: "0"),
    "N": ("NICE", lambda w: "", lambda row, w: str(row["nice"])),
    "T": ("TRES", lambda w: "(null)", lambda row, w: ""),
    "t": ("TRES", lambda w: "", lambda row, w: ""),
    "L": ("LEVEL", lambda w: "", lambda row, w: "N/A" if row.get("level") is None else str(row["level"])),
}
for _name, (_norm, _wtd) in FACTOR_LETTERS.items():
    LETTERS[_norm] = (_name.upper(), _weight(_name), _normalized(_name))
    LETTERS[_wtd] = (_name.upper(), _weight(_name), _weighted(_name))


def render(columns: list[Column], rows: list[dict], weights: dict[str, int], *, header: bool,
           weights_line: bool) -> list[str]:
    """The header (unless not), then the Weights line (with -w) or one line per row."""
    def line(text_of: Callable[[str], str]) -> str:
        return "".join((cell(text_of(c.letter), c.width, c.right) if c.letter else "") + c.suffix
                       for c in columns)
    lines = [line(lambda letter: LETTERS[letter][0])] if header else []
    if weights_line:
        return lines + [line(lambda letter: LETTERS[letter][1](weights))]
    return lines + [line(lambda letter, row=row: LETTERS[letter][2](row, weights)) for row in rows]


class SortError(ValueError):
    """-S names a letter sprio does not sort by (the message is sprio's)."""


def _sort_keys(weights: dict[str, int]) -> dict[str, Callable]:
    def weighted(factor):
        return lambda row: _factor(row, factor) * weights.get(factor, 0)
    keys = {"c": lambda row: "", "i": lambda row: row["job_id"], "N": lambda row: row["nice"],
            "r": lambda row: row["partition"], "u": lambda row: row["user"],
            "Y": lambda row: row["priority"], "y": lambda row: row["priority"],
            "T": lambda row: 0, "t": lambda row: 0,
            "L": lambda row: -1 if row.get("level") is None else row["level"]}
    for factor, letters in FACTOR_LETTERS.items():
        for letter in letters:
            keys[letter] = weighted(factor)
    return keys


def sort_rows(rows: list[dict], spec: str | None, weights: dict[str, int]) -> list[dict]:
    """sprio -S (default: job id): each letter from the last, a stable sort, `-` before it: descending."""
    spec = spec or "i"
    keys = _sort_keys(weights)
    out = list(rows)
    for i in range(len(spec) - 1, -1, -1):
        letter = spec[i]
        if letter in ",-+":
            continue
        if letter not in keys:
            raise SortError(f"Invalid sort specification: {letter}")
        out.sort(key=keys[letter], reverse=i > 0 and spec[i - 1] == "-")
    return out
