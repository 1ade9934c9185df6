#!/bin/bash
#SBATCH --job-name=train-loop
#SBATCH --time=1:00:00
#SBATCH --output=train-loop-%j.out
#HAI --grace=30                  # seconds between the preempt signal and SIGKILL

# A job that checkpoints when it is preempted and resumes where it stopped (see README.md here).
# Submit it from the repository root, with hai-cluster's Python first on PATH:
#     hsubmit examples/train_loop.sh [STEPS [SECONDS_PER_STEP [CHECKPOINT_EVERY]]]
# (from elsewhere: HAI_EXAMPLES=/path/to/examples hsubmit /path/to/examples/train_loop.sh).
# Every run appends to $HAI_CHECKPOINT_DIR/steps.log; `hacct -j JOB` lists the runs.

echo "job $HAI_JOB_ID run $HAI_RESTART_COUNT on $(hostname): checkpoints in $HAI_CHECKPOINT_DIR"
# exec: Python gets the preempt signal directly. Without it the shell dies of the SIGTERM, and the
# agent still gives the rest of the job the grace period to save its checkpoint.
# A job of several tasks (-N 2, -n 4, ...) runs one copy per task through srun, as a data-parallel
# training does: every rank computes, rank 0 alone writes the checkpoint.
if [ "${SLURM_NTASKS:-1}" -gt 1 ]; then
    exec srun python3 "${HAI_EXAMPLES:-examples}/train_loop.py" "${1:-600}" "${2:-0.5}" "${3:-20}"
fi
exec python3 "${HAI_EXAMPLES:-examples}/train_loop.py" "${1:-600}" "${2:-0.5}" "${3:-20}"
