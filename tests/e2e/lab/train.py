"""The training program of the torchrun, accelerate and DeepSpeed scripts: it reads what
torch.distributed's env:// init reads (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rdzv import report  # noqa: E402

e = os.environ
report(sys.argv[1] if len(sys.argv) > 1 else "torch", int(e["RANK"]), int(e["WORLD_SIZE"]), int(e["LOCAL_RANK"]),
       int(e.get("GROUP_RANK", e.get("SLURM_NODEID", "0"))), e["MASTER_ADDR"], int(e["MASTER_PORT"]))
