"""Slurm hostlist syntax: "node[01-04,07],gpu1" <-> a list of host names (pure, no I/O).

A range keeps the width of its lower bound, so "[08-10]" gives 08 09 10 and "[8-10]" gives
8 9 10. Several bracket groups in one name multiply ("r[1-2]n[1-2]" -> r1n1 r1n2 r2n1 r2n2).
`compress` only collapses a name's trailing number, like Slurm ("n1-ib" stays as it is).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import product
from typing import Iterable

MAX_HOSTS = 65536  # Slurm's MAX_RANGE: a typo like n[1-1000000000] must not eat the memory
MAX_DIGITS = 18  # a number wider than this is no host index (and int() of 4,300+ digits refuses)

_LITERAL = re.compile(r"[A-Za-z0-9._-]+")
_RANGE = re.compile(r"([0-9]+)(?:-([0-9]+))?")
# At most MAX_DIGITS trailing digits count as the number; any before them stay in the prefix.
_TRAILING_NUMBER = re.compile(r"(.*?)([0-9]{1,%d})" % MAX_DIGITS)


def expand(text: str) -> list[str]:
    """Expand a hostlist expression into names, in the order written (duplicates kept)."""
    if not text.strip():
        return []
    names: list[str] = []
    for item in _split_top_level(text):
        names.extend(_expand_item(item, text))
        if len(names) > MAX_HOSTS:
            raise ValueError(f"hostlist {text!r}: more than {MAX_HOSTS} hosts")
    return names


def _split_top_level(text: str) -> list[str]:
    """Split on commas outside brackets, checking that brackets pair up and do not nest."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            if depth:
                raise ValueError(f"hostlist {text!r}: nested '[' at position {i}")
            depth = 1
        elif ch == "]":
            if not depth:
                raise ValueError(f"hostlist {text!r}: ']' without '[' at position {i}")
            depth = 0
        elif ch == "," and not depth:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"hostlist {text!r}: '[' is never closed")
    items.append(text[start:])
    return [item.strip() for item in items]


def _expand_item(item: str, text: str) -> list[str]:
    if not item:
        raise ValueError(f"hostlist {text!r}: empty host name")
    # re.split with a group alternates literal, bracket body, literal, ...
    pieces = re.split(r"\[([^\]]*)\]", item)
    choices: list[list[str]] = []
    for i, piece in enumerate(pieces):
        if i % 2:
            choices.append(_expand_ranges(piece, text))
        elif piece:
            if not _LITERAL.fullmatch(piece):
                raise ValueError(f"hostlist {text!r}: invalid character in {piece!r}")
            choices.append([piece])
    count = 1
    for c in choices:
        count *= len(c)
    if count > MAX_HOSTS:
        raise ValueError(f"hostlist {text!r}: more than {MAX_HOSTS} hosts")
    return ["".join(parts) for parts in product(*choices)]


def _expand_ranges(body: str, text: str) -> list[str]:
    out: list[str] = []
    for part in body.split(","):
        m = _RANGE.fullmatch(part.strip())
        if not m:
            raise ValueError(f"hostlist {text!r}: invalid range {part!r} "
                             f"(expected N or N-M with digits only)")
        lo_text, hi_text = m.group(1), m.group(2) or m.group(1)
        if max(len(lo_text), len(hi_text)) > MAX_DIGITS:
            raise ValueError(f"hostlist {text!r}: number in range {part[:40]!r} is longer "
                             f"than {MAX_DIGITS} digits")
        lo, hi = int(lo_text), int(hi_text)
        if hi < lo:
            raise ValueError(f"hostlist {text!r}: range {part!r} goes backwards")
        if hi - lo >= MAX_HOSTS:
            raise ValueError(f"hostlist {text!r}: more than {MAX_HOSTS} hosts")
        width = len(lo_text)
        out.extend(str(n).zfill(width) for n in range(lo, hi + 1))
    return out


@dataclass
class _Run:
    lo: int
    hi: int
    width: int  # zero-padding width, taken from the first name of the run

    @classmethod
    def of(cls, digits: str) -> _Run:
        """A run of one name's number: a zero-padded one fixes the width; an unpadded one pads nothing."""
        return cls(int(digits), int(digits), len(digits) if digits.startswith("0") else 1)

    def extends_to(self, digits: str) -> bool:
        """Whether the number is this run's next, written as the run's padding writes it (so "9"
        and "09" never share a run)."""
        return int(digits) == self.hi + 1 and str(self.hi + 1).zfill(self.width) == digits

    def text(self) -> str:
        lo = str(self.lo).zfill(self.width)
        return lo if self.lo == self.hi else f"{lo}-{str(self.hi).zfill(self.width)}"


def _writable(name: str) -> None:
    if not _LITERAL.fullmatch(name):  # "a,b" or "n[1]" would expand to something else
        raise ValueError(f"host name {name!r} cannot be written in a hostlist "
                         f"(allowed: letters, digits, '.', '_', '-')")


def sort_key(name: str) -> tuple[str, int, int]:
    """Hostlist order: by prefix, then numerically by the trailing number, then by width."""
    m = _TRAILING_NUMBER.fullmatch(name)
    if not m:
        return (name, -1, 0)
    return (m.group(1), int(m.group(2)), len(m.group(2)))


def compress(names: Iterable[str]) -> str:
    """Inverse of expand: unique names, sorted by prefix and number, ranges collapsed."""
    plain: set[str] = set()
    numbered: dict[str, list[str]] = {}  # prefix -> digit strings
    for name in set(names):
        _writable(name)
        m = _TRAILING_NUMBER.fullmatch(name)
        if m:
            numbered.setdefault(m.group(1), []).append(m.group(2))
        else:
            plain.add(name)
    groups: list[tuple[str, int, str]] = [(p, -1, p) for p in plain]
    for prefix, digit_strings in numbered.items():
        runs = _runs(digit_strings)
        body = ",".join(r.text() for r in runs)
        single = len(runs) == 1 and runs[0].lo == runs[0].hi
        groups.append((prefix, runs[0].lo, prefix + body if single else f"{prefix}[{body}]"))
    return ",".join(text for _, _, text in sorted(groups))


def _runs(digit_strings: list[str]) -> list[_Run]:
    """Greedy runs of consecutive numbers; a number joins a run only if the run's padding
    writes it exactly as given, so "9" and "09" never share a run."""
    runs: list[_Run] = []
    for d in sorted(digit_strings, key=lambda d: (int(d), len(d))):
        for run in runs:
            if run.extends_to(d):
                run.hi = int(d)
                break
        else:
            runs.append(_Run.of(d))
    return sorted(runs, key=lambda r: (r.lo, r.width))


def ranged(names: Iterable[str], *, sort: bool = False) -> str:
    """scontrol show hostlist (sort: hostlistsorted): the names as Slurm's hostlist writes them.
    Unlike compress, duplicates stay and, unsorted, so does the order: each name joins the range
    before it when it is that range's next number ("n3,n1,n2,n2" -> "n[3,1-2,2]"), and neighbouring
    ranges of one prefix share a bracket."""
    names = list(names)
    for name in names:
        _writable(name)
    if sort:
        names.sort(key=sort_key)
    ranges: list[tuple[str, _Run | None]] = []  # (prefix, its run; None: a name without a number)
    for name in names:
        m = _TRAILING_NUMBER.fullmatch(name)
        if m is None:
            ranges.append((name, None))
            continue
        prefix, d = m.group(1), m.group(2)
        last = ranges[-1] if ranges else None
        if last and last[0] == prefix and last[1] and last[1].extends_to(d):
            last[1].hi = int(d)
        else:
            ranges.append((prefix, _Run.of(d)))
    out: list[str] = []
    i = 0
    while i < len(ranges):
        prefix, run = ranges[i]
        if run is None:
            out.append(prefix)
            i += 1
            continue
        group = [run]
        while i + len(group) < len(ranges) and ranges[i + len(group)][0] == prefix and ranges[i + len(group)][1]:
            group.append(ranges[i + len(group)][1])
        body = ",".join(r.text() for r in group)
        out.append(prefix + body if len(group) == 1 and run.lo == run.hi else f"{prefix}[{body}]")
        i += len(group)
    return ",".join(out)
