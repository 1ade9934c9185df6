#!/bin/bash
#SBATCH --job-name=hello
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --gpus-per-task=1
#SBATCH --time=5:00
#SBATCH --output=hello-%j.out

# As in Slurm: this script runs once, on the job's first node; srun starts the job's tasks
# (here 2 per node, one GPU each) and their output comes back here, one line per task.
echo "batch script on ${SLURMD_NODENAME}: job ${SLURM_JOB_ID}, nodes ${SLURM_JOB_NODELIST}, master ${MASTER_ADDR}"
srun -l bash -c 'echo "task ${SLURM_PROCID} of ${SLURM_NTASKS} on $(hostname) (node ${SLURMD_NODENAME}, local rank ${SLURM_LOCALID}), CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES}"'
sleep 2
echo "done"
