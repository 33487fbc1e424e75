#!/usr/bin/env bash
# Training on a Slurm cluster (OpenMMLab style).
#
#   [GPUS=8] [GPUS_PER_NODE=8] [CPUS_PER_TASK=5] [SRUN_ARGS=...] [GRES=...] \
#       tools/slurm_train.sh PARTITION JOB_NAME CONFIG WORK_DIR [train.py options]
#
# See tools/slurm_launch.sh for the variables.
#
# Pre-emption and time limits: pass --resume (it starts from scratch when the
# work dir has no checkpoint yet) and have Slurm send SIGTERM ahead of the end
# (srun/sbatch --signal=TERM@120). train.py then stops, never inside a
# checkpoint write, and exits with 143; requeue on that code. A job script:
# docs/reliability.md, "What to do on a cluster".
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
exec "$(dirname "$0")/slurm_launch.sh" train.py "$PARTITION" "$JOB_NAME" \
    "$CONFIG" --work-dir="$WORK_DIR" --launcher=slurm "$@"
