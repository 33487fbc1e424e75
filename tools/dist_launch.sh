#!/usr/bin/env bash
# Shared by dist_train.sh and dist_test.sh: run tools/TOOL with torchrun,
# GPUS processes per node (the callers pass --launcher pytorch).
#
#   tools/dist_launch.sh TOOL GPUS [tool arguments]
#
# Environment: NNODES (1), NODE_RANK (0), MASTER_ADDR (127.0.0.1), PORT (29500),
# PYTHON (the interpreter; default: the repository's .venv if present, else python).
# On a machine without a GPU the same number of processes run on CPU with gloo.
set -euo pipefail

TOOL=$1
GPUS=$2
shift 2

# shellcheck source=tools/python_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/python_env.sh"
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
PORT=${PORT:-29500}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}

export PYTHONPATH="$POLA_MM_ROOT${PYTHONPATH:+:$PYTHONPATH}"
exec "$PYTHON" -m torch.distributed.run \
    --nnodes="$NNODES" \
    --node_rank="$NODE_RANK" \
    --master_addr="$MASTER_ADDR" \
    --master_port="$PORT" \
    --nproc_per_node="$GPUS" \
    "$POLA_MM_ROOT/tools/$TOOL" "$@"
