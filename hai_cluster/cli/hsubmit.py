"""hsubmit: submit a batch script, like sbatch (same options, #HAI or #SBATCH directives)."""
from __future__ import annotations

import os
import sys
import time

from ..protocol import minipack
from .client import ClientError, ControllerClient, ReplyLost, Unreachable
from .common import call, fail

# hsubmit, or sbatch: the same command under Slurm's name (bin/sbatch), whose messages say sbatch
PROG = "sbatch" if os.path.basename(sys.argv[0] if sys.argv else "") == "sbatch" else "hsubmit"

USAGE = """Usage: hsubmit [OPTIONS] [SCRIPT [ARGS...]]

Submit a batch script. Options are sbatch's, on the command line or as #HAI / #SBATCH
directives at the top of the script (the command line wins):
  -J, --job-name NAME     -N, --nodes N          --gpus-per-node N | --gres=gpu:N | -G, --gpus N
  -c, --cpus-per-task N   --mem SIZE             -t, --time LIMIT      -p, --partition NAME
  -A, --account NAME      (default: your first account in the controller config)
  -o, --output PATTERN    -e, --error PATTERN    -D, --chdir DIR       --export ALL|NONE|VARS
  --signal [B:]SIG[@SECS] --grace SECONDS        --priority CLASS      --no-requeue   -H, --hold
  --checkpoint-dir DIR    --wrap COMMAND         --parsable   -W, --wait   --test-only   -b, --begin TIME
  --container-image PATH (rootfs dir or .tar[.gz])  --runtime none|bwrap|runc
  -a, --array 0-7|1,3,5-9|0-15:4|0-15%2             -d, --dependency afterok:ID[:ID],singleton,...
  --gpus-per-node 0.25 (a share of one GPU)  --gpu-mem SIZE  --gpu-compute PERCENT
  --gpu-qos guaranteed|burstable|best-effort
Without SCRIPT and --wrap, the script is read from standard input.
"""


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("--help", "-h") or argv == ["--usage"]:
        print(USAGE, end="")
        return
    # One connection for both requests; the small codec: msgpack's C extension would take as long
    # to import as the rest of hsubmit, and the replies here are small.
    client = ControllerClient(wire=minipack)
    try:
        return submit(argv, client)
    finally:
        client.close()


def submit(argv: list[str], client: ControllerClient) -> None:
    """The controller parses the submission (options and directives) and its answer is the one that
    counts; it also says whether the job asked for --parsable or --wait. The first request sends
    the arguments as they are: a --wrap job is submitted by it, else the answer names the script
    to read (None: standard input), which the second request carries."""
    cwd, env = os.getcwd(), dict(os.environ)
    umask = os.umask(0o022)  # reading the umask means setting it: put it back at once
    os.umask(umask)
    problem = not_utf8(cwd, env, argv)
    if problem:
        fail(PROG, problem)
    # The idempotency key: a retry after a lost reply returns the job the first attempt made
    request = {"cwd": cwd, "env": env, "umask": umask, "key": os.urandom(16).hex()}
    reply = _call(client, {**request, "argv": argv})
    if reply.get("need_script"):
        script, script_name = read_script(reply["script_path"])
        reply = _call(client, {**request, "script": script, "script_name": script_name,
                               "option_args": reply["options"], "script_args": reply["script_args"]})
    client.close()  # not held open through --wait
    if "test_only" in reply:
        t = reply["test_only"]
        if t["start"] == "now":
            print(f"{PROG}: Job would start now on nodes {','.join(t['nodes'])} in partition {t['partition']}",
                  file=sys.stderr)
        else:
            print(f"{PROG}: Job would wait in partition {t['partition']}: {t['reason']}", file=sys.stderr)
        return
    job_id = reply["job_id"]
    print(job_id if reply["parsable"] else f"Submitted batch job {job_id}", flush=True)
    if reply["wait"]:
        sys.exit(wait_for_end(job_id))


RETRY_WINDOW = 20.0  # seconds a retry waits for a controller that restarts (systemd: 2 s and its start)


def _call(client: ControllerClient, body: dict) -> dict:
    """The submit request; sent once more, with the same key, when its reply was lost."""
    try:
        return client.call("submit", body)
    except ReplyLost as exc:
        lost = str(exc)
    except ClientError as exc:
        fail(PROG, str(exc))
    client.close()
    deadline = time.monotonic() + RETRY_WINDOW
    while True:
        try:
            return client.call("submit", body)
        except ClientError as exc:
            # Not reachable yet, or not serving yet (its refusals say "try again"): wait within the window
            transient = isinstance(exc, Unreachable) or "try again" in str(exc)
            if not transient or time.monotonic() >= deadline:
                fail(PROG, f"{lost}; the job may have been submitted: check hqueue (retrying failed: {exc})")
        client.close()
        time.sleep(0.5)


def not_utf8(cwd: str, env: dict[str, str], argv: list[str]) -> str | None:
    """The error for what of the submission is not valid UTF-8 (the protocol's strings must be;
    Python reads such bytes as lone surrogates, which the encoder refuses), naming it with the bad
    bytes as \\xNN; None when all is. The C hsubmit checks the same, in the same order."""
    def bad(s: str) -> bool:
        try:
            s.encode("utf-8")
            return False
        except UnicodeEncodeError:
            return True

    def shown(s: str) -> str:
        return os.fsencode(s).decode("utf-8", "backslashreplace")

    if bad(cwd):
        return f"the working directory {shown(cwd)} is not valid UTF-8"
    for name, value in env.items():
        if bad(name) or bad(value):
            return f"environment variable {shown(name)} is not valid UTF-8"
    for arg in argv:
        if bad(arg):
            return f"argument {shown(arg)} is not valid UTF-8"
    return None


def read_script(script_path: str | None) -> tuple[str, str]:
    """The script's text and name: the file's, or standard input's (sbatch's name for it)."""
    if script_path is not None:
        try:
            with open(script_path, "rb") as f:
                data = f.read()
        except OSError as exc:
            fail(PROG, f"Unable to open file {script_path}: {exc.strerror or exc}")
        return decoded(data, f"script {script_path}"), os.path.basename(script_path)
    if sys.stdin.isatty():
        fail(PROG, "no script given (a file, --wrap, or a script on standard input)")
    return decoded(sys.stdin.buffer.read(), "the script on standard input"), "sbatch"


def decoded(data: bytes, what: str) -> str:
    """Strict UTF-8 with universal newlines (\\r\\n and \\r read as \\n), as text-mode reading
    gives, but the same whatever the locale, and an error that says where the bad byte is."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        fail(PROG, f"{what} is not valid UTF-8 (byte 0x{data[exc.start]:02x} at offset {exc.start})")
    return text.replace("\r\n", "\n").replace("\r", "\n")


FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL"}


def wait_for_end(job_id: int) -> int:
    """sbatch -W: poll until the job (every task of an array) ends; its exit code, the highest of
    an array's tasks (1 for a job that ended without one, like Slurm)."""
    while True:
        jobs = call(PROG, "jobs", {"ids": [job_id], "all": True})["jobs"]
        if jobs and all(j["state"] in FINAL for j in jobs):
            return max(0 if j["state"] == "COMPLETED" else (j["exit_code"] or 1) for j in jobs)
        time.sleep(0.5)
