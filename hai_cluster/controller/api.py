"""The controller's client API: what hsubmit, hqueue, hcancel, hinfo, hacct and hcontrol call.

The caller's identity is the uid the kernel reports for the socket peer (SO_PEERCRED); nothing
the client sends can change it. Bad input is answered with a specific error and changes nothing.
The handlers are module functions of (context, body, caller): submission in api_submit.py, what
users read in api_jobs.py (sprio's factors in api_priority.py), what they change in
api_control.py, nodes joining in membership.py; what they share in apicontext.py, the checks of a
body's fields in requests.py.
"""
from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from ..transport.rpc import RpcTable
from . import (api_control, api_jobs, api_listing_text, api_priority, api_reservations, api_sacct_text, api_submit,
               client_steps, follow, membership, step_watch)
from .apicontext import ApiContext

if TYPE_CHECKING:
    from .service import Controller


def _merged(base: dict, more: dict) -> dict:
    """Method tables joined; a name in both is an error (one would silently replace the other)."""
    if clash := set(base) & set(more):
        raise RuntimeError(f"API method(s) defined twice: {', '.join(sorted(clash))}")
    return {**base, **more}


# method -> handler(context, body, caller)
HANDLERS = _merged({
    "ping": api_jobs.ping, "jobs": api_jobs.jobs, "show_job": api_jobs.show_job, "telemetry": api_jobs.telemetry,
    "nodes": api_jobs.nodes, "acct": api_jobs.acct, "steps": api_jobs.steps, "events": api_jobs.events,
    "accounts": api_jobs.accounts, "shares": api_jobs.shares, "qos": api_jobs.qos,
    "scheduler": api_jobs.scheduler,
    "squeue_text": api_listing_text.squeue_text,  # the compiled squeue's (native/squeue.c)
    "sacct_text": api_sacct_text.sacct_text,  # the compiled sacct's (native/sacct.c)
    "priorities": api_priority.priorities,
    "submit": api_submit.submit,
    "cancel": api_control.cancel, "requeue": api_control.requeue, "preempt": api_control.preempt,
    "hold": api_control.hold, "release": api_control.release, "requeuehold": api_control.requeuehold,
    "update_job": api_control.update_job, "update_node": api_control.update_node,
    "update_limits": api_control.update_limits,
    "create_reservation": api_reservations.create_reservation,
    "update_reservation": api_reservations.update_reservation,
    "delete_reservation": api_reservations.delete_reservation, "reservations": api_reservations.reservations,
}, _merged(_merged(client_steps.HANDLERS, step_watch.HANDLERS), follow.HANDLERS))  # salloc and srun outside a job: allocations and their steps; sattach


def build_api(ctl: Controller) -> RpcTable:
    api = RpcTable()
    ctx = ApiContext(ctl)
    ctl.client_steps.api = ctx
    for method, handler in HANDLERS.items():
        api.add(method, partial(handler, ctx))
    membership.expose(api, ctl)  # node_add, node_remove
    return api
