# Sourced by the launch scripts (dist_launch.sh, slurm_launch.sh,
# run_demo.sh): sets POLA_MM_ROOT to the repository and PYTHON to the
# interpreter to use: $PYTHON if set, else the repository's .venv if present,
# else python.
POLA_MM_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -z "${PYTHON:-}" ]; then
    if [ -x "$POLA_MM_ROOT/.venv/bin/python" ]; then
        PYTHON="$POLA_MM_ROOT/.venv/bin/python"
    else
        PYTHON=python
    fi
fi
