"""``make gpu-check`` (tools/gpu_check.sh) on a machine without a GPU: one
line, exit status 0, no report written."""
import os
import subprocess
import sys

import helpers
import pytest
import torch


@pytest.mark.skipif(torch.cuda.is_available(),
                    reason='this machine has a GPU: gpu-check runs for real '
                    '(the CUDA tests cover it)')
def test_gpu_check_skips_cleanly_without_gpu(tmp_path):
    env = dict(os.environ, GPU_CHECK_DIR=str(tmp_path / 'out'))
    env['PY'] = sys.executable
    res = subprocess.run(['make', '-s', '-C', helpers.REPO, 'gpu-check'],
                         capture_output=True, text=True, timeout=120,
                         env=env)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        'gpu-check: skipped: no CUDA GPU'), res.stdout
    assert not (tmp_path / 'out').exists()
