"""conf/constraints.txt: the versions of every package hai-cluster needs at run time, as this venv
resolved them, for pip's -c. install-controller and install-node (and scripts/test) install with
it, so a controller and a node installed a month apart run the same stack.

    .venv/bin/python scripts/lib/constraints.py > conf/constraints.txt     # regenerate
    .venv/bin/python scripts/lib/constraints.py --check conf/constraints.txt

The set is hai-cluster's install_requires with the extras the install scripts ask for (postgres)
and hai-sim's (plot), and all they require in turn, with each requirement's environment markers
evaluated for this interpreter (CPython 3.11 on Debian 12, Linux x86_64: a package needed only on
Windows or before 3.11 is not listed). Only the standard library and pip's own packaging are used:
run it with the venv whose versions it should write (after `pip install -U` there, to move on)."""
from __future__ import annotations

import re
import sys
from importlib.metadata import PackageNotFoundError, distribution

try:
    from packaging.requirements import Requirement
except ImportError:  # a venv without packaging installed: pip carries its own copy
    from pip._vendor.packaging.requirements import Requirement

PROJECT = "hai-cluster"
EXTRAS = ("postgres", "plot")  # what the install scripts and hai-sim use; not "test"


def canonical(name: str) -> str:
    """PEP 503: the name pip compares, whatever the spelling (SQLAlchemy, typing_extensions)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(project: str = PROJECT, extras: tuple[str, ...] = EXTRAS) -> dict[str, tuple[str, set[str]]]:
    """{canonical name: (installed version, {names of the packages that require it})} for everything
    `project[extras]` needs here, the project itself left out. A requirement that this environment
    should satisfy but does not (a missing package) is an error, not a gap in the file."""
    found: dict[str, tuple[str, set[str]]] = {}
    todo = [(project, set(extras), None)]
    seen: set[tuple[str, frozenset[str]]] = set()
    while todo:
        name, wanted, parent = todo.pop()
        key = canonical(name)
        if (key, frozenset(wanted)) in seen:
            if parent is not None:
                found[key][1].add(parent)
            continue
        seen.add((key, frozenset(wanted)))
        try:
            dist = distribution(name)
        except PackageNotFoundError:
            raise SystemExit(f"constraints: {name} (required by {parent}) is not installed in {sys.prefix}: "
                             f"pip install '{PROJECT}[{','.join(EXTRAS)}]' there first") from None
        if key != canonical(project):
            version, parents = found.setdefault(key, (dist.version, set()))
            if parent is not None:
                parents.add(parent)
        for line in dist.requires or ():
            req = Requirement(line)
            applies = any(req.marker is None or req.marker.evaluate({"extra": e}) for e in (wanted or {""}))
            if applies:
                todo.append((req.name, set(req.extras), key))
    return found


def render(found: dict[str, tuple[str, set[str]]]) -> str:
    py = ".".join(map(str, sys.version_info[:2]))
    lines = [
        f"# hai-cluster's run-time stack, pinned: {PROJECT}[{','.join(EXTRAS)}] and everything it requires, as",
        f"# resolved for CPython {py} on Debian 12 (Linux x86_64). scripts/install-controller and",
        "# scripts/install-node pass this file to pip (-c), so every host installs these versions.",
        "# Regenerate from a venv that has the versions you want (scripts/test builds .venv with them):",
        "#   .venv/bin/python scripts/lib/constraints.py > conf/constraints.txt",
    ]
    width = max(len(f"{k}=={v}") for k, (v, _) in found.items())
    for key in sorted(found):
        version, parents = found[key]
        via = ", ".join(sorted(p.replace(canonical(PROJECT), PROJECT) for p in parents))
        lines.append(f"{key}=={version}".ljust(width + 2) + f"# via {via}")
    return "\n".join(lines) + "\n"


def pins(text: str) -> dict[str, str]:
    """{canonical name: version} of a constraints file's `name==version` lines."""
    out = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, sep, version = line.partition("==")
            if not sep:
                raise ValueError(f"not a name==version pin: {line!r}")
            out[canonical(name.strip())] = version.strip()
    return out


def main(argv: list[str]) -> int:
    if not argv:
        sys.stdout.write(render(closure()))
        return 0
    if len(argv) == 2 and argv[0] == "--check":
        with open(argv[1]) as f:
            have = pins(f.read())
        want = {k: v for k, (v, _) in closure().items()}
        problems = [f"{k}: {argv[1]} pins {have.get(k, 'nothing')}, this venv has {v}"
                    for k, v in sorted(want.items()) if have.get(k) != v]
        problems += [f"{k}: pinned in {argv[1]} but not required" for k in sorted(set(have) - set(want))]
        for p in problems:
            print(p, file=sys.stderr)
        return 1 if problems else 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
