"""How the CLI writes telemetry values (hqueue, hacct, hinfo --gpus, hstat). Missing values
(no sample yet, not supported by the GPU) print as "-" or "" rather than as zero."""
from __future__ import annotations

from typing import Sequence

BARS = "▁▂▃▄▅▆▇█"


def pct(v, digits: int = 0) -> str:
    return "-" if v is None else f"{v:.{digits}f}%"


def used_of_share(used_mb, share_mb) -> str:
    """GPU memory in use, against a sharing job's share of its card: 4.1G/20.0G (else as mib)."""
    return f"{mib(used_mb)}/{mib(share_mb)}" if share_mb else mib(used_mb)


def mib(v) -> str:
    """MiB as sacct writes memory: 512M, 4.0G, 1.2T."""
    if v is None:
        return "-"
    if v >= 1024 * 1024:
        return f"{v / 1024 / 1024:.1f}T"
    if v >= 1024:
        return f"{v / 1024:.1f}G"
    return f"{int(v)}M"


def energy(joules) -> str:
    """Joules as sacct's ConsumedEnergy: 950, 12.3K, 4.5M."""
    if joules is None:
        return ""
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "K")):
        if joules >= div:
            return f"{joules / div:.1f}{suffix}"
    return f"{joules:.0f}"


def num(v, unit: str = "", digits: int = 0) -> str:
    return "-" if v is None else f"{v:.{digits}f}{unit}"


def sparkline(values: Sequence[float | None], width: int = 60, top: float = 100.0) -> str:
    """A one-line chart of the last `width` values on a 0..top scale ("·" where there is none)."""
    out = []
    for v in list(values)[-width:]:
        if v is None:
            out.append("·")
        else:
            out.append(BARS[min(len(BARS) - 1, max(0, int(v / top * (len(BARS) - 1) + 0.5)))])
    return "".join(out)
