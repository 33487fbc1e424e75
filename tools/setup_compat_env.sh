#!/usr/bin/env bash
# Build (or refresh) the compatibility environment of one stack in
# .venv-compat/<stack>/, beside .venv (called by `make test-compat`; safe to
# run any number of times).
#
#   tools/setup_compat_env.sh torch2.1     # the OpenMMLab-standard stack
#   tools/setup_compat_env.sh torch2.15    # the newest torch on the registry
#
# A stack is requirements/compat-<stack>.txt: a pip constraints file that pins
# torch, torchvision (and numpy where the stack needs it). The environment is
# built by tools/setup_env.sh with
#   POLA_MM_VENV=.venv-compat/<stack>, POLA_MM_TORCH=<the pinned torch and
#   torchvision>, PIP_CONSTRAINT=requirements/compat-<stack>.txt and
#   POLA_MM_SELF_INSTALL=none
# so it gets the OpenMMLab packages of .venv (requirements/runtime.txt, mmcv
# 2.1.0 compiled by tools/install_mmcv.py against that torch and cached by torch
# version, MMDeploy 1.3.1 and its ONNX Runtime) and no pola_mm:
# tools/compat_suite.py installs pola_mm from a wheel before each run.
# PIP_CONSTRAINT also replaces a machine-wide pip constraint that would cap
# torch (see docs/compat.md, "Compatibility stacks").
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

stack=${1:-}
constraints="requirements/compat-$stack.txt"
if [ -z "$stack" ] || [ ! -f "$constraints" ]; then
  known=$(cd requirements && ls compat-*.txt 2>/dev/null |
          sed -e 's/^compat-//' -e 's/\.txt$//' | tr '\n' ' ')
  echo "usage: $0 STACK   (one of: ${known:-none})" >&2
  exit 2
fi

# torch and torchvision exactly as the constraints pin them
torch_spec=$(grep -E '^(torch|torchvision)==' "$constraints" | tr '\n' ' ')
case "$torch_spec" in
  *torch==*torchvision==*) ;;
  *) echo "[setup-compat] ERROR: $constraints pins no torch==/torchvision==" >&2
     exit 2 ;;
esac

mkdir -p .venv-compat
start=$SECONDS
echo "[setup-compat $(date +%H:%M:%S)] stack $stack: ${torch_spec% }" \
     "-> .venv-compat/$stack"
POLA_MM_VENV=".venv-compat/$stack" \
POLA_MM_TORCH="${torch_spec% }" \
POLA_MM_SELF_INSTALL=none \
PIP_CONSTRAINT="$PWD/$constraints" \
  bash tools/setup_env.sh
# what the stack adds beside the project's requirements (the newest stack:
# the newest transformers, which a user's environment often has)
extra="requirements/extra-$stack.txt"
if [ -f "$extra" ]; then
  echo "[setup-compat $(date +%H:%M:%S)] stack $stack: extras from $extra"
  PIP_CONSTRAINT="$PWD/$constraints" \
    ".venv-compat/$stack/bin/python" -m pip install -q -r "$extra"
fi
echo "[setup-compat $(date +%H:%M:%S)] stack $stack ready in" \
     "$((SECONDS - start)) s"
