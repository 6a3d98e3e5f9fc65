#!/usr/bin/env bash
# Launch training: one process per visible GPU (NPROC processes without GPUs, default 1).
#   bash launch_train.sh                                     # the built-in demo
#   bash launch_train.sh --set train.total_iter=10           # the demo with overrides
#   bash launch_train.sh options/vrt/001_train_vrt_videosr_bi_reds_6frames.json [--set KEY=VALUE ...]
#   bash launch_train.sh --max-restarts=3 OPT                # elastic: a lost worker restarts the group
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=node0 MASTER_PORT=29500 bash launch_train.sh OPT   # on each node
#   bash launch_train.sh --nnodes=1:4 --rdzv-backend=c10d --rdzv-endpoint=node0:29400 --max-restarts=10 OPT
#                                                            # elastic membership: 1 to 4 nodes (docs/clusters.md)
# torchrun's own PET_* variables (set by Kubeflow jobs and TorchX) choose the rendezvous when no flag does.
# One process on one node without torchrun flags runs main_train_vrt.py directly; anything else runs torchrun
# through utils/utils_launch.py, which turns SIGTERM, SIGUSR1 and Ctrl-C into a checkpoint and exit 0.
set -euo pipefail
cd "$(dirname "$0")"

OPT=""
TORCHRUN_ARGS=()
MAIN_ARGS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --nnodes|--node-rank|--node_rank|--nproc-per-node|--nproc_per_node|--master-addr|--master_addr|--master-port|\
    --master_port|--local-addr|--local_addr|--max-restarts|--max_restarts|--monitor-interval|--monitor_interval|\
    --rdzv-backend|--rdzv_backend|--rdzv-endpoint|--rdzv_endpoint|--rdzv-id|--rdzv_id|--rdzv-conf|--rdzv_conf|\
    --redirects|--tee|--log-dir|--log_dir|--shutdown-timeout|--shutdown_timeout)
      TORCHRUN_ARGS+=("$1=${2:?$1 needs a value}"); shift ;;
    --nnodes=*|--node-rank=*|--node_rank=*|--nproc-per-node=*|--nproc_per_node=*|--master-addr=*|--master_addr=*|\
    --master-port=*|--master_port=*|--local-addr=*|--local_addr=*|--max-restarts=*|--max_restarts=*|\
    --monitor-interval=*|--monitor_interval=*|--rdzv*=*|--redirects=*|--tee=*|--log-dir=*|--log_dir=*|\
    --shutdown-timeout=*|--shutdown_timeout=*)
      TORCHRUN_ARGS+=("$1") ;;
    --opt) OPT="${2:?--opt needs a file}"; shift ;;
    --opt=*) OPT="${1#--opt=}" ;;
    -*) MAIN_ARGS+=("$1") ;;
    *) if [[ -z "$OPT" && ${#MAIN_ARGS[@]} -eq 0 ]]; then OPT="$1"; else MAIN_ARGS+=("$1"); fi ;;
  esac
  shift
done
OPT="${OPT:-options/vrt/000_train_vrt_demo.json}"

given() {  # given FLAG...: one of these torchrun flags is on the command line
  local arg flag
  for arg in ${TORCHRUN_ARGS[@]+"${TORCHRUN_ARGS[@]}"}; do
    for flag in "$@"; do [[ "$arg" == "$flag="* ]] && return 0; done
  done
  return 1
}

NNODES="${NNODES:-1}"
PROCS=()
if ! given --nproc-per-node --nproc_per_node && [[ -n "${NPROC:-}" || -z "${PET_NPROC_PER_NODE:-}" ]]; then
  if [[ -z "${NPROC:-}" ]]; then
    NPROC=$(python -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 1)")
  fi
  PROCS=(--nproc_per_node="$NPROC")
fi
if [[ "${NPROC:-}" == "1" && "$NNODES" == "1" && ${#TORCHRUN_ARGS[@]} -eq 0 && -z "${PET_NNODES:-}" ]]; then
  exec python main_train_vrt.py --opt "$OPT" ${MAIN_ARGS[@]+"${MAIN_ARGS[@]}"}
fi
if given --nnodes --rdzv-endpoint --rdzv_endpoint --rdzv-backend --rdzv_backend --master-addr --master_addr \
   || [[ -n "${PET_NNODES:-}" ]]; then
  RDZV=()  # the rendezvous comes from the flags, or from torchrun's PET_* variables
elif [[ "$NNODES" != "1" ]]; then
  RDZV=(--nnodes="$NNODES" --node_rank="${NODE_RANK:?set NODE_RANK on every node}"
        --master_addr="${MASTER_ADDR:?set MASTER_ADDR}" --master_port="${MASTER_PORT:-29500}")
else
  RDZV=(--standalone)
fi
exec python -m utils.utils_launch ${RDZV[@]+"${RDZV[@]}"} ${PROCS[@]+"${PROCS[@]}"} \
  ${TORCHRUN_ARGS[@]+"${TORCHRUN_ARGS[@]}"} main_train_vrt.py --opt "$OPT" ${MAIN_ARGS[@]+"${MAIN_ARGS[@]}"}
