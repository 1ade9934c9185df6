"""-C/--constraint: which nodes a job may take, by the features each node declares (agent.toml).

Slurm's syntax (sbatch(1)): a name ("a100"), AND ("a100&ib"; "," too, as Slurm reads it), OR
("a100|h100", nodes may differ), parentheses, a node count on one feature ("a100*2": at least two
of the job's nodes have it), and one bracketed set joined to the rest with "&": matching OR
("[rack1|rack2]": every node has the same one) or multiple counts ("[rack1*2&rack2*4]": that many
nodes of each). Pure: parse once at the boundary, then a node check and a node-set choice.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Sequence, TypeVar

MAX_TEXT = 1024
MAX_DEPTH = 16  # parentheses: the parse recurses per level
MAX_ALTERNATIVES = 64  # a DNF past this is refused, not computed: the request's cost stays bounded
FEATURE_NAME = re.compile(r"[A-Za-z0-9_.:+-]{1,64}")
_TOKEN = re.compile(r"([A-Za-z0-9_.:+-]+)|([&|,*()\[\]])")

Dnf = tuple[frozenset[str], ...]  # a node matches if it has every feature of one member
T = TypeVar("T")


class ConstraintError(ValueError):
    pass


@dataclass(frozen=True)
class Constraint:
    text: str  # as Slurm shows it (Features=): "," written "&"
    node_any: Dnf  # every node of the job matches this
    matching: Dnf = ()  # [a|b]: all the job's nodes match the same member
    counts: tuple[tuple[Dnf, int], ...] = ()  # at least n of the job's nodes match each
    names: frozenset[str] = frozenset()  # every feature named

    @property
    def min_nodes(self) -> int:
        return sum(n for _, n in self.counts)

    def node_ok(self, features: frozenset[str]) -> bool:
        return matches(self.node_any, features)

    def choose(self, candidates: Sequence[T], n: int, features: Callable[[T], frozenset[str]]) -> list[T] | None:
        """n of the candidates (each already node_ok, in the caller's order of preference) that
        meet the set-wide parts, the first ones that do; None if no n do. Counts are met greedily,
        the group with the fewest matching candidates first (not a full matching)."""
        if self.matching:
            for member in self.matching:
                pool = [c for c in candidates if member <= features(c)]
                if len(pool) >= n:
                    return pool[:n]
            return None
        if self.min_nodes > n:
            return None
        chosen: list[T] = []
        left = list(candidates)
        # the scarcest group first: a node of two groups then serves the one with fewer choices
        groups = sorted(self.counts, key=lambda g: sum(matches(g[0], features(c)) for c in left))
        for dnf, k in groups:
            got = [c for c in left if matches(dnf, features(c))][:k]
            if len(got) < k:
                return None
            chosen += got
            taken = {id(g) for g in got}
            left = [c for c in left if id(c) not in taken]
        rest = left[:n - len(chosen)]
        return chosen + rest if len(chosen) + len(rest) >= n else None

    @property
    def set_wide(self) -> bool:
        """It says something about the node set, not only about each node."""
        return bool(self.matching or self.counts)


def matches(dnf: Dnf, features: frozenset[str]) -> bool:
    return any(member <= features for member in dnf)


def _and(a: Dnf, b: Dnf) -> Dnf:
    out = tuple(dict.fromkeys(x | y for x in a for y in b))
    if len(out) > MAX_ALTERNATIVES:
        raise ConstraintError(f"too many alternatives (more than {MAX_ALTERNATIVES})")
    return out


def _or(a: Dnf, b: Dnf) -> Dnf:
    out = tuple(dict.fromkeys(a + b))
    if len(out) > MAX_ALTERNATIVES:
        raise ConstraintError(f"too many alternatives (more than {MAX_ALTERNATIVES})")
    return out


@dataclass(frozen=True)
class _Counted:
    dnf: Dnf
    count: int | None


@dataclass(frozen=True)
class _Bracket:
    matching: Dnf  # [a|b]
    counts: tuple[tuple[Dnf, int], ...]  # [a*1&b*2]


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens: list[str] = []
        pos = 0
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if m is None:
                what = "a space" if text[pos].isspace() else repr(text[pos])
                raise ConstraintError(f"{what} at position {pos + 1} (features are letters, digits and _.:+-; "
                                      f"operators & | , * ( ) [ ])")
            self.tokens.append(m.group(0))
            pos = m.end()
        self.i = 0
        self.brackets = 0
        self.names: set[str] = set()
        self.depth = 0

    def peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self) -> str:
        tok = self.peek()
        if tok is None:
            raise ConstraintError("it ends where a feature is expected")
        self.i += 1
        return tok

    def expect(self, tok: str) -> None:
        if self.peek() != tok:
            raise ConstraintError(f"expected {tok!r}, found {self.peek() or 'the end'!r}")
        self.i += 1

    def count(self) -> int | None:
        if self.peek() != "*":
            return None
        self.i += 1
        tok = self.take()
        if not tok.isdigit() or not 0 < int(tok) <= 100000:
            raise ConstraintError(f"a count after '*' is a whole number from 1, got {tok!r}")
        return int(tok)

    def factor(self, top: bool) -> _Counted | _Bracket:
        tok = self.take()
        if tok == "[":
            if not top:
                raise ConstraintError("brackets [...] only at the top level, joined to the rest with &")
            self.brackets += 1
            if self.brackets > 1:
                raise ConstraintError("only one bracketed set [...] per constraint")
            return self.bracket()
        if tok == "(":
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise ConstraintError(f"parentheses nested deeper than {MAX_DEPTH}")
            inner = self.or_expr(top=False)
            self.depth -= 1
            self.expect(")")
            return _Counted(inner, self.count())
        if FEATURE_NAME.fullmatch(tok):
            self.names.add(tok)
            return _Counted((frozenset((tok,)),), self.count())
        raise ConstraintError(f"{tok!r} where a feature is expected")

    def bracket(self) -> _Bracket:
        items = [self.factor(top=False)]
        ops = set()
        while self.peek() in ("|", "&", ","):
            ops.add("&" if self.take() in "&," else "|")
            items.append(self.factor(top=False))
        self.expect("]")
        bracket_count = self.count()
        if bracket_count is not None or len(ops) > 1:
            raise ConstraintError("a bracketed set is either [a|b] (matching OR) or [a*N&b*M] (counts)")
        assert all(isinstance(x, _Counted) for x in items)
        if ops == {"&"}:
            if any(x.count is None for x in items):
                raise ConstraintError("in [a*N&b*M] every part needs a count")
            return _Bracket((), tuple((x.dnf, x.count) for x in items))
        if any(x.count is not None for x in items):
            raise ConstraintError("no counts in a matching OR [a|b]")
        dnf: Dnf = ()
        for x in items:
            dnf = _or(dnf, x.dnf)
        return _Bracket(dnf, ())

    def and_expr(self, top: bool) -> list[_Counted | _Bracket]:
        parts = [self.factor(top)]
        while self.peek() in ("&", ","):
            self.i += 1
            parts.append(self.factor(top))
        return parts

    def or_expr(self, top: bool) -> Dnf:
        """Below the top level: counts and brackets are not allowed."""
        dnf: Dnf = ()
        while True:
            term: Dnf = (frozenset(),)
            for part in self.and_expr(top):
                if not isinstance(part, _Counted) or part.count is not None:
                    raise ConstraintError("a count (*N) inside parentheses or an OR needs brackets: "
                                          "[(a|b)*N&c*M]")
                term = _and(term, part.dnf)
            dnf = _or(dnf, term)
            if self.peek() != "|":
                return dnf
            self.i += 1


def _canonical(text: str) -> str:
    return text.replace(",", "&")


@lru_cache(maxsize=4096)  # the snapshot parses each pending job's text on every pass
def parse_constraint(text: str) -> Constraint:
    """The constraint `text` means, or ConstraintError saying what is wrong with it."""
    if not text:
        raise ConstraintError("it is empty")
    if len(text) > MAX_TEXT:
        raise ConstraintError(f"it is longer than {MAX_TEXT} characters")
    p = _Parser(text)
    start = p.i
    parts = p.and_expr(top=True)

    def made(node_any: Dnf, **kw) -> Constraint:
        return Constraint(_canonical(text), node_any, names=frozenset(p.names), **kw)
    if p.peek() == "|":  # an OR at the top: no brackets, no counts; parse it again as a plain expression
        if any(not isinstance(x, _Counted) for x in parts):
            raise ConstraintError("a bracketed set [...] can only be joined with &")
        p.i, p.brackets, p.depth = start, 0, 0
        node_any = p.or_expr(top=False)
        if p.peek() is not None:
            raise ConstraintError(f"unexpected {p.peek()!r}")
        return made(node_any)
    if p.peek() is not None:
        raise ConstraintError(f"unexpected {p.peek()!r}")
    plain: Dnf = (frozenset(),)
    bracket: _Bracket | None = None
    counted: list[_Counted] = []
    for part in parts:
        if isinstance(part, _Bracket):
            bracket = part
        elif part.count is not None:
            counted.append(part)
        else:
            plain = _and(plain, part.dnf)
    if counted and (len(parts) > 1):
        raise ConstraintError("with more than one feature, counts need brackets: [a*N&b*M]")
    if counted:  # "a100*2": at least two nodes with it, the others any
        return made((frozenset(),), counts=((counted[0].dnf, counted[0].count),))
    if bracket is None:
        return made(plain)
    if bracket.matching:
        matching = _and(bracket.matching, plain)
        return made(matching, matching=matching)
    counts = tuple((_and(dnf, plain), n) for dnf, n in bracket.counts)
    node_any: Dnf = ()
    for dnf, _ in counts:
        node_any = _or(node_any, dnf)
    return made(node_any, counts=counts)


def feature_list(values: Sequence[str], where: str) -> tuple[str, ...]:
    """A node's declared features (agent.toml), each a valid name; ValueError naming the bad one."""
    out = []
    for v in values:
        if not isinstance(v, str) or not FEATURE_NAME.fullmatch(v):
            raise ValueError(f"{where}: feature {v!r} is not a name of 1-64 letters, digits and _.:+-")
        out.append(v)
    return tuple(dict.fromkeys(out))
