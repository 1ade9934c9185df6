"""What the controller does with an agent's health report (agent/health.py): drain or resume."""
from __future__ import annotations

import logging
from typing import Any

from ..store.nodehealth import apply_health
from .errors import StoreUnavailable

log = logging.getLogger(__name__)


async def on_health(ctl, node: str, body: Any) -> None:
    if not (isinstance(body, dict) and isinstance(body.get("ok"), bool) and isinstance(body.get("reason", ""), str)
            and isinstance(body.get("sticky", False), bool)):
        log.warning("node %s sent a malformed health report %r", node, body)
        return
    try:
        changed = await ctl.db(apply_health, ctl.repo.engine, node, body["ok"], body.get("reason", ""),
                               body.get("sticky", False))
    except StoreUnavailable:
        return  # the agent reports again at its next check
    if changed == "drained":
        log.warning("node %s drained: health: %s", node, body.get("reason"))
    elif changed == "resumed":
        log.warning("node %s healthy again: back in service", node)
        ctl.wake()
