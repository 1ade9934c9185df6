"""Job scripts as GPU labs write them for Slurm (torchtitan's torchrun, Hugging Face accelerate's
multi-node example, Lightning's SLURMEnvironment, DeepSpeed through env:// init, JAX's Slurm
auto-detection), run unchanged on two nodes behind sshd in network namespaces. The frameworks
are not installed here: tests/e2e/lab has stand-ins that read exactly the variables the real
ones read and meet over real TCP between the nodes, so a wrong rank, world size, head node or
port fails the meeting (lab/rdzv.py)."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from .harness import TEST_USER, start_ssh_cluster, user_dir

LAB = Path(__file__).parent / "lab"
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def cluster(ssh_nodes):
    c = start_ssh_cluster(ssh_nodes, gpus_per_node=2)
    yield c
    c.close()


@pytest.fixture(scope="module")
def lab(cluster, ssh_nodes):
    """The stand-ins, where the job's user reads them, and the nodes' addresses for them."""
    d = user_dir(cluster.workdir, TEST_USER) / "lab"
    shutil.copytree(LAB, d, dirs_exist_ok=True)
    hosts = ",".join(f"{n.name}={n.address}" for n in ssh_nodes)
    return {"LAB": str(d), "LAB_HOSTS": hosts}, sorted(n.name for n in ssh_nodes)


def run(cluster, lab, name: str, body: str) -> list[str]:
    env, _ = lab
    d = user_dir(cluster.workdir, TEST_USER)
    (d / name).write_text(body)
    out = d / f"{name}.out"
    job_id = cluster.submit("-o", str(out), str(d / name), env=env)
    job = cluster.wait_state(job_id, "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", timeout=120)
    text = out.read_text() if out.exists() else ""
    assert job["state"] == "COMPLETED", (job, text)
    return text.splitlines()


def met(lines: list[str], framework: str) -> list[tuple[int, int, int, int, str]]:
    """(rank, world, local rank, node rank, master) of each process that met all the others."""
    got = []
    for line in lines:
        m = re.fullmatch(rf"{framework} rank=(\d+)/(\d+) local=(\d+) node=(\d+) master=(\S+) met=all", line)
        if m:
            got.append((*map(int, m.groups()[:4]), m.group(5)))
    return sorted(got)


def test_torchrun_one_launcher_per_node_with_a_c10d_endpoint_on_the_head_node(cluster, lab):
    head = lab[1][0]
    lines = run(cluster, lab, "torchtitan.sh", """#!/bin/bash
#SBATCH --job-name=llama3-8b
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=2
#SBATCH --cpus-per-task=2
#SBATCH --time=00:10:00
export PATH=$LAB/bin:$PATH
nodes=( $( scontrol show hostnames $SLURM_JOB_NODELIST ) )
nodes_array=($nodes)
head_node=${nodes_array[0]}
echo Node: $head_node
export LOGLEVEL=INFO
srun torchrun --nnodes 2 --nproc_per_node 2 --rdzv_id $RANDOM --rdzv_backend c10d \\
    --rdzv_endpoint "$head_node:29500" $LAB/train.py torchrun
""")
    assert lines[0] == f"Node: {head}"
    assert met(lines, "torchrun") == [(r, 4, r % 2, r // 2, f"{head}:29500") for r in range(4)], lines


def test_accelerate_launch_with_the_machine_rank_from_slurm_procid(cluster, lab):
    head = lab[1][0]
    lines = run(cluster, lab, "accelerate.sh", """#!/bin/bash
#SBATCH --job-name=multinode
#SBATCH -D .
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=2
#SBATCH --gres=gpu:2
export PATH=$LAB/bin:$PATH
export GPUS_PER_NODE=2
head_node_ip=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n 1)
export LAUNCHER="accelerate launch \\
    --num_processes $((SLURM_NNODES * GPUS_PER_NODE)) \\
    --num_machines $SLURM_NNODES \\
    --rdzv_backend c10d \\
    --main_process_ip $head_node_ip \\
    --main_process_port 29500 \\
    "
export SCRIPT="$LAB/train.py"
export SCRIPT_ARGS="accelerate"
export CMD="$LAUNCHER --machine_rank \\$SLURM_PROCID $SCRIPT $SCRIPT_ARGS"
srun bash -c "$CMD"
""")
    assert met(lines, "accelerate") == [(r, 4, r % 2, r // 2, f"{head}:29500") for r in range(4)], lines


def test_lightning_finds_its_ranks_and_master_in_each_task(cluster, lab):
    head = lab[1][0]
    lines = run(cluster, lab, "lightning.sh", """#!/bin/bash
#SBATCH --nodes=2
#SBATCH --gres=gpu:2
#SBATCH --ntasks-per-node=2
#SBATCH --time=0-00:10:00
#SBATCH --signal=SIGUSR1@90
srun python3 $LAB/lightning_env.py 2
""")
    got = met(lines, "lightning")  # the port: the step's MASTER_PORT, the same in every task
    assert [g[:4] for g in got] == [(r, 4, r % 2, r // 2) for r in range(4)], lines
    assert len({g[4] for g in got}) == 1 and got[0][4].split(":")[0] == head, lines


def test_deepspeed_env_init_from_slurm_variables_keeps_the_exported_master_port(cluster, lab):
    head = lab[1][0]
    lines = run(cluster, lab, "deepspeed.sh", """#!/bin/bash
#SBATCH -N 2 --ntasks-per-node=2 --gpus-per-task=1 --cpus-per-task=1
export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export MASTER_PORT=29600
srun bash -c 'RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID WORLD_SIZE=$SLURM_NTASKS \\
    python3 $LAB/train.py deepspeed --deepspeed --deepspeed_config ds_config.json'
""")
    assert met(lines, "deepspeed") == [(r, 4, r % 2, r // 2, f"{head}:29600") for r in range(4)], lines


def test_jax_distributed_auto_detects_the_coordinator_of_the_step(cluster, lab):
    head = lab[1][0]
    lines = run(cluster, lab, "jax.sh", """#!/bin/bash
#SBATCH -N 2 --ntasks-per-node=1 --gpus-per-node=2
srun python3 $LAB/jax_env.py
""")
    got = met(lines, "jax")
    assert [g[:4] for g in got] == [(0, 2, 0, 0), (1, 2, 0, 1)] and {g[4].split(":")[0] for g in got} == {head}, lines
