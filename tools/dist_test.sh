#!/usr/bin/env bash
# Distributed evaluation with torchrun (OpenMMLab style).
#
#   tools/dist_test.sh CONFIG CHECKPOINT GPUS [test.py options]
#
# Environment: NNODES (1), NODE_RANK (0), MASTER_ADDR (127.0.0.1), PORT (29500),
# PYTHON (the interpreter; default: the repository's .venv if present, else python).
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

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
PORT=${PORT:-29500}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
if [ -z "${PYTHON:-}" ]; then
    if [ -x "$ROOT/.venv/bin/python" ]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python; fi
fi

export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
exec "$PYTHON" -m torch.distributed.run \
    --nnodes="$NNODES" \
    --node_rank="$NODE_RANK" \
    --master_addr="$MASTER_ADDR" \
    --master_port="$PORT" \
    --nproc_per_node="$GPUS" \
    "$ROOT/tools/test.py" "$CONFIG" "$CHECKPOINT" --launcher pytorch "$@"
