#!/usr/bin/env bash
# Launch training with torchrun: one process per visible GPU, or NPROC processes (default 1) without GPUs.
#   bash launch_train.sh                                  # the built-in demo
#   bash launch_train.sh options/vrt/001_train_vrt_videosr_bi_reds_6frames.json [--set KEY=VALUE ...]
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=node0 MASTER_PORT=29500 bash launch_train.sh OPT   # on each node
# torchrun's own flags (e.g. --max-restarts=3) may come before or after the option file; the rest goes to
# main_train_vrt.py (e.g. --set train.total_iter=10).
set -euo pipefail
cd "$(dirname "$0")"

TORCHRUN_ARGS=()
while [[ $# -gt 0 && "$1" == --* && "$1" != --set ]]; do TORCHRUN_ARGS+=("$1"); shift; done
OPT="${1:-options/vrt/000_train_vrt_demo.json}"
[[ $# -gt 0 ]] && shift
MAIN_ARGS=()
for arg in "$@"; do  # torchrun's own flags may also follow the option file
  case "$arg" in
    --max-restarts*|--max_restarts*|--monitor-interval*|--monitor_interval*|--rdzv*|--redirects*|--tee*|--log-dir*|--log_dir*)
      TORCHRUN_ARGS+=("$arg") ;;
    *) MAIN_ARGS+=("$arg") ;;
  esac
done

if [[ -z "${NPROC:-}" ]]; then
  NPROC=$(python -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 1)")
fi
NNODES="${NNODES:-1}"
if [[ "$NNODES" -gt 1 ]]; then
  RDZV=(--nnodes="$NNODES" --node_rank="${NODE_RANK:?set NODE_RANK on every node}"
        --master_addr="${MASTER_ADDR:?set MASTER_ADDR}" --master_port="${MASTER_PORT:-29500}")
else
  RDZV=(--standalone)
fi
exec python -m torch.distributed.run "${RDZV[@]}" --nproc_per_node="$NPROC" "${TORCHRUN_ARGS[@]}" \
  main_train_vrt.py --opt "$OPT" "${MAIN_ARGS[@]}"
