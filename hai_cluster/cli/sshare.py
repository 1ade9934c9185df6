"""sshare, as Slurm names it: hshare (its columns are sshare's: Account, User, RawShares,
NormShares, RawUsage, EffectvUsage, FairShare)."""
from .hshare import main

__all__ = ["main"]
