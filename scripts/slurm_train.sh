#!/usr/bin/env bash
# SLURM example: one task per GPU, ranks from SLURM's variables (no torchrun needed).
#   sbatch scripts/slurm_train.sh options/vrt/001_train_vrt_videosr_bi_reds_6frames.json
# On preemption SLURM sends SIGTERM (or the --signal below sends SIGUSR1 first): every rank stops at the next step
# boundary, rank 0 saves a checkpoint of that step, and `sbatch` of the same script continues from it.
#SBATCH --job-name=vrt
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=4
#SBATCH --time=72:00:00
#SBATCH --signal=USR1@300
#SBATCH --requeue
#SBATCH --output=slurm-%j.out
set -euo pipefail
cd "${SLURM_SUBMIT_DIR:-$(dirname "$0")/..}"
OPT="${1:-options/vrt/001_train_vrt_videosr_bi_reds_6frames.json}"
shift || true
# utils/utils_dist.py reads SLURM_PROCID / SLURM_LOCALID / SLURM_NTASKS and takes the first host of
# SLURM_JOB_NODELIST as MASTER_ADDR; export MASTER_PORT to avoid clashes between jobs on one node.
export MASTER_PORT="${MASTER_PORT:-$((20000 + ${SLURM_JOB_ID:-0} % 20000))}"
srun --kill-on-bad-exit=1 python main_train_vrt.py --opt "$OPT" "$@"
