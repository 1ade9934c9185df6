"""Pure scheduling policy: decide(snapshot) -> Plan. No I/O, no clock."""
from .fifo import decide

__all__ = ["decide"]
