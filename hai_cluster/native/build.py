"""Compile the C programs into a venv's bin:  python -m hai_cluster.native.build [--bin DIR]

- hsubmit (hsubmit.c), over pip's Python launcher; sbatch, the same program under Slurm's name. It embeds this interpreter's path as it is
  (not resolved: the venv's own python finds the venv's packages), for the one thing it hands to
  Python: --help.
- squeue (squeue.c), over the Python launcher: sends squeue's common forms to the controller, which
  renders the Python squeue's text (controller/api_listing_text.py); runs the Python squeue (this
  interpreter, as for hsubmit) for everything else.
- sacct (sacct.c), the same for sacct (controller/api_sacct_text.py).
All three include client.h, their one copy of the socket and msgpack code.
- hai-jobexec (jobexec.c): what a job's process does between the shepherd's spawn and the job's
  exec (agent/jobproc.py finds it beside the interpreter).

DIR defaults to the directory of this interpreter (a venv's bin). $CC (default cc) and $CFLAGS
(default -O2) are honoured. No compiler: the Python hsubmit stays and the shepherd forks its job
in Python, which work the same, slower (exit 0); so do the Python squeue and sacct. A compile error leaves that program as it was
(exit 1)."""
from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

SOURCE = Path(__file__).with_name("hsubmit.c")
# installed name -> source; sbatch is hsubmit under Slurm's name (its messages say sbatch)
SQUEUE = Path(__file__).with_name("squeue.c")
SACCT = Path(__file__).with_name("sacct.c")
PROGRAMS = {"hsubmit": SOURCE, "sbatch": SOURCE, "squeue": SQUEUE, "sacct": SACCT,
            "hai-jobexec": Path(__file__).with_name("jobexec.c")}
WITH_PYTHON = (SOURCE, SQUEUE, SACCT)  # the programs that run the Python one for what they leave to it
PROG = "hai_cluster.native.build"


def is_compiled(path: Path) -> bool:
    """Whether the program at path is one this module builds (an ELF binary), not pip's launcher."""
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


def c_string(text: str) -> str:
    """A C string literal of text's bytes (a path may hold any of them)."""
    return '"' + "".join(chr(b) if 32 <= b < 127 and b not in b'"\\?' else f"\\{b:03o}"
                         for b in os.fsencode(text)) + '"'


def build(bin_dir: Path) -> int:
    cc = shlex.split(os.environ.get("CC") or "cc")
    cflags = shlex.split(os.environ.get("CFLAGS") or "-O2")
    code = 0
    for name, source in PROGRAMS.items():
        defines = [f"-DHAI_PYTHON={c_string(sys.executable)}"] if source in WITH_PYTHON else []
        fd, tmp = tempfile.mkstemp(prefix=f".{name}-", dir=bin_dir)  # same file system: the rename is atomic
        os.close(fd)
        try:
            try:
                proc = subprocess.run([*cc, *cflags, *defines, "-o", tmp, str(source)], capture_output=True, text=True)
            except OSError as exc:  # no compiler (or not runnable): the Python ways stay
                print(f"{PROG}: no C compiler ({shlex.join(cc)}: {exc.strerror or exc}): "
                      f"the Python hsubmit, squeue and sacct in {bin_dir} stay, and shepherds fork their jobs in Python")
                return 0
            if proc.returncode != 0:
                print(f"{PROG}: compiling {source} failed; {bin_dir / name} is unchanged:\n"
                      f"{proc.stdout}{proc.stderr}", file=sys.stderr, end="")
                code = 1
                continue
            os.chmod(tmp, 0o755)
            os.replace(tmp, bin_dir / name)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        print(f"{PROG}: built {bin_dir / name} (C)")
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {PROG}", description=__doc__.splitlines()[0])
    parser.add_argument("--bin", type=Path, default=Path(sys.executable).parent,
                        help="where to put the programs (default: this interpreter's directory)")
    args = parser.parse_args(argv)
    if not args.bin.is_dir():
        parser.error(f"--bin {args.bin} is not a directory")
    return build(args.bin)


if __name__ == "__main__":
    raise SystemExit(main())
