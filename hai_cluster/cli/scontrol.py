"""scontrol, as Slurm names it: hcontrol's commands and formats under that name (show
hostnames|hostlist, show job|node, requeue, hold, release, ...); its messages say `scontrol`."""
from .hcontrol import main

__all__ = ["main"]
