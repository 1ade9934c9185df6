"""Policies by name, for the controller's config and for hai-sim's --policy."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from .baselines import BackfillPolicy, SjfPolicy, TiresiasPolicy
from .fifo import FifoPolicy
from .limits import with_limits
from .mlfq import MlfqConfig, MlfqPolicy
from .plan import Policy



@dataclass(frozen=True)
class PolicyEntry:
    factory: Callable[..., Policy]  # factory(**options) -> Policy
    controller: bool = False  # the controller may run it ([scheduler] policy); else hai-sim only
    places_shares: bool = False  # it places card shares (fractional GPUs; hai-sim --gpu-sharing)


# Every policy, by name: the MLFQ and the baselines it is measured against. Adding one is a row
# here and its module.
POLICIES: dict[str, PolicyEntry] = {
    "fifo": PolicyEntry(lambda **_: FifoPolicy(), controller=True, places_shares=True),
    "sjf": PolicyEntry(lambda **_: SjfPolicy()),
    "tiresias": PolicyEntry(lambda **options: TiresiasPolicy(**options)),
    "backfill": PolicyEntry(lambda **_: BackfillPolicy()),
    "mlfq": PolicyEntry(lambda config=None, **kw: MlfqPolicy(config or MlfqConfig(**kw)),
                        controller=True, places_shares=True),
}
CONTROLLER_POLICIES = tuple(name for name, e in POLICIES.items() if e.controller)
SHARING_POLICIES = tuple(name for name, e in POLICIES.items() if e.places_shares)


def make_policy(name: str, **options: Any) -> Policy:
    """The named policy, with the limits every policy obeys (job array task limits) around it."""
    try:
        factory = POLICIES[name].factory
    except KeyError:
        raise ValueError(f"unknown policy {name!r} (known: {', '.join(sorted(POLICIES))})") from None
    return with_limits(factory(**options))
