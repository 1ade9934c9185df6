"""hsubmit: submit a batch script, like sbatch (same options, #HAI or #SBATCH directives)."""
from __future__ import annotations

import os
import sys

from ..core.jobscript import JobScriptError, parse_submission, split_command_line
from .common import call, fail

USAGE = """Usage: hsubmit [OPTIONS] [SCRIPT [ARGS...]]

Submit a batch script. Options are sbatch's, on the command line or as #HAI / #SBATCH
directives at the top of the script (the command line wins):
  -J, --job-name NAME     -N, --nodes N          --gpus-per-node N | --gres=gpu:N | -G, --gpus N
  -c, --cpus-per-task N   --mem SIZE             -t, --time LIMIT      -p, --partition NAME
  -o, --output PATTERN    -e, --error PATTERN    -D, --chdir DIR       --export ALL|NONE|VARS
  --signal [B:]SIG[@SECS] --grace SECONDS        --priority CLASS      --no-requeue   -H, --hold
  --checkpoint-dir DIR    --wrap COMMAND         --parsable
  --container-image PATH (rootfs dir or .tar[.gz])  --runtime none|bwrap|runc
Without SCRIPT and --wrap, the script is read from standard input.
"""


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("--help", "-h") or argv == ["--usage"]:
        print(USAGE, end="")
        return
    try:
        options, script_path, script_args = split_command_line(argv)
    except JobScriptError as exc:
        fail("hsubmit", str(exc))
    script, script_name = None, None
    wraps = any(o == "--wrap" or o.startswith("--wrap=") for o in options)
    if script_path is not None:
        try:
            with open(script_path, encoding="utf-8") as f:
                script = f.read()
        except (OSError, UnicodeDecodeError) as exc:
            fail("hsubmit", f"Unable to open file {script_path}: {getattr(exc, 'strerror', None) or exc}")
        script_name = os.path.basename(script_path)
    elif not wraps:
        if sys.stdin.isatty():
            fail("hsubmit", "no script given (a file, --wrap, or a script on standard input)")
        script = sys.stdin.read()
        script_name = "sbatch"
    cwd, env = os.getcwd(), dict(os.environ)
    try:
        sub = parse_submission(script, options, cwd=cwd, env=env, script_args=script_args, script_name=script_name)
    except (JobScriptError, ValueError) as exc:
        fail("hsubmit", str(exc))
    reply = call("hsubmit", "submit", {"script": script, "script_name": script_name, "option_args": options,
                                       "script_args": script_args, "cwd": cwd, "env": env})
    print(reply["job_id"] if sub.parsable else f"Submitted batch job {reply['job_id']}")
