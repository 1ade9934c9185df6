"""Errors the controller's parts share (one module, so that none imports the service for them)."""
from __future__ import annotations

from ..transport.rpc import RequestError


class StoreUnavailable(RequestError):
    """The database cannot be reached: the request changed nothing and may be retried."""
