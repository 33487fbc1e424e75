#!/usr/bin/env bash
# Distributed training with torchrun (OpenMMLab style).
#
#   tools/dist_train.sh CONFIG GPUS [train.py options]
#
# See tools/dist_launch.sh for NNODES, NODE_RANK, MASTER_ADDR, PORT, PYTHON.
# On a machine without a GPU the same number of processes run on CPU with gloo.
set -euo pipefail

if [ $# -lt 2 ]; then
    echo "usage: $0 CONFIG GPUS [train.py options]" >&2
    exit 2
fi
CONFIG=$1
GPUS=$2
shift 2
exec "$(dirname "$0")/dist_launch.sh" train.py "$GPUS" \
    "$CONFIG" --launcher pytorch "$@"
