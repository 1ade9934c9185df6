#!/bin/bash
#SBATCH --job-name=hello
#SBATCH --nodes=2
#SBATCH --gpus-per-node=2
#SBATCH --time=5:00
#HAI --output=hello-%j-%N.out

# Runs once per node, each with its own rank and GPUs.
echo "rank ${HAI_NODE_RANK} of ${HAI_NNODES} on $(hostname) (node ${SLURMD_NODENAME})"
echo "job ${HAI_JOB_ID} nodes ${HAI_NODELIST} master ${MASTER_ADDR}:${MASTER_PORT}"
echo "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES}"
sleep 2
echo "done"
