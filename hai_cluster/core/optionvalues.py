"""How each sbatch option's value is read: one parser per option (value_parsers names them),
each returning the value the spec holds or raising BadValue with the message the user sees
(core/jobscript.py adds where the value came from). Pure: no I/O and no clock."""
from __future__ import annotations

import re
import signal as _signal
from typing import Any, Callable, Mapping

from .dependency import DependencyError, parse_dependency
from .hostlist import expand
from .jobids import DEFAULT_MAX_ARRAY_SIZE, ArrayError, parse_array
from .grace import MAX_GRACE_SECONDS
from .model import PRIORITY_CLASSES
from .constraint import ConstraintError, parse_constraint
from .runtimes import RUNTIMES
from .sharing import QOS_CLASSES
from .timefmt import parse_datetime, parse_size_mb, parse_time_limit
from .usertext import MAX_NAME, has_control

_MAX_INT = 2**31 - 1  # keeps every count well inside what the wire and the database hold
MAX_TASKS_PER_NODE = 512  # Slurm's default MaxTasksPerNode
MAX_NAMED_NODES = 1024  # -w/-x: the job table holds them as one comma list (1000 characters)
MAX_COMMENT = 1000  # --comment: what scontrol show job prints on one line
MAX_TASKS = 65536  # a job's tasks (-n): steps will start this many processes
_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class BadValue(Exception):
    """A value's problem, before we know where the value came from."""


def _grace(text: str) -> int:
    n = _int(text, 0)
    if n > MAX_GRACE_SECONDS:
        raise BadValue(f"at most {MAX_GRACE_SECONDS} seconds")
    return n


def _int(text: str, minimum: int) -> int:
    kind = "a positive" if minimum > 0 else "a non-negative"
    if not re.fullmatch(r"[0-9]+", text):
        raise BadValue(f"expected {kind} integer")
    n = int(text)
    if n < minimum:
        raise BadValue(f"expected {kind} integer")
    if n > _MAX_INT:
        raise BadValue(f"{n} is too large")
    return n


def _nonempty(text: str) -> str:
    if not text:
        raise BadValue("must not be empty")
    if has_control(text):
        raise BadValue("must not contain control characters")
    return text


def _job_name(text: str) -> str:
    if len(_nonempty(text)) > MAX_NAME:
        raise BadValue(f"at most {MAX_NAME} characters")
    return text


def _nodes(text: str) -> int:
    lo, dash, hi = text.partition("-")
    if dash and lo != hi:  # sbatch's min-max; "4-4" is the same as "4"
        if re.fullmatch(r"[0-9]+", lo) and re.fullmatch(r"[0-9]*", hi):
            raise BadValue("node count ranges are not supported; give one number")
        raise BadValue("expected a positive integer")
    return _int(lo, 1)


def _task_count(maximum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        n = _int(text, 1)
        if n > maximum:
            raise BadValue(f"at most {maximum} tasks")
        return n
    return parse


def _typed_count(text: str) -> int:
    """[TYPE:]N, as --gpus and --gpus-per-node take it. TYPE is checked, then ignored."""
    gpu_type, colon, count = text.rpartition(":")
    if colon and not _WORD.fullmatch(gpu_type):
        raise BadValue(f"invalid GPU type {gpu_type!r}")
    return _int(count, 0)


def _int_typed(text: str, minimum: int) -> int:
    """[TYPE:]N with N at least `minimum` (--gpus-per-task)."""
    n = _typed_count(text)
    if n < minimum:
        raise BadValue("expected a positive integer")
    return n


def _gpus_per_node(text: str) -> tuple[str, int | float]:
    """[TYPE:]N, or a fraction of one card (0.25): a share of a card (core.sharing)."""
    gpu_type, colon, count = text.rpartition(":")
    if re.fullmatch(r"[0-9]*\.[0-9]+|[0-9]+\.", count):
        if colon and not _WORD.fullmatch(gpu_type):
            raise BadValue(f"invalid GPU type {gpu_type!r}")
        value = float(count)
        if value >= 1:
            raise BadValue("a fraction of a GPU must be below 1 (whole GPUs are whole numbers)")
        if value <= 0:
            raise BadValue("a fraction of a GPU must be above 0")
        return ("fraction", value)
    return ("per_node", _typed_count(text))


def _gpu_qos(text: str) -> str:
    if text not in QOS_CLASSES:
        raise BadValue(f"expected one of {', '.join(QOS_CLASSES)}")
    return text


def _percent(text: str) -> int:
    n = _int(text, 0)
    if n > 100:
        raise BadValue("expected a percentage from 0 to 100")
    return n


def _gres(text: str) -> int:
    """gpu[:TYPE][:COUNT] (COUNT defaults to 1), also spelled gres/gpu; "none" means 0."""
    if text.lower() == "none":
        return 0
    items = text.split(",")
    if len(items) > 1:
        names = [item.partition(":")[0] for item in items]
        other = [n for n in names if n not in ("gpu", "gres/gpu")]
        raise BadValue(f"unsupported GRES {other[0]!r}: only gpu is supported" if other
                   else "gpu is given more than once")
    name, *rest = text.split(":")
    if name not in ("gpu", "gres/gpu"):
        raise BadValue(f"unsupported GRES {name!r}: only gpu is supported")
    if len(rest) == 1 and not re.fullmatch(r"[0-9]+", rest[0]):
        rest.append("1")  # gpu:TYPE means one GPU of that type
    if len(rest) > 2 or (len(rest) == 2 and not _WORD.fullmatch(rest[0])):
        raise BadValue("expected gpu[:TYPE][:COUNT]")
    return _int(rest[-1], 0) if rest else 1


def _size(text: str) -> int:
    try:
        mb = parse_size_mb(text)
    except ValueError as e:
        msg = str(e)
        if re.fullmatch(r"0+[kmgtKMGT]?[bB]?", text.strip()):
            msg += " (Slurm's --mem=0, all of a node's memory, is not supported)"
        raise BadValue(msg) from None
    if mb > _MAX_INT:
        raise BadValue(f"{text} is too large")
    return mb


def _time(text: str) -> int | None:
    try:
        return parse_time_limit(text)  # bounded there, for every reader
    except ValueError as e:
        raise BadValue(str(e)) from None


def _partition(text: str) -> str:
    """NAME or NAME,NAME,...: the job starts in whichever of them can start it first."""
    names = text.split(",")
    for name in names:
        if not _WORD.fullmatch(name):
            raise BadValue("expected partition names (letters, digits, '_', '.', '-'), separated by commas")
    if len(set(names)) != len(names):
        raise BadValue("a partition is given twice")
    if len(text) > 64:  # what the job table holds
        raise BadValue("the partition list is too long (at most 64 characters)")
    return text


def _account(text: str) -> str:
    if not _WORD.fullmatch(text) or len(text) > 64:
        raise BadValue("expected an account name (letters, digits, '_', '.', '-'; at most 64)")
    return text


def _signal_spec(text: str) -> tuple[int, int, bool]:
    """[B:]SIG[@SECONDS] -> (number, seconds, batch). As Slurm's: with B: the warning goes to the
    batch shell alone; without it to the job steps' tasks and not the batch shell. R: (for
    reservations) is accepted and means nothing here."""
    m = re.fullmatch(r"(?:([BR]{1,2}):)?([^@]*)(?:@(.*))?", text)
    if not m or not m.group(2):
        raise BadValue("expected [B:]SIGNAL[@SECONDS]")
    sig = m.group(2)
    if re.fullmatch(r"[0-9]+", sig):
        number = int(sig)
        if not 1 <= number <= 64 or number not in _signal.valid_signals():
            raise BadValue(f"invalid signal number {number}")
    else:
        name = sig.upper()
        name = name if name.startswith("SIG") else "SIG" + name
        try:
            number = int(_signal.Signals[name])
        except KeyError:
            raise BadValue(f"unknown signal {sig!r}") from None
    seconds = 60 if m.group(3) is None else _int(m.group(3), 0)
    if seconds > 65535:
        raise BadValue("the signal time must be at most 65535 seconds")
    return number, seconds, "B" in (m.group(1) or "")


def _priority(text: str) -> str:
    if text.lower() not in PRIORITY_CLASSES:
        raise BadValue(f"expected one of {', '.join(PRIORITY_CLASSES)}")
    return text.lower()


def _export_parser(env: Mapping[str, str]) -> Callable[[str], dict[str, str]]:
    def parse(text: str) -> dict[str, str]:
        items = text.split(",")
        keywords = [item.upper() for item in items]
        if "NONE" in keywords:
            if len(items) > 1:
                raise BadValue("NONE cannot be combined with other variables")
            return {}
        export_all = "ALL" in keywords
        result = dict(env) if export_all else {}
        for item, keyword in zip(items, keywords):
            if keyword == "ALL":
                continue
            name, eq, value = item.partition("=")
            if not _ENV_NAME.fullmatch(name):
                raise BadValue(f"invalid variable name {name!r}")
            if eq:
                # Slurm: with ALL, a variable already in the environment keeps its value.
                if not (export_all and name in env):
                    result[name] = value
            elif name in env:
                result[name] = env[name]
        return result
    return parse


def _begin(now: float | None) -> Callable[[str], float]:
    def parse(text: str) -> float:
        if now is None:
            raise BadValue("the submission time is needed to read --begin")
        try:
            return parse_datetime(text, now, future=True)
        except ValueError as exc:
            raise BadValue(str(exc)) from None
    return parse


def _array(max_size: int | None) -> Callable[[str], str]:
    def parse(text: str) -> str:
        try:
            return parse_array(text, max_size).text
        except ArrayError as exc:
            raise BadValue(f"invalid job array specification: {exc}") from None
    return parse


MAX_DEPENDENCY_TEXT = 4000  # as given; the job table holds at most 1000 of its canonical form


def _dependency(text: str) -> str:
    if len(text) > MAX_DEPENDENCY_TEXT:  # before the parse: its cost grows with the text
        raise BadValue(f"the dependency is too long (at most {MAX_DEPENDENCY_TEXT} characters)")
    try:
        canonical = parse_dependency(text).text
    except DependencyError as exc:
        raise BadValue(f"invalid dependency specification: {exc}") from None
    if len(canonical) > 1000:  # what the job table holds
        raise BadValue("the dependency is too long (at most 1000 characters)")
    return canonical


def value_parsers(env: Mapping[str, str], now: float | None = None,
             max_array_size: int | None = DEFAULT_MAX_ARRAY_SIZE) -> dict[str, Callable[[str], Any]]:
    return {
        "begin": _begin(now), "array": _array(max_array_size), "dependency": _dependency,
        "job-name": _job_name, "nodes": _nodes,
        "gpus-per-node": _gpus_per_node,
        "gpu-mem": _size, "gpu-compute": _percent, "gpu-qos": _gpu_qos,
        "gres": lambda v: ("per_node", _gres(v)),
        "gpus": lambda v: ("total", _typed_count(v)),
        "gpus-per-task": lambda v: _int_typed(v, 1),
        "ntasks": _task_count(MAX_TASKS), "ntasks-per-node": _task_count(MAX_TASKS_PER_NODE),
        "cpus-per-task": lambda v: _int(v, 1), "mem": _size, "time": _time,
        "partition": _partition, "account": _account, "output": _nonempty, "error": _nonempty,
        "chdir": _nonempty, "export": _export_parser(env), "signal": _signal_spec,
        "grace": _grace, "priority": _priority,
        "checkpoint-dir": _nonempty, "wrap": _nonempty,
        "container-image": _nonempty, "runtime": _runtime,
        "comment": _comment, "wckey": _word("a workload characterization key"), "time-min": _time,
        "clusters": lambda v: [c for c in _nonempty(v).split(",") if c] or [v],
        "mem-per-cpu": _size, "mem-per-gpu": _size, "open-mode": _open_mode,
        "nodelist": _node_names, "exclude": _node_names, "mail-type": _mail_types, "mail-user": _mail_user,
        "constraint": _constraint, "qos": _word("a QOS name"), "nice": _nice,
        "reservation": _word("a reservation name"),
    }


MAIL_TYPES = ("BEGIN", "END", "FAIL", "REQUEUE", "ALL", "NONE", "ARRAY_TASKS", "TIME_LIMIT", "TIME_LIMIT_50",
              "TIME_LIMIT_80", "TIME_LIMIT_90", "IDLE")  # IDLE: ours, the idle reclamation's warning
MAIL_NOT_YET = ("INVALID_DEPEND", "STAGE_OUT")
_MAIL_USER = re.compile(r"[A-Za-z0-9._%+=-]+(@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*)?")


def _mail_types(text: str) -> tuple[str, ...]:
    """--mail-type=END,FAIL: sbatch's names (ALL: BEGIN, END, FAIL, REQUEUE and our IDLE here); NONE: none."""
    names = [t.strip().upper() for t in text.split(",") if t.strip()]
    for name in names:
        if name in MAIL_NOT_YET:
            raise BadValue(f"{name} mails are not supported yet (BEGIN, END, FAIL, REQUEUE, ALL, ARRAY_TASKS, "
                           f"TIME_LIMIT, TIME_LIMIT_50/80/90, IDLE are)")
        if name not in MAIL_TYPES:
            raise BadValue(f"invalid mail type {name!r}; expected some of {', '.join(MAIL_TYPES)}")
    return () if "NONE" in names or not names else tuple(dict.fromkeys(names))


def _mail_user(text: str) -> str:
    """A user name or an address, never anything a mail program could take for an option."""
    if len(text) > 254 or not _MAIL_USER.fullmatch(text) or text.startswith("-"):
        raise BadValue("expected a user name or an e-mail address (user@example.org)")
    return text


def _node_names(text: str) -> tuple[str, ...]:
    """-w/-x: a hostlist (n[1-4],gpu7), sorted and without repeats."""
    if "/" in text:
        raise BadValue("a file of node names is not supported: give the names (n[1-4],n7)")
    try:
        names = expand(text)
    except ValueError as exc:
        raise BadValue(str(exc)) from None
    if not names or len(names) > MAX_NAMED_NODES:
        raise BadValue(f"expected 1 to {MAX_NAMED_NODES} node names")
    for name in names:
        if not _WORD.fullmatch(name) or len(name) > 64:
            raise BadValue(f"invalid node name {name[:64]!r}")
    if len(",".join(sorted(set(names)))) > 1000:
        raise BadValue("the node names are more than 1000 characters together")
    return tuple(sorted(set(names)))


MAX_NICE = 2147483645  # sbatch's bound


def _nice(text: str) -> int:
    """--nice=N: N lowers the job's place in its queue (negative raises it: administrators only)."""
    try:
        value = int(text)
    except ValueError:
        raise BadValue("expected a whole number (an adjustment: positive lowers the job's priority)") from None
    if abs(value) > MAX_NICE:
        raise BadValue(f"Invalid nice value, must be between -{MAX_NICE} and {MAX_NICE}")
    return value


def _constraint(text: str) -> str:
    """-C: Slurm's feature expression, checked here and kept as Slurm shows it ("," as "&")."""
    try:
        return parse_constraint(text).text
    except ConstraintError as exc:
        raise BadValue(f"Invalid feature specification: {exc}") from None


def _open_mode(text: str) -> str:
    if text not in ("append", "truncate"):
        raise BadValue("expected append or truncate")
    return text


def _comment(text: str) -> str:
    if has_control(text):
        raise BadValue("must not contain control characters")
    if len(text) > MAX_COMMENT:
        raise BadValue(f"at most {MAX_COMMENT} characters")
    return text


def _word(what: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if not _WORD.fullmatch(text) or len(text) > MAX_NAME:
            raise BadValue(f"expected {what}: letters, digits, '_', '.' or '-' (at most {MAX_NAME})")
        return text
    return parse


def _runtime(text: str) -> str:
    if text not in RUNTIMES:
        raise BadValue(f"expected one of {', '.join(RUNTIMES)}")
    return text
