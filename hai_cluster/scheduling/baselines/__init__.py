"""Reference policies the MLFQ is measured against (FIFO lives in scheduling/fifo.py).

All of them are pure `decide(snapshot) -> Plan` functions behind the same Policy protocol as the
MLFQ, so hai-sim and the controller run them unchanged.
"""
from .backfill import BackfillPolicy
from .sjf import SjfPolicy
from .tiresias import TiresiasPolicy

__all__ = ["BackfillPolicy", "SjfPolicy", "TiresiasPolicy"]
