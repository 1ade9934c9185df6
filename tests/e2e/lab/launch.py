"""Stand-ins for `torchrun` and `accelerate launch` (installed as lab/bin/torchrun and
lab/bin/accelerate): the options labs pass them from Slurm's variables, and what they do with
them: NPROC workers per node, each with RANK, LOCAL_RANK, WORLD_SIZE, GROUP_RANK, MASTER_ADDR and
MASTER_PORT set as the real launchers set them (the node's rank as given, or for torchrun's c10d
rendezvous without one, $SLURM_NODEID, where the real one would hand ranks out in arrival order)."""
import argparse
import os
import subprocess
import sys


def main() -> int:
    prog, argv = sys.argv[1], sys.argv[2:]  # bin/torchrun or bin/accelerate named it
    if prog == "accelerate":
        assert argv and argv[0] == "launch", "accelerate: only `accelerate launch` is stood in for"
        argv = argv[1:]
    p = argparse.ArgumentParser(prog=prog)
    for names in (("--nnodes", "--num_machines", "--num-machines"), ("--nproc_per_node", "--nproc-per-node"),
                  ("--num_processes", "--num-processes"), ("--node_rank", "--node-rank", "--machine_rank",
                                                           "--machine-rank"),
                  ("--rdzv_endpoint", "--rdzv-endpoint"), ("--master_addr", "--master-addr", "--main_process_ip",
                                                           "--main-process-ip"),
                  ("--master_port", "--master-port", "--main_process_port", "--main-process-port"),
                  ("--rdzv_id", "--rdzv-id"), ("--rdzv_backend", "--rdzv-backend")):
        p.add_argument(*names, dest=names[0].lstrip("-").replace("-", "_"))
    p.add_argument("script")
    p.add_argument("args", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    nnodes = int(a.nnodes or 1)
    nproc = int(a.nproc_per_node) if a.nproc_per_node else int(a.num_processes) // nnodes
    node = int(a.node_rank) if a.node_rank is not None else int(os.environ.get("SLURM_NODEID", "0"))
    if a.rdzv_endpoint:
        host, _, port = a.rdzv_endpoint.rpartition(":")
    else:
        host, port = a.master_addr or "127.0.0.1", a.master_port or "29500"
    procs = []
    for local in range(nproc):
        env = {**os.environ, "RANK": str(node * nproc + local), "LOCAL_RANK": str(local),
               "WORLD_SIZE": str(nnodes * nproc), "LOCAL_WORLD_SIZE": str(nproc), "GROUP_RANK": str(node),
               "MASTER_ADDR": host, "MASTER_PORT": port}
        procs.append(subprocess.Popen([sys.executable, a.script, *a.args], env=env))
    return max(p.wait() for p in procs)


if __name__ == "__main__":
    sys.exit(main())
