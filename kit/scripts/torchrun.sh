#!/usr/bin/env bash
# Launch `python -m <package> fit` with torchrun: one process per device, Lightning reads torchrun's variables.
#   One machine, every GPU:   kit/scripts/torchrun.sh configs/shakespeare_char.yaml
#   Two machines, 8 GPUs each (run on both; NODE_RANK=0 on the machine at MASTER_ADDR):
#     NNODES=2 NODE_RANK=0 MASTER_ADDR=10.0.0.1 kit/scripts/torchrun.sh configs/shakespeare_char.yaml
#     NNODES=2 NODE_RANK=1 MASTER_ADDR=10.0.0.1 kit/scripts/torchrun.sh configs/shakespeare_char.yaml
# More arguments go to `fit` (--config overlays, --key=value flags). The environment's python runs it
# (activate .venv first, or set PYTHON="uv run --frozen --no-sync python"). NPROC_PER_NODE (default: the
# number of GPUs) must match --trainer.devices, which configs/trainer/ddp.yaml leaves at auto (every GPU).
# The package is the one of the checkout holding this script (kit/scripts/package.sh; PACKAGE overrides).
# The run folder (runs/) must be on a file system every machine shares: rank 0 writes it.
set -euo pipefail
config=${1:?usage: kit/scripts/torchrun.sh CONFIG.yaml [extra fit arguments]}
shift
checkout="$(cd "$(dirname "$0")/../.." && pwd)"
# shellcheck source=kit/scripts/package.sh
source "$checkout/kit/scripts/package.sh"
ddp="$checkout/configs/trainer/ddp.yaml"
nnodes=${NNODES:-1}
rendezvous=(--standalone)
if [[ $nnodes -gt 1 ]]; then
  rendezvous=(--node-rank="${NODE_RANK:?set NODE_RANK (0 .. NNODES-1) on each machine}"
    --master-addr="${MASTER_ADDR:?set MASTER_ADDR to the address of the NODE_RANK=0 machine}"
    --master-port="${MASTER_PORT:-29500}")
fi
# shellcheck disable=SC2086 # PYTHON may be a command with arguments
exec ${PYTHON:-python} -m torch.distributed.run --nnodes="$nnodes" --nproc-per-node="${NPROC_PER_NODE:-gpu}" \
  "${rendezvous[@]}" -m "$PACKAGE" fit --config "$config" --config "$ddp" \
  --trainer.num_nodes="$nnodes" "$@"
