#!/usr/bin/env bash
# Shared by slurm_train.sh and slurm_test.sh: run tools/TOOL with srun, one
# task per GPU (the callers pass --launcher=slurm).
#
#   [GPUS=8] [GPUS_PER_NODE=8] [CPUS_PER_TASK=5] [SRUN_ARGS=...] [GRES=...] \
#       tools/slurm_launch.sh TOOL PARTITION JOB_NAME [tool arguments]
#
# GRES overrides the --gres request (default gpu:GPUS_PER_NODE; GRES= (empty)
# requests none). The slurm launcher needs GPUs: pola_mm's CPU fallback covers
# --launcher pytorch (tools/dist_train.sh) only.
# PYTHON: the interpreter (default: the repository's .venv if present, else python).
set -euo pipefail

TOOL=$1
PARTITION=$2
JOB_NAME=$3
shift 3

# shellcheck source=tools/python_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/python_env.sh"
GPUS=${GPUS:-8}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
CPUS_PER_TASK=${CPUS_PER_TASK:-5}
SRUN_ARGS=${SRUN_ARGS:-}
GRES=${GRES-gpu:${GPUS_PER_NODE}}

export PYTHONPATH="$POLA_MM_ROOT${PYTHONPATH:+:$PYTHONPATH}"
# shellcheck disable=SC2086  # SRUN_ARGS is a list of words on purpose
exec srun -p "$PARTITION" \
    --job-name="$JOB_NAME" \
    ${GRES:+--gres=$GRES} \
    --ntasks="$GPUS" \
    --ntasks-per-node="$GPUS_PER_NODE" \
    --cpus-per-task="$CPUS_PER_TASK" \
    --kill-on-bad-exit=1 \
    ${SRUN_ARGS} \
    "$PYTHON" -u "$POLA_MM_ROOT/tools/$TOOL" "$@"
