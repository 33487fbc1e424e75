"""Checkpoints a crash cannot corrupt: atomic writes, pruning after the
save, SIGTERM held until a write is complete.

The end-to-end runs use the tiny mmengine config of
``tests/compat_tiny_cfg.py`` (4 iterations, a checkpoint every 2) through
``tools/train.py``, with the faults of ``tests/fault_injection.py``. A
SIGKILL in the middle of a save of a real config is in
``test_resume_exact.py``.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import REPO_PATH as REPO
from helpers import subprocess_env
from mmengine.config import Config

import pola_mm  # noqa: F401
from pola_mm.engine import atomic_write, stale_temporary_files

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


def tiny_config(root: Path, hooks=(), **checkpoint) -> str:
    cfg = Config.fromfile(str(REPO / 'tests' / 'compat_tiny_cfg.py'))
    cfg.custom_imports = dict(imports=['compat_tiny', 'fault_injection'],
                              allow_failed_imports=False)
    cfg.custom_hooks = list(hooks)
    cfg.default_hooks.checkpoint.update(checkpoint)
    root.mkdir(parents=True, exist_ok=True)
    path = root / 'cfg.py'
    cfg.dump(str(path))
    return str(path)


def train(cfg: str, work: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / 'tools' / 'train.py'), cfg,
         '--work-dir', str(work), *extra], cwd=str(work.parent),
        env=subprocess_env(), capture_output=True, text=True, timeout=300)


def test_atomic_write_keeps_the_old_file_on_failure(tmp_path):
    path = tmp_path / 'iter_2.pth'
    atomic_write(str(path), lambda f: torch.save({'a': torch.ones(3)}, f))
    assert oct(path.stat().st_mode & 0o777) == oct(0o666 & ~_umask())

    def broken(f):
        f.write(b'PK\x03\x04 half a checkpoint')
        raise OSError(28, 'No space left on device')

    with pytest.raises(OSError, match='No space'):
        atomic_write(str(path), broken)
    assert torch.equal(torch.load(path)['a'], torch.ones(3))
    assert os.listdir(tmp_path) == ['iter_2.pth']  # no temporary file left


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_failed_save_keeps_previous_checkpoint_and_resume_uses_it(tmp_path):
    """The disk fills up while iter_4.pth is written (max_keep_ckpts=1:
    mmengine would already have deleted iter_2.pth)."""
    work = tmp_path / 'work'
    cfg = tiny_config(tmp_path, hooks=[dict(type='BrokenSaveHook', at=4,
                                            mode='error')],
                      max_keep_ckpts=1)
    proc = train(cfg, work)
    assert proc.returncode != 0
    assert 'No space left on device (injected)' in proc.stderr
    assert (work / 'iter_2.pth').is_file()
    assert not (work / 'iter_4.pth').exists()
    assert stale_temporary_files(str(work)) == []
    assert (work / 'last_checkpoint').read_text() == str(work / 'iter_2.pth')
    assert torch.load(work / 'iter_2.pth')['meta']['iter'] == 2

    proc = train(tiny_config(tmp_path / 'again', max_keep_ckpts=1), work,
                 '--resume')
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert 'resumed epoch: 0, iter: 2' in proc.stdout + proc.stderr
    assert torch.load(work / 'iter_4.pth')['meta']['iter'] == 4
    # pruned only after the new checkpoint was complete
    assert not (work / 'iter_2.pth').exists()
    assert (work / 'last_checkpoint').read_text() == str(work / 'iter_4.pth')


def test_sigterm_during_save_completes_it_then_stops(tmp_path):
    work = tmp_path / 'work'
    cfg = tiny_config(tmp_path, hooks=[dict(type='BrokenSaveHook', at=2,
                                            mode='sigterm')])
    proc = train(cfg, work)
    assert proc.returncode == 143, proc.stderr[-3000:]
    assert 'stopped by SIGTERM' in proc.stderr
    assert 'Traceback' not in proc.stderr
    # the checkpoint being written when the signal came is complete
    assert torch.load(work / 'iter_2.pth')['meta']['iter'] == 2
    assert (work / 'last_checkpoint').read_text() == str(work / 'iter_2.pth')
    assert not (work / 'iter_4.pth').exists()  # stopped right after it
    assert stale_temporary_files(str(work)) == []
