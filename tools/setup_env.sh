#!/usr/bin/env bash
# Create or refresh the project environment in .venv/ (called by `make test`
# and `make demo`; safe to run any number of times).
#
#   1. .venv from python3.11 (or POLA_MM_PYTHON), optionally seeing that
#      interpreter's packages (POLA_MM_SYSTEM_SITE_PACKAGES=1);
#   2. build tools (setuptools>=77.0.3,<81, wheel, ninja);
#   3. torch + torchvision: kept if a torch >= 2.1 is already importable in the
#      venv, otherwise $POLA_MM_TORCH (default torch==2.14.1 torchvision==0.29.1);
#   4. mmengine, mmdet, mmsegmentation, mmpretrain, timm, pytest (requirements/);
#   5. mmcv 2.1.0 with ops via tools/install_mmcv.py (built once, then cached in
#      ~/.cache/pola_mm/wheels, or $POLA_MM_WHEEL_CACHE);
#   6. MMDeploy 1.3.1 with --no-deps (its protobuf<=3.20.2 pin would break
#      onnx) after the dependencies it imports (requirements/mmdeploy*.txt);
#   7. openmim 0.3.9 with --no-deps (its opendatalab -> openxlab would pin
#      setuptools~=60.2.0), after what it imports (requirements/tests.txt);
#   8. pola_mm itself, editable (with its start-up hook, pola_mm_startup.pth,
#      that lets the upstream tools read pola_mm:: configs).
#
# A stamp keyed by the hash of the requirement files and of this script makes a
# second run return in seconds; delete .venv/ (or the stamp) to start over.
#
# Parameters (environment; the defaults build .venv as above):
#   POLA_MM_VENV          the folder of the environment (default .venv)
#   POLA_MM_TORCH         the torch/torchvision to install (step 3)
#   POLA_MM_SELF_INSTALL  editable (default): step 8 as above; none: pola_mm
#                         is not installed (tools/setup_compat_env.sh builds
#                         the compatibility environments this way, and
#                         installs pola_mm from a wheel before each run)
#   PIP_CONSTRAINT        pip's own: a constraints file for every pip call
#                         (the compatibility stacks pin torch and numpy so)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

VENV=${POLA_MM_VENV:-.venv}
PY="$VENV/bin/python"
STAMP="$VENV/.pola_mm_setup_stamp"
TORCH_SPEC=${POLA_MM_TORCH:-"torch==2.14.1 torchvision==0.29.1"}
SELF_INSTALL=${POLA_MM_SELF_INSTALL:-editable}
case "$SELF_INSTALL" in
  editable|none) ;;
  *) echo "[setup] ERROR: POLA_MM_SELF_INSTALL=$SELF_INSTALL (editable or none)" >&2
     exit 2 ;;
esac

log() { echo "[setup $(date +%H:%M:%S)] $*"; }

hash_inputs() {
  cat requirements.txt requirements/*.txt setup.cfg setup.py pyproject.toml \
    tools/setup_env.sh tools/install_mmcv.py | sha256sum | cut -c1-16
}
want=$(hash_inputs)
if [ "$VENV" != .venv ] || [ "$SELF_INSTALL" != editable ]; then
  # another environment: its stamp also records what it was built with
  want=$(printf '%s|%s|%s|%s' "$want" "$TORCH_SPEC" "$SELF_INSTALL" \
         "${PIP_CONSTRAINT:-}" | sha256sum | cut -c1-16)
fi

# the fast path: a cheap check (no heavy imports) that the stamped packages
# are still installed, that pola_mm is this checkout and that its start-up
# hook ran
installed() {
  "$PY" -I - "$PWD" "$SELF_INSTALL" <<'EOF' 2>/dev/null
import importlib.metadata as md, importlib.util, os, sys
for name in ('torch', 'torchvision', 'mmengine', 'mmcv', 'mmdet',
             'mmsegmentation', 'mmpretrain', 'timm', 'pytest', 'mmdeploy',
             'openmim'):
    md.version(name)
if sys.argv[2] == 'none':
    sys.exit(0)
md.version('pola_mm')
spec = importlib.util.find_spec('pola_mm')
assert spec is not None and os.path.realpath(spec.origin).startswith(
    os.path.realpath(sys.argv[1]) + os.sep)
assert 'pola_mm_startup' in sys.modules
EOF
}
if [ -x "$PY" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] &&
   installed; then
  log "$VENV is up to date (delete $STAMP to force a refresh)"
  exit 0
fi

start=$SECONDS
if [ ! -x "$PY" ]; then
  base=${POLA_MM_PYTHON:-}
  if [ -z "$base" ]; then
    for candidate in python3.11 python3; do
      if command -v "$candidate" >/dev/null 2>&1; then base=$candidate; break; fi
    done
  fi
  if [ -z "$base" ] || ! command -v "$base" >/dev/null 2>&1; then
    echo "[setup] ERROR: no python3.11 / python3 found; install Python 3.11 or" \
         "set POLA_MM_PYTHON=/path/to/python" >&2
    exit 1
  fi
  venv_args=()
  if [ "${POLA_MM_SYSTEM_SITE_PACKAGES:-0}" = 1 ]; then
    venv_args+=(--system-site-packages)
  fi
  log "creating $VENV with $base ($("$base" --version 2>&1))"
  if ! "$base" -m venv ${venv_args[@]+"${venv_args[@]}"} "$VENV"; then
    echo "[setup] ERROR: '$base -m venv' failed (on Debian/Ubuntu:" \
         "sudo apt-get install python3.11-venv)" >&2
    exit 1
  fi
fi

pip_install() { "$PY" -m pip install --disable-pip-version-check -q "$@"; }

log "build tools (setuptools, wheel, ninja)"
pip_install -r requirements/build.txt

if "$PY" - <<'EOF' 2>/dev/null
import torch, torchvision  # noqa: F401
major, minor = (int(x) for x in torch.__version__.split('+')[0].split('.')[:2])
assert (major, minor) >= (2, 1)
EOF
then
  log "keeping the installed torch $("$PY" -c 'import torch; print(torch.__version__)')"
else
  log "installing $TORCH_SPEC (about 1 minute from a local wheel cache, longer when downloaded)"
  # shellcheck disable=SC2086
  pip_install $TORCH_SPEC
fi

log "OpenMMLab stack, timm, pytest (requirements/)"
pip_install -r requirements/runtime.txt -r requirements/tests.txt

log "mmcv 2.1.0 with compiled ops (tools/install_mmcv.py)"
"$PY" tools/install_mmcv.py

log "MMDeploy 1.3.1 without its protobuf pin (requirements/mmdeploy*.txt)"
pip_install -r requirements/mmdeploy_deps.txt
pip_install --no-deps -r requirements/mmdeploy.txt

log "openmim 0.3.9 without opendatalab (requirements/mim.txt)"
pip_install --no-deps -r requirements/mim.txt

if [ "$SELF_INSTALL" = none ]; then
  log "pola_mm not installed here (POLA_MM_SELF_INSTALL=none)"
  "$PY" -I -c "import mmcv.ops, mmdet, mmseg, mmpretrain, timm" || {
    echo "[setup] ERROR: the environment was built but the imports above fail" >&2
    exit 1
  }
else
log "pola_mm (editable, with its start-up hook pola_mm_startup.pth)"
if ! pip_install -e . --no-deps --no-build-isolation > "$VENV/pola_mm_install.log" 2>&1; then
  cat "$VENV/pola_mm_install.log" >&2
  exit 1
fi

"$PY" -c "import pola_mm, mmcv.ops, mmdet, mmseg, mmpretrain, timm" || {
  echo "[setup] ERROR: the environment was built but the imports above fail" >&2
  exit 1
}
# a fresh interpreter runs the start-up hook (no PYTHONPATH, outside the
# checkout): the upstream tools will read pola_mm:: configs
venv_python="$PWD/$PY"
(cd / && env -u PYTHONPATH "$venv_python" -c \
   "import sys; assert 'pola_mm_startup' in sys.modules") || {
  echo "[setup] ERROR: pola_mm_startup.pth did not run (see $VENV/pola_mm_install.log)" >&2
  exit 1
}
fi
echo "$want" > "$STAMP"
log "environment ready in $((SECONDS - start)) s"
