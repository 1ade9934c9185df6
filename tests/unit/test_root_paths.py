"""Root never follows a path a user can change: a scan of the code that runs as root (the agent, its
shepherds and job processes, hai-dev) for every call that opens, creates, changes or removes a file
by path.

Each such call must be one a scan can see is safe: relative to a directory fd (dir_fd=, with
O_NOFOLLOW for an open), an open with O_NOFOLLOW, or a file of the kernel's (/proc, /sys, /dev).
Every other one is listed below with the reason it is safe, by module and function: a new call
by path in root's code fails this test until someone writes down why a user cannot change that
path (it is in root's own directory, it runs as the user, ...). chown and chmod by path inside a
directory a user can write are never the answer: use safefs (fchown/fchmod on an fd). The
findings of issue 18 (chown through a user's MPS dir, the shepherd opening a user's -o file)
were calls of exactly this kind.
"""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOT_CODE = sorted((REPO / "hai_cluster" / "agent").rglob("*.py")) + [
    REPO / "hai_cluster" / "dev.py", REPO / "hai_cluster" / "devprocs.py", REPO / "hai_cluster" / "safefs.py"]

# Calls that act on a path (the last part of the called name), and the modules they count in.
PATH_CALLS = {"open", "read_text", "read_bytes", "write_text", "write_bytes", "touch", "mkdir", "makedirs",
              "chown", "lchown", "chmod", "rename", "replace", "unlink", "remove", "rmtree", "symlink",
              "symlink_to", "link", "rmdir", "copy", "copyfile", "copytree", "move", "mkfifo"}
KERNEL_FILES = ("/proc/", "/sys/", "/dev/")
NO_FOLLOW = ("O_NOFOLLOW", "DIR_FLAGS")  # safefs.DIR_FLAGS and rootfs._DIR_FLAGS hold O_NOFOLLOW

SPOOL = "the agent's spool: root's directories (runs/ 0711, each run dir root's), which no user can write"
RUN_DIR = "in the run dir, which only root can write (launcher.prepare makes it 0711 root)"
CGROUPFS = "cgroupfs below the agent's own level: only root creates or writes entries there"
AS_USER = "runs with the user's identity (setresuid/seteuid before it): the kernel checks the user's rights"
# (module, function) -> why its calls by path are safe
ALLOWED = {
    ("hai_cluster/agent/cgroups.py", "_write"): CGROUPFS,
    ("hai_cluster/agent/cgroups.py", "_read"): CGROUPFS,
    ("hai_cluster/agent/cgroups.py", "detect"): CGROUPFS,
    ("hai_cluster/agent/cgroups.py", "RunCgroup.create"): CGROUPFS,
    ("hai_cluster/agent/cgroups.py", "RunCgroup.remove"): CGROUPFS,
    ("hai_cluster/agent/cgroups.py", "RunCgroup.oom_notifier"): CGROUPFS,
    ("hai_cluster/agent/cgroups.py", "adopt_delegated"): CGROUPFS + " (the agent's own leaf in its delegated cgroup)",
    ("hai_cluster/agent/isolation.py", "NodeIsolation.release"): CGROUPFS,
    ("hai_cluster/agent/fencing.py", "EpochGate._load"): SPOOL,
    ("hai_cluster/agent/fencing.py", "EpochGate._store"): SPOOL,
    ("hai_cluster/agent/runs.py", "RunTable.setup"): SPOOL,
    ("hai_cluster/agent/runs.py", "RunTable._start"): SPOOL + "; rmtree removes fd-relative, never through a link",
    ("hai_cluster/agent/runs.py", "RunTable.forget"): SPOOL + "; rmtree removes fd-relative, never through a link",
    ("hai_cluster/agent/launcher.py", "prepare"): SPOOL + "; the run dir is made here (os.mkdir fails if it exists)",
    ("hai_cluster/agent/launcher.py", "_log_tail"): RUN_DIR,
    ("hai_cluster/agent/launcher.py", "launch"): RUN_DIR,
    ("hai_cluster/agent/spool.py", "write_bytes_atomic"): RUN_DIR + " (and the spool's own files)",
    ("hai_cluster/agent/spool.py", "make_control_dir"): RUN_DIR,
    ("hai_cluster/agent/spool.py", "read_json"): RUN_DIR,
    ("hai_cluster/agent/jobproc.py", "exec_job"): (
        "the run's cgroup.procs (cgroupfs), then the checkpoint dir and the output files opened as the user "
        "(after setresuid: " + AS_USER + ")"),
    ("hai_cluster/agent/mps.py", "MpsControl._make_dirs"): (
        "sharing.run_dir, the operator's path (root's, checked by fstat); everything below it by fd (safefs)"),
    ("hai_cluster/agent/adopt.py", "Adopter._env_dir"): (
        "[adopt] env_dir, the operator's path, made if missing; then opened O_NOFOLLOW and checked root's "
        "by fstat, and everything in it by fd"),
    ("hai_cluster/agent/simgpu.py", "_EventSet.read"): "the simulated backend's event file, from the agent's config",
    ("hai_cluster/agent/runtimes/bwrap.py", "Bwrap.prepare"): RUN_DIR,
    ("hai_cluster/agent/runtimes/runc.py", "Runc.prepare"): RUN_DIR,
    ("hai_cluster/agent/runtimes/runc.py", "_runc_error"): RUN_DIR + " (runc.log, written by runc as root)",
    ("hai_cluster/agent/runtimes/podman.py", "_env_file"): RUN_DIR,
    ("hai_cluster/agent/runtimes/podman.py", "Podman.prepare"): RUN_DIR,
    ("hai_cluster/agent/runtimes/common.py", "_stage_point"): RUN_DIR,
    ("hai_cluster/agent/runtimes/inner.py", "write_launchers"): RUN_DIR,
    ("hai_cluster/agent/steps.py", "_link_old_path"): SPOOL,
    ("hai_cluster/agent/runtimes/inner.py", "elf_interpreter"): "the agent's own interpreter (the real path of "
                                                                "sys.executable): root's installation",
    ("hai_cluster/agent/runtimes/common.py", "image_rootfs"): "the image is opened inside as_user: " + AS_USER,
    ("hai_cluster/agent/runtimes/rootfs.py", "open_staged"): "opened O_PATH in the job child as the user: " + AS_USER,
    ("hai_cluster/agent/runtimes/rootfs.py", "_overlay"): RUN_DIR + " (the overlay's scratch dir)",
    ("hai_cluster/agent/runtimes/cache.py", "acquire"): "the node's image cache: root's, 0700",
    ("hai_cluster/agent/runtimes/cache.py", "_drop"): "the node's image cache: root's, 0700",
    ("hai_cluster/agent/runtimes/cache.py", "_unpack"): "the node's image cache: root's, 0700",
    ("hai_cluster/agent/runtimes/cache.py", "_size"): "the node's image cache: root's, 0700",
    ("hai_cluster/agent/runtimes/cache.py", "_remove"): "the node's image cache: root's, 0700",
    ("hai_cluster/agent/runtimes/cache.py", "_remove_leftovers"): "the node's image cache: root's, 0700",
    ("hai_cluster/dev.py", "down"): "the dev directory, proven the caller's and private by safefs.open_private_dir",
}


def _prefix(node: ast.AST) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
        return str(node.values[0].value)
    return ""


def _is_path_call(call: ast.Call) -> bool:
    name = ast.unparse(call.func)
    last = name.rpartition(".")[2]
    if last not in PATH_CALLS:
        return False
    if last in ("replace", "remove"):  # str.replace, list.remove, cgroup.remove(): only the os ones
        return name in ("os.replace", "os.remove")
    if last == "open":  # the builtin, os.open, a Path's open; not tarfile.open(fileobj=...) nor starter.open()
        if name in ("open", "os.open"):
            return True
        target = call.func.value if isinstance(call.func, ast.Attribute) else None
        return isinstance(target, (ast.Call, ast.BinOp)) or isinstance(target, ast.Attribute) and any(
            word in ast.unparse(target).lower() for word in ("path", "dir", "file"))
    return True


def _safe(call: ast.Call) -> bool:
    name = ast.unparse(call.func)
    src = ast.unparse(call)
    keywords = {k.arg for k in call.keywords}
    first = call.args[0] if call.args else None
    if first is not None and (_prefix(first).startswith(KERNEL_FILES) or ast.unparse(first) == "os.devnull"):
        return True
    if name.endswith(("chown", "chmod")):  # by path only without following, relative to a directory fd
        return "dir_fd" in keywords and "follow_symlinks=False" in src
    no_follow = any(flag in src for flag in NO_FOLLOW)
    if keywords & {"dir_fd", "src_dir_fd", "dst_dir_fd"}:
        return name != "os.open" or no_follow
    return name == "os.open" and no_follow


def path_calls() -> list[tuple[str, str, int, str]]:
    """(module, function, line, call) of every call by path in root's code that no rule clears."""
    found = []
    for path in ROOT_CODE:
        module = str(path.relative_to(REPO))

        def visit(node: ast.AST, where: str) -> None:
            for child in ast.iter_child_nodes(node):
                inner = where
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    inner = f"{where}.{child.name}" if where else child.name
                if isinstance(child, ast.Call) and _is_path_call(child) and not _safe(child):
                    found.append((module, where or "<module>", child.lineno, ast.unparse(child)[:100]))
                visit(child, inner)
        visit(ast.parse(path.read_text()), "")
    return found


def test_every_call_by_path_in_roots_code_is_safe_or_says_why():
    unexplained = [f"{m}:{line} in {f}: {call}" for m, f, line, call in path_calls() if (m, f) not in ALLOWED]
    assert not unexplained, ("calls by path in code that runs as root, neither fd-relative nor O_NOFOLLOW "
                             "nor listed in ALLOWED with a reason:\n  " + "\n  ".join(unexplained))


def test_every_listed_exception_is_still_needed():
    used = {(m, f) for m, f, _, _ in path_calls()}
    assert not sorted(set(ALLOWED) - used), "ALLOWED lists functions with no call by path left: remove them"


def test_no_chown_or_chmod_by_path_in_roots_code():
    """The MPS escalation: os.chown(path) followed a symlink the user put in their directory."""
    calls = [(m, f, line, c) for m, f, line, c in path_calls() if "chown(" in c]
    assert calls == [], calls


def test_the_scan_sees_the_patterns_it_is_for():
    """The rules catch the calls of the audit's findings (a scan that sees nothing proves nothing)."""
    def flagged(code: str) -> bool:
        return any(_is_path_call(n) and not _safe(n) for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Call))
    assert flagged("os.chown(d, uid, gid)") and flagged("open(spec.stderr, 'rb')")
    assert flagged("(pipe / 'x.pid').read_text()") and flagged("d.mkdir(exist_ok=True, mode=0o700)")
    assert flagged("os.open(path, os.O_RDONLY)") and flagged("os.chmod(path, 0o600, dir_fd=fd)")
    assert not flagged("os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=fd)")
    assert not flagged("os.fchown(fd, uid, gid)") and not flagged("open(f'/proc/{pid}/stat', 'rb')")
    assert not flagged("os.chown(name, 1, 1, dir_fd=fd, follow_symlinks=False)")
    assert flagged("(d / 'x').open('w')") and flagged("self.path.open()")
    assert not flagged("text.replace('a', 'b')") and not flagged("tarfile.open(fileobj=f)")
    assert not flagged("agent.starter.open()")


def test_every_list_a_request_carries_is_bounded():
    """Every list the controller's API takes goes through requests.list_field (at most MAX_LIST entries): a
    cancel of 4,000 unknown ids held the store 3 s, one query each."""
    api_code = [REPO / "hai_cluster" / "controller" / name for name in (
        "api_submit.py", "api_jobs.py", "api_control.py", "apicontext.py", "membership.py", "requests.py")]
    unbounded = []
    for path in api_code:
        tree = ast.parse(path.read_text())
        for fn in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            for call in (n for n in ast.walk(fn) if isinstance(n, ast.Call)):
                if (ast.unparse(call.func) == "expect" and len(call.args) >= 3
                        and ast.unparse(call.args[2]) == "list" and fn.name != "list_field"):
                    unbounded.append(f"{path.name}:{call.lineno} in {fn.name}")
    assert unbounded == [], unbounded
