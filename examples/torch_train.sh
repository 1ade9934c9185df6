#!/bin/bash
#SBATCH --job-name=torch-train
#SBATCH --gpus-per-node=1        # the example trains on CPU; a GPU only shows the allocation
#SBATCH --time=1:00:00
#SBATCH --output=torch-train-%j.out
#HAI --grace=60                  # seconds between the preempt signal and SIGKILL

# A PyTorch job that checkpoints (model + optimizer + step, via torch.save through
# hai_cluster.job.atomic_write) when it is preempted and resumes exactly (see README.md here).
# Submit it from the repository root, with a Python that has torch and hai-cluster first on PATH:
#     hsubmit examples/torch_train.sh [STEPS [SECONDS_PER_STEP [CHECKPOINT_EVERY]]]
# (from elsewhere: HAI_EXAMPLES=/path/to/examples hsubmit /path/to/examples/torch_train.sh).

echo "job $HAI_JOB_ID run $HAI_RESTART_COUNT on $(hostname) GPUs ${CUDA_VISIBLE_DEVICES:-none}"
exec python3 "${HAI_EXAMPLES:-examples}/torch_train.py" "${1:-3000}" "${2:-0.2}" "${3:-100}"
