#!/usr/bin/env bash
# Training on a Slurm cluster (OpenMMLab style).
#
#   [GPUS=8] [GPUS_PER_NODE=8] [CPUS_PER_TASK=5] [SRUN_ARGS=...] \
#       tools/slurm_train.sh PARTITION JOB_NAME CONFIG WORK_DIR [train.py options]
#
# One task per GPU. GRES overrides the --gres request (default gpu:GPUS_PER_NODE;
# GRES= (empty) requests none, e.g. for CPU partitions, where the tasks use gloo).
# PYTHON: the interpreter (default: the repository's .venv if present, else python).
set -euo pipefail

if [ $# -lt 4 ]; then
    echo "usage: $0 PARTITION JOB_NAME CONFIG WORK_DIR [train.py options]" >&2
    exit 2
fi
PARTITION=$1
JOB_NAME=$2
CONFIG=$3
WORK_DIR=$4
shift 4

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
GPUS=${GPUS:-8}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
CPUS_PER_TASK=${CPUS_PER_TASK:-5}
SRUN_ARGS=${SRUN_ARGS:-}
GRES=${GRES-gpu:${GPUS_PER_NODE}}
if [ -z "${PYTHON:-}" ]; then
    if [ -x "$ROOT/.venv/bin/python" ]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python; fi
fi

export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
# shellcheck disable=SC2086  # SRUN_ARGS is a list of words on purpose
srun -p "$PARTITION" \
    --job-name="$JOB_NAME" \
    ${GRES:+--gres=$GRES} \
    --ntasks="$GPUS" \
    --ntasks-per-node="$GPUS_PER_NODE" \
    --cpus-per-task="$CPUS_PER_TASK" \
    --kill-on-bad-exit=1 \
    ${SRUN_ARGS} \
    "$PYTHON" -u "$ROOT/tools/train.py" "$CONFIG" --work-dir="$WORK_DIR" --launcher=slurm "$@"
