"""Policies by name, for the controller's config and for hai-sim's --policy."""
from __future__ import annotations

from typing import Any, Callable

from .baselines import BackfillPolicy, SjfPolicy, TiresiasPolicy
from .fifo import FifoPolicy
from .limits import with_limits
from .mlfq import MlfqConfig, MlfqPolicy
from .plan import Policy

# name -> factory(**options) -> Policy. Baselines register here beside the MLFQ.
POLICIES: dict[str, Callable[..., Policy]] = {
    "fifo": lambda **_: FifoPolicy(),
    "sjf": lambda **_: SjfPolicy(),
    "tiresias": lambda **options: TiresiasPolicy(**options),
    "backfill": lambda **_: BackfillPolicy(),
    "mlfq": lambda config=None, **kw: MlfqPolicy(config or MlfqConfig(**kw)),
}


def make_policy(name: str, **options: Any) -> Policy:
    """The named policy, with the limits every policy obeys (job array task limits) around it."""
    try:
        factory = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r} (known: {', '.join(sorted(POLICIES))})") from None
    return with_limits(factory(**options))
