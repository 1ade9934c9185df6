"""A stand-in for what torch.distributed, JAX and DeepSpeed do first: every process of the job
meets at one address (rank 0 listens) and learns the others' ranks, over real TCP between the
nodes. Nothing here is hai-cluster's: the lab scripts' launchers (torchrun, accelerate) and
training programs below call it with what they read from the environment, as the real ones do.

Names resolve through the system; the test cluster's nodes are not in DNS, so LAB_HOSTS
(name=address,...) stands in for it."""
import os
import socket
import sys
import time


def resolve(host: str) -> str:
    table = dict(kv.split("=", 1) for kv in os.environ.get("LAB_HOSTS", "").split(",") if "=" in kv)
    return table.get(host, host)


def meet(host: str, port: int, rank: int, world: int, timeout: float = 60) -> list[int]:
    """All ranks, as rank 0 saw them arrive; raises if the world does not gather in time."""
    addr = resolve(host)
    if rank == 0:
        srv = socket.create_server(("", port), reuse_port=True)
        srv.settimeout(timeout)
        peers, seen = [], [0]
        while len(seen) < world:
            conn, _ = srv.accept()
            seen.append(int(conn.makefile().readline()))
            peers.append(conn)
        reply = (",".join(map(str, sorted(seen))) + "\n").encode()
        for conn in peers:
            conn.sendall(reply)
            conn.close()
        srv.close()
        return sorted(seen)
    deadline = time.monotonic() + timeout
    while True:
        try:
            conn = socket.create_connection((addr, port), timeout=5)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    conn.sendall(f"{rank}\n".encode())
    got = conn.makefile().readline().strip()
    conn.close()
    return [int(r) for r in got.split(",")]


def report(framework: str, rank: int, world: int, local: int, node: int, host: str, port: int) -> None:
    ranks = meet(host, port, rank, world)
    ok = ranks == list(range(world))
    print(f"{framework} rank={rank}/{world} local={local} node={node} master={host}:{port} "
          f"met={'all' if ok else ranks}", flush=True)
    sys.exit(0 if ok else 1)
