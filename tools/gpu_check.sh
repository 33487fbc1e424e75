#!/usr/bin/env bash
# The GPU checks in one command (`make gpu-check`), within 10 minutes:
#   1. the CUDA tests (tests/gpu: every backbone on CUDA against the CPU,
#      AMP through mmengine's AmpOptimWrapper, one training step of a real
#      config, the activation estimate against the allocator);
#   2. the benchmark on CUDA, Pola vs softmax side by side (train step,
#      batch 2, 800x1344, float32 and fp16 autocast: time and
#      max_memory_allocated), and Pola with its attention's Triton kernels
#      beside the torch path they replace (<name>_torch), and inference
#      at batch 1 under torch.compile (<name>_compile);
#   3. the meta/fake-CUDA activation estimate against memory_allocated and
#      max_memory_allocated (tools/analysis/train_memory.py --cuda-check);
#   4. the sequence-length benchmark of the attention alone, and the op
#      alone (kernels, torch path) against its bandwidth bound at N = 16384
#      and 67200, d = 32;
#   5. inference at batch 1 and a whole Mask R-CNN training step under fp16
#      AMP against the same detector with mmdet's Swin-T;
# and ends with one table of the Pola / softmax ratios against their goals
# (tools/analysis/gpu_table.py table).
# Everything goes to one report file: $GPU_CHECK_DIR (default
# work_dirs/gpu_check)/report_<date>.md. Without a GPU it prints one line
# and exits 0. PY (default .venv/bin/python, else python) picks the
# interpreter; GPU_CHECK_BUDGET (default 600) the seconds for all steps.
set -u
cd "$(dirname "$0")/.."

PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python
if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
    echo "gpu-check: skipped: no CUDA GPU (torch.cuda.is_available() is False for $PY)"
    exit 0
fi

OUT=${GPU_CHECK_DIR:-work_dirs/gpu_check}
mkdir -p "$OUT"
REPORT="$OUT/report_$(date +%Y%m%d_%H%M%S).md"
BUDGET=${GPU_CHECK_BUDGET:-600}
START=$(date +%s)
FAILED=0
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

{
    echo "# pola_mm GPU check, $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo
    "$PY" - <<'EOF'
import torch
print(f'- GPU: {torch.cuda.get_device_name()} '
      f'({torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB)')
print(f'- torch {torch.__version__}, CUDA {torch.version.cuda}, '
      f'cuDNN {torch.backends.cudnn.version()}')
EOF
    echo "- commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
} > "$REPORT"

# step NAME SECONDS COMMAND...: run with a time limit (capped by what is
# left of the budget), append its output to the report
step() {
    local name=$1 limit=$2
    shift 2
    local left=$((BUDGET - ($(date +%s) - START)))
    if [ "$left" -lt 20 ]; then
        printf '\n## %s\n\nnot run: the %s s budget is spent\n' "$name" "$BUDGET" >> "$REPORT"
        FAILED=1
        return
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    echo "gpu-check: $name (at most ${limit} s)"
    local t0
    t0=$(date +%s)
    printf '\n## %s\n\n```\n$ %s\n' "$name" "$*" >> "$REPORT"
    timeout --kill-after=10 "$limit" "$@" >> "$REPORT" 2>&1
    local rc=$?
    printf '```\n\nexit status %s, %s s\n' "$rc" "$(($(date +%s) - t0))" >> "$REPORT"
    if [ "$rc" -ne 0 ]; then
        FAILED=1
        [ "$rc" -eq 124 ] && echo "(timed out after ${limit} s)" >> "$REPORT"
    fi
}

step "benchmark, float32" 150 "$PY" tools/analysis/benchmark.py \
    --models pola_swin_t swin_t pola_pvt_t pvt_t pola_swin_t_torch \
    pola_pvt_t_torch --mode train \
    --size 800x1344 --batch 2 --device cuda --repeats 5 --timeout 45 \
    --json "$OUT/train_fp32.json"
step "benchmark, fp16 autocast" 100 "$PY" tools/analysis/benchmark.py \
    --models pola_swin_t swin_t pola_pvt_t pvt_t pola_swin_t_torch \
    pola_pvt_t_torch --mode train \
    --size 800x1344 --batch 2 --device cuda --dtype fp16 --repeats 5 \
    --timeout 45 --json "$OUT/train_fp16.json"
step "benchmark, inference batch 1" 150 "$PY" tools/analysis/benchmark.py \
    --models pola_swin_t swin_t pola_pvt_t pvt_t pola_swin_t_torch \
    pola_pvt_t_torch pola_swin_t_compile swin_t_compile \
    pola_pvt_t_compile pvt_t_compile --mode infer \
    --size 800x1344 --batch 1 --device cuda --repeats 5 --timeout 45 \
    --json "$OUT/infer_fp32.json"
step "whole Mask R-CNN train step, fp16 AMP" 90 "$PY" \
    tools/analysis/gpu_table.py whole configs/mask_rcnn_pola_swin_t.py \
    --amp fp16 --json "$OUT/whole_amp.json"
step "CUDA tests" 200 "$PY" -m pytest tests/gpu -q -p no:cacheprovider -ra
step "activation estimate vs allocator, Pola-Swin-T" 40 "$PY" \
    tools/analysis/train_memory.py pola_swin_t --batch 2 --shape 800 1344 \
    --cuda-check
step "activation estimate vs allocator, Pola-PVT-T" 40 "$PY" \
    tools/analysis/train_memory.py pola_pvt_t --batch 2 --shape 800 1344 \
    --cuda-check
step "activation estimate vs allocator, Pola-Swin-T fp16" 40 "$PY" \
    tools/analysis/train_memory.py pola_swin_t --batch 2 --shape 800 1344 \
    --amp fp16 --cuda-check
step "sequence-length benchmark" 80 "$PY" tools/analysis/benchmark.py \
    --seqlen 4096 16384 65536 200704 --device cuda --heads 1 \
    --head-dims 64 --repeats 3 --time-cap 10
step "the attention op alone against its bandwidth bound" 60 "$PY" \
    tools/analysis/benchmark.py --seqlen 16384 67200 --device cuda \
    --heads 1 --head-dims 32 --repeats 5 --time-cap 10 \
    --methods polarity_op polarity_op_torch bound

# the closing table: every ratio against its goal (what was not measured
# says so)
{
    printf '\n## Pola / softmax, 800x1344\n\n'
    "$PY" tools/analysis/gpu_table.py table "$OUT/train_fp32.json" \
        "$OUT/train_fp16.json" "$OUT/infer_fp32.json" \
        --whole "$OUT/whole_amp.json" 2>&1
} >> "$REPORT"
printf '\n%s s in all\n' "$(($(date +%s) - START))" >> "$REPORT"
tail -n 12 "$REPORT"
if [ "$FAILED" -ne 0 ]; then
    echo "gpu-check: FAILED (see $REPORT)"
    exit 1
fi
echo "gpu-check: passed, report in $REPORT"
