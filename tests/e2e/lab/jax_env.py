"""What jax.distributed.initialize() reads under Slurm (jax._src.clusters.slurm_cluster): the
coordinator is the first node of SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST, SLURM_NODELIST),
its port derived from SLURM_JOB_ID; process count SLURM_NTASKS, process id SLURM_PROCID, local
id SLURM_LOCALID."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rdzv import report  # noqa: E402

e = os.environ
nodes = next(e[k] for k in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST") if k in e)
# jax's own parse: the name up to the first '[' or ',', with a bracket's first number
ind = next((i for i, ch in enumerate(nodes) if ch in "[,"), len(nodes))
if ind == len(nodes) or nodes[ind] == ",":
    first = nodes[:ind]
else:
    rest = nodes[ind + 1:]
    first = nodes[:ind] + rest[:next(i for i, ch in enumerate(rest) if ch in ",-]")]
port = int(e["SLURM_JOB_ID"]) % 2**12 + (65535 - 2**12 + 1)
report("jax", int(e["SLURM_PROCID"]), int(e["SLURM_NTASKS"]), int(e["SLURM_LOCALID"]), int(e["SLURM_NODEID"]),
       first, port)
