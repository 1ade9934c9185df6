"""PyTorch Lightning (lightning_fabric from PyPI, unmodified) inside a 2-node job on real daemons:
its SLURMEnvironment finds each srun task's ranks in our SLURM_* variables, and a 2-process DDP
training on CPU (gloo) chosen by Fabric itself completes with the gradients averaged
(tests/e2e/lab/lightning_env.py imitates the same checks where torch is not installed).
scripts/test installs torch's CPU build and lightning-fabric (scripts/lib/setup.sh:
ensure_ml_clients); without them this skips."""
from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .harness import TEST_USER, start_ssh_cluster, user_dir

if not (importlib.util.find_spec("torch") and importlib.util.find_spec("lightning_fabric")):  # not imported here
    pytest.skip("torch and lightning-fabric are not installed (scripts/test installs them; HAI_TEST_ML=0 does not)",
                allow_module_level=True)
DRIVER = Path(__file__).with_name("clients") / "lightning_driver.py"
# Two tasks per node for the ranks; one per node for the training (srun's own --ntasks-per-node
# reaches the tasks, as Slurm's srun exports it: Lightning checks it against `devices`; -K: a failed
# rank ends the step instead of leaving the others waiting for it). The test nodes' host names
# resolve nowhere: gloo is told the interface, as on a cluster without DNS.
SCRIPT = """#!/bin/bash
#SBATCH -J lightning -N 2 --ntasks-per-node=2 -t 3:00
export GLOO_SOCKET_IFNAME=eth0
srun python lightning_driver.py ranks
srun -K -n 2 --ntasks-per-node=1 python lightning_driver.py fit
"""


@pytest.fixture(scope="module")
def cluster(ssh_nodes):
    c = start_ssh_cluster(ssh_nodes[:2], gpus_per_node=0)
    yield c
    c.close()


def lines(text: str, mode: str) -> list[dict]:
    return [json.loads(line.split(" ", 1)[1]) for line in text.splitlines() if line.startswith(mode + " ")]


def test_lightning_finds_the_ranks_and_trains_with_ddp(cluster, ssh_nodes):
    home = user_dir(cluster.workdir, TEST_USER)
    shutil.copy(DRIVER, home / "lightning_driver.py")
    (home / "lightning.sh").write_text(SCRIPT)
    job = int(cluster.cli("sbatch", "--parsable", "-o", "lightning.out", "lightning.sh").stdout)
    state = cluster.wait_state(job, "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", timeout=240)["state"]
    out = (home / "lightning.out").read_text()
    assert state == "COMPLETED", out
    nodes = cluster.job(job)["nodelist"].split(",")
    address = {n.name: n.address for n in ssh_nodes}
    ranks = sorted(lines(out, "ranks"), key=lambda r: r["global_rank"])
    # (global, local, node rank) as Lightning computes them; the task runs where its node rank says
    assert [(r["global_rank"], r["local_rank"], r["node_rank"], r["node"]) for r in ranks] == [
        (0, 0, 0, nodes[0]), (1, 1, 0, nodes[0]), (2, 0, 1, nodes[1]), (3, 1, 1, nodes[1])]
    assert {(r["detect"], r["world_size"], r["job_id"]) for r in ranks} == {(True, 4, job)}
    # every rank's main address and port: the step's first node, a port of the step's own
    assert {(r["main_address"], r["main_port"]) for r in ranks} == {(address[nodes[0]], ranks[0]["main_port"])}
    fits = sorted(lines(out, "fit"), key=lambda r: r["rank"])
    assert [(f["rank"], f["node_rank"], f["world_size"]) for f in fits] == [(0, 0, 2), (1, 1, 2)]
    assert {(f["environment"], f["backend"]) for f in fits} == {("SLURMEnvironment", "gloo")}
    expected = json.loads(subprocess.run([sys.executable, str(DRIVER), "expect"], capture_output=True, text=True,
                                         check=True, timeout=120).stdout.split(" ", 1)[1])["weights"]
    for f in fits:  # the same weights on both ranks, those of training on both ranks' batches
        assert f["weights"] == pytest.approx(expected, abs=1e-8)
