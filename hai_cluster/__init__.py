"""hai-cluster: a Slurm-style batch cluster manager for GPU training with MLFQ time-slicing."""
__version__ = "0.1.0"
