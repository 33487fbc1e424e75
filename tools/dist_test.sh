#!/usr/bin/env bash
# Distributed evaluation with torchrun (OpenMMLab style).
#
#   tools/dist_test.sh CONFIG CHECKPOINT GPUS [test.py options]
#
# See tools/dist_launch.sh for NNODES, NODE_RANK, MASTER_ADDR, PORT, PYTHON.
# On a machine without a GPU the same number of processes run on CPU with gloo.
set -euo pipefail

if [ $# -lt 3 ]; then
    echo "usage: $0 CONFIG CHECKPOINT GPUS [test.py options]" >&2
    exit 2
fi
CONFIG=$1
CHECKPOINT=$2
GPUS=$3
shift 3
exec "$(dirname "$0")/dist_launch.sh" test.py "$GPUS" \
    "$CONFIG" "$CHECKPOINT" --launcher pytorch "$@"
