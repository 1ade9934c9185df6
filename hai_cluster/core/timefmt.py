"""Time limits, durations and memory sizes in Slurm's text formats (pure, no I/O).

`parse_time_limit` reads sbatch's `-t` forms; `format_duration` writes squeue's TIME column.
Like Slurm's time_str2secs, fields are not range-checked ("1:90" is 150 s), but unlike
sbatch we keep seconds instead of rounding up to whole minutes: our scheduler works in seconds.
"""
from __future__ import annotations

import re

_UNLIMITED = {"unlimited", "infinite", "-1"}  # "-1" is Slurm's spelling of INFINITE too
_FIELD = r"([0-9]+)"  # ASCII digits only: \d would accept other scripts' digits
_DAYS_FORM = re.compile(rf"{_FIELD}-{_FIELD}(?::{_FIELD}(?::{_FIELD})?)?")
_CLOCK_FORM = re.compile(rf"{_FIELD}(?::{_FIELD}(?::{_FIELD})?)?")
_SIZE = re.compile(r"([0-9]+)([kmgt]?)(b?)", re.IGNORECASE)
_SIZE_FACTOR_KIB = {"k": 1, "": 1024, "m": 1024, "g": 1024**2, "t": 1024**3}

_TIME_FORMS = ('expected minutes, minutes:seconds, hours:minutes:seconds, days-hours, '
               'days-hours:minutes, days-hours:minutes:seconds, or UNLIMITED')


MAX_TIME_LIMIT = 2**31 - 1  # seconds: what the store's time_limit column holds


def parse_time_limit(text: str) -> int | None:
    """sbatch -t value -> seconds; None for no limit ("0", "UNLIMITED", "INFINITE", "-1")."""
    s = text.strip()
    if s.lower() in _UNLIMITED:
        return None
    if s.startswith("-"):
        raise ValueError(f"invalid time limit {text!r}: must not be negative")
    if m := _DAYS_FORM.fullmatch(s):
        d, h, mi, sec = (int(g or 0) for g in m.groups())
        total = ((d * 24 + h) * 60 + mi) * 60 + sec
    elif m := _CLOCK_FORM.fullmatch(s):
        parts = [int(g) for g in m.groups() if g is not None]
        if len(parts) == 3:
            h, mi, sec = parts
        else:  # "minutes" or "minutes:seconds"
            h, mi, sec = 0, parts[0], parts[1] if len(parts) == 2 else 0
        total = (h * 60 + mi) * 60 + sec
    else:
        raise ValueError(f"invalid time limit {text!r}: {_TIME_FORMS}")
    if total > MAX_TIME_LIMIT:  # every reader: the job script, hcontrol update, a partition's MaxTime
        raise ValueError(f"invalid time limit {text!r}: longer than {MAX_TIME_LIMIT} seconds (about 68 years)")
    return total or None  # sbatch: a limit of zero means no limit


def format_duration(seconds: int | float) -> str:
    """squeue's TIME column: "M:SS", "H:MM:SS" or "D-HH:MM:SS" (fractions are dropped)."""
    if seconds < 0:
        raise ValueError(f"negative duration: {seconds}")
    total = int(seconds)
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"
    if hours:
        return f"{hours}:{minutes:02d}:{secs:02d}"
    return f"{minutes}:{secs:02d}"


def slurm_duration(seconds: float) -> str:
    """Slurm's secs2time_str (sacct's Elapsed, MailProg's run times): HH:MM:SS, D-HH:MM:SS past a day."""
    days, rest = divmod(max(0, int(seconds)), 86400)
    text = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{text}" if days else text


def slurm_cpu_time(seconds: float) -> str:
    """sacct's _elapsed_time (TotalCPU, AveCPU): as slurm_duration, but under an hour with the
    milliseconds when there are any (MM:SS.mmm)."""
    whole = max(0, int(seconds))
    millis = int(round((max(0.0, seconds) - whole) * 1e6)) // 1000
    if whole >= 3600 or not millis:
        return slurm_duration(whole)
    return f"{whole // 60 % 60:02d}:{whole % 60:02d}.{millis:03d}"


def format_limit(seconds: int | None) -> str:
    """squeue's TIME_LIMIT column: "UNLIMITED" for no limit, else like format_duration."""
    return "UNLIMITED" if seconds is None else format_duration(seconds)


def parse_size_mb(text: str) -> int:
    """--mem value -> MiB, rounded up. Integer with an optional K/M/G/T suffix (default M);
    a trailing B is allowed after the suffix ("32GB"), as Slurm's str_to_mbytes does."""
    if text.strip().startswith("-"):
        raise ValueError(f"invalid memory size {text!r}: must not be negative")
    m = _SIZE.fullmatch(text.strip())
    if not m or (m.group(3) and not m.group(2)):
        raise ValueError(f"invalid memory size {text!r}: expected a positive integer "
                         f"with an optional K, M, G or T suffix (default M)")
    kib = int(m.group(1)) * _SIZE_FACTOR_KIB[m.group(2).lower()]
    if kib == 0:
        raise ValueError(f"invalid memory size {text!r}: must be greater than zero")
    return -(-kib // 1024)  # ceiling division


# ---- points in time (sbatch --begin, sacct -S/-E) ----------------------------------------------
_REL = re.compile(r"now(?:([+-])([0-9]+)(seconds?|minutes?|hours?|days?|weeks?|s|m|h|d|w)?)?", re.IGNORECASE)
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_NAMED = {"midnight": (0, 0), "noon": (12, 0), "teatime": (16, 0), "today": (0, 0)}
_DATE_TIME = re.compile(r"([0-9]{4})-([0-9]{1,2})-([0-9]{1,2})(?:[T ]([0-9]{1,2}):([0-9]{2})(?::([0-9]{2}))?)?")
_US_DATE = re.compile(r"([0-9]{1,2})/([0-9]{1,2})(?:/([0-9]{2}))?")
_TIME_OF_DAY = re.compile(r"([0-9]{1,2}):([0-9]{2})(?::([0-9]{2}))?")
_POINT_FORMS = ("expected now[+-N[units]], HH:MM[:SS], YYYY-MM-DD[THH:MM[:SS]], MM/DD[/YY], "
                "midnight, noon, teatime, today or tomorrow")


def parse_datetime(text: str, now: float, *, future: bool = False) -> float:
    """A point in time in Slurm's formats -> epoch seconds, in the local time zone.

    `now` is passed in (this module reads no clock). With future=True (sbatch --begin), a bare
    time of day or a named time that has passed today means tomorrow, as in Slurm."""
    import datetime as dt

    s = text.strip()
    base = dt.datetime.fromtimestamp(now)
    if m := _REL.fullmatch(s):
        sign, count, unit = m.groups()
        if sign is None:
            return now
        if len(count) > 12:  # past any date a clock shows (a float cannot hold 320 digits: seventh audit)
            raise ValueError(f"invalid time {text!r}: {count} is too large")
        seconds = int(count) * _UNIT[(unit or "s")[0].lower()]
        return now + seconds if sign == "+" else now - seconds
    low = s.lower()
    if low in _NAMED or low == "tomorrow":
        h, mi = _NAMED.get(low, (0, 0))
        t = base.replace(hour=h, minute=mi, second=0, microsecond=0)
        if low == "tomorrow" or (future and low != "today" and t.timestamp() <= now):
            t += dt.timedelta(days=1)
        return t.timestamp()
    try:
        if m := _DATE_TIME.fullmatch(s):
            y, mo, d, h, mi, sec = (int(g or 0) for g in m.groups())
            return dt.datetime(y, mo, d, h, mi, sec).timestamp()
        if m := _US_DATE.fullmatch(s):
            mo, d, y = m.groups()
            year = 2000 + int(y) if y else base.year
            return dt.datetime(year, int(mo), int(d)).timestamp()
        if m := _TIME_OF_DAY.fullmatch(s):
            h, mi, sec = (int(g or 0) for g in m.groups())
            t = base.replace(hour=h, minute=mi, second=sec, microsecond=0)
            if future and t.timestamp() <= now:
                t += dt.timedelta(days=1)
            return t.timestamp()
    except ValueError as exc:  # e.g. month 13, hour 25
        raise ValueError(f"invalid time {text!r}: {exc}") from None
    raise ValueError(f"invalid time {text!r}: {_POINT_FORMS}")
