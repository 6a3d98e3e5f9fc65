#!/usr/bin/env bash
# SLURM: one task per GPU, ranks from SLURM's variables (no torchrun needed); survives preemption by requeueing.
#   sbatch scripts/slurm_train.sh options/vrt/001_train_vrt_videosr_bi_reds_6frames.json [--set KEY=VALUE ...]
#   sbatch --nodes=4 scripts/slurm_train.sh OPT         # 4 nodes x 8 GPUs; the same command continues any run
# Time limit: --signal=B:USR1@300 warns this script 300 s before the end; it forwards SIGUSR1 to the tasks (srun
# passes signals on), every task stops at the next step boundary, rank 0 saves that step, the tasks exit 0 and the
# script requeues the job (scontrol requeue, allowed by --requeue). The requeued job (same job id) runs this script
# again and resumes from the newest complete checkpoint. Preemption by another job (SIGTERM to every process, SIGKILL
# after KillWait) saves the same way, and SLURM requeues such a job itself. See docs/clusters.md.
#SBATCH --job-name=vrt
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-task=1
#SBATCH --cpus-per-task=4
#SBATCH --time=72:00:00
#SBATCH --signal=B:USR1@300
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=slurm-%j.out
set -euo pipefail
cd "${SLURM_SUBMIT_DIR:-$(dirname "$0")/..}"
OPT="${1:-options/vrt/001_train_vrt_videosr_bi_reds_6frames.json}"
shift || true
# utils/utils_dist.py reads SLURM_PROCID / SLURM_LOCALID / SLURM_NTASKS and takes the first host of
# SLURM_JOB_NODELIST as MASTER_ADDR; a port derived from the job id keeps jobs sharing a node apart.
export MASTER_PORT="${MASTER_PORT:-$((20000 + ${SLURM_JOB_ID:-0} % 20000))}"
echo "job ${SLURM_JOB_ID:-?} (restart ${SLURM_RESTART_COUNT:-0}): ${SLURM_NTASKS:-?} task(s) on ${SLURM_JOB_NODELIST:-?}"

PREEMPTED=""
SRUN_PID=""
forward() {  # forward(SIGNAL): pass a signal to the tasks through srun
  if [[ -n "$SRUN_PID" ]]; then kill -"$1" "$SRUN_PID" 2>/dev/null || true; fi
}
trap 'PREEMPTED=1; forward USR1' USR1
trap 'forward TERM' TERM
srun --kill-on-bad-exit=1 python main_train_vrt.py --opt "$OPT" "$@" &
SRUN_PID=$!
if [[ -n "$PREEMPTED" ]]; then forward USR1; fi  # the warning came while srun was starting
STATUS=""
while [[ -z "$STATUS" ]]; do
  if wait "$SRUN_PID"; then
    STATUS=0
  else
    CODE=$?
    # a trapped signal ends `wait` early (code > 128) while the tasks are still saving: wait for them
    if [[ $CODE -gt 128 ]] && kill -0 "$SRUN_PID" 2>/dev/null; then continue; fi
    STATUS=$CODE
  fi
done
if [[ -n "$PREEMPTED" ]]; then
  echo "time limit near: checkpoint saved (srun exit $STATUS); requeueing job $SLURM_JOB_ID"
  scontrol requeue "$SLURM_JOB_ID"
  exit 0
fi
exit "$STATUS"
