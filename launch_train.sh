#!/usr/bin/env bash
# Launch training: one process per visible GPU (NPROC processes without GPUs, default 1).
#   bash launch_train.sh                                     # the built-in demo
#   bash launch_train.sh --set train.total_iter=10           # the demo with overrides
#   bash launch_train.sh options/vrt/001_train_vrt_videosr_bi_reds_6frames.json [--set KEY=VALUE ...]
#   bash launch_train.sh --max-restarts=3 OPT                # elastic: a lost worker restarts the group
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=node0 MASTER_PORT=29500 bash launch_train.sh OPT   # on each node
# One process on one node without torchrun flags runs main_train_vrt.py directly; anything else runs torchrun
# through utils/utils_launch.py, which turns SIGTERM, SIGUSR1 and Ctrl-C into a checkpoint and exit 0.
set -euo pipefail
cd "$(dirname "$0")"

OPT=""
TORCHRUN_ARGS=()
MAIN_ARGS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --max-restarts|--max_restarts|--monitor-interval|--monitor_interval|--rdzv-backend|--rdzv_backend|\
    --rdzv-endpoint|--rdzv_endpoint|--rdzv-id|--rdzv_id|--rdzv-conf|--rdzv_conf|--redirects|--tee|--log-dir|\
    --log_dir|--shutdown-timeout|--shutdown_timeout)
      TORCHRUN_ARGS+=("$1=${2:?$1 needs a value}"); shift ;;
    --max-restarts=*|--max_restarts=*|--monitor-interval=*|--monitor_interval=*|--rdzv*=*|--redirects=*|--tee=*|\
    --log-dir=*|--log_dir=*|--shutdown-timeout=*|--shutdown_timeout=*)
      TORCHRUN_ARGS+=("$1") ;;
    --opt) OPT="${2:?--opt needs a file}"; shift ;;
    --opt=*) OPT="${1#--opt=}" ;;
    -*) MAIN_ARGS+=("$1") ;;
    *) if [[ -z "$OPT" && ${#MAIN_ARGS[@]} -eq 0 ]]; then OPT="$1"; else MAIN_ARGS+=("$1"); fi ;;
  esac
  shift
done
OPT="${OPT:-options/vrt/000_train_vrt_demo.json}"

if [[ -z "${NPROC:-}" ]]; then
  NPROC=$(python -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 1)")
fi
NNODES="${NNODES:-1}"
if [[ "$NPROC" -eq 1 && "$NNODES" == "1" && ${#TORCHRUN_ARGS[@]} -eq 0 ]]; then
  exec python main_train_vrt.py --opt "$OPT" ${MAIN_ARGS[@]+"${MAIN_ARGS[@]}"}
fi
if [[ "$NNODES" != "1" ]]; then
  RDZV=(--nnodes="$NNODES" --node_rank="${NODE_RANK:?set NODE_RANK on every node}"
        --master_addr="${MASTER_ADDR:?set MASTER_ADDR}" --master_port="${MASTER_PORT:-29500}")
else
  RDZV=(--standalone)
fi
exec python -m utils.utils_launch "${RDZV[@]}" --nproc_per_node="$NPROC" ${TORCHRUN_ARGS[@]+"${TORCHRUN_ARGS[@]}"} \
  main_train_vrt.py --opt "$OPT" ${MAIN_ARGS[@]+"${MAIN_ARGS[@]}"}
