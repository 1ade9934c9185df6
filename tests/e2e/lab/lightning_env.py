"""What Lightning's SLURMEnvironment reads in each task (lightning.fabric.plugins.environments.
slurm): it is on when SLURM_NTASKS is set and the job is not named bash/interactive, and refuses
more than one task without SLURM_NTASKS_PER_NODE; world size SLURM_NTASKS, global rank
SLURM_PROCID, local rank SLURM_LOCALID, node rank SLURM_NODEID; the main address is the first
host of SLURM_NODELIST, the port MASTER_PORT if set, else 15000 + the job id's last 4 digits.
The Trainer then wants SLURM_NTASKS_PER_NODE to equal its devices (argv[1])."""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rdzv import report  # noqa: E402


def first_host(nodes: str) -> str:  # SLURMEnvironment.resolve_root_node_address
    nodes = re.sub(r"\[(.*?)[,-].*\]", "\\1", nodes)
    nodes = re.sub(r"\[(.*?)\]", "\\1", nodes)
    return nodes.split(" ")[0].split(",")[0]


e = os.environ
assert "SLURM_NTASKS" in e and e.get("SLURM_JOB_NAME") not in ("bash", "interactive"), "not a SLURM job to Lightning"
if int(e.get("SLURM_NTASKS", "1")) > 1 and "SLURM_NTASKS_PER_NODE" not in e:
    raise RuntimeError("You set `--ntasks` in your SLURM bash script, but this variable is not supported.")
devices = int(sys.argv[1])
assert int(e["SLURM_NTASKS_PER_NODE"]) == devices, f"SLURM_NTASKS_PER_NODE={e['SLURM_NTASKS_PER_NODE']} vs devices"
port = int(e["MASTER_PORT"]) if "MASTER_PORT" in e else int(e["SLURM_JOB_ID"][-4:]) + 15000
report("lightning", int(e["SLURM_PROCID"]), int(e["SLURM_NTASKS"]), int(e["SLURM_LOCALID"]), int(e["SLURM_NODEID"]),
       first_host(e["SLURM_NODELIST"]), port)
