"""sbatch, as Slurm names it: hsubmit under that name (its messages say sbatch; installs put the C
hsubmit here too, hai_cluster/native/build.py). The options, SBATCH_* variables and directives
are read by the controller (core/jobscript.py), the same for both names."""
from .hsubmit import main

__all__ = ["main"]
