"""Kill a real training job and ``--resume`` it: the result is the
uninterrupted run, bit for bit (CPU).

The config is the real ``sem_fpn_pola_pvt_t_ade20k.py`` (iteration-based,
``InfiniteSampler``) shrunk as in the e2e tests, with drop path and a random
flip left in so that the random states matter (see
``fault_injection.seg_config``). Checkpoints every 2 of 6 iterations.

- one process: SIGKILL in the middle of writing ``iter_4.pth`` (after
  ``iter_2.pth`` and two more iterations); ``--resume`` continues from
  iteration 2;
- two processes (``tools/dist_train.sh``, gloo): the whole job (torchrun
  and both ranks) is SIGKILLed during iteration 6, after ``iter_4.pth``;
  ``--resume`` continues from iteration 4.

Both compare the final checkpoint with an uninterrupted run: weights,
optimizer state, scheduler state and every logged loss value, exactly.
"""
import os
import os.path as osp
import signal
import subprocess
import sys
import time

import pytest
import torch
from fault_injection import seg_config
from helpers import REPO, subprocess_env

import pola_mm  # noqa: F401  (allow-list for Runner checkpoints)

pytest.importorskip('mmseg.models')

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


def _command(cfg: str, procs: int, *extra: str) -> list:
    if procs == 1:
        return [sys.executable, osp.join(REPO, 'tools', 'train.py'), cfg,
                *extra]
    return ['bash', osp.join(REPO, 'tools', 'dist_train.sh'), cfg,
            str(procs), *extra]


def train(cfg: str, procs: int, *extra: str, check: bool = True
          ) -> subprocess.CompletedProcess:
    proc = subprocess.run(_command(cfg, procs, *extra), cwd=osp.dirname(cfg),
                          env=subprocess_env(launcher=True),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=600)
    if check:
        assert proc.returncode == 0, proc.stdout[-5000:]
    return proc


def _descendants(pid: int) -> list:
    """Every process below ``pid`` (torchrun starts each rank in a session
    of its own, so a process group does not hold the job)."""
    children = {}
    for entry in os.listdir('/proc'):
        if entry.isdigit():
            try:
                with open(f'/proc/{entry}/stat') as f:
                    ppid = int(f.read().rsplit(')', 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _kill_job(pid: int) -> None:
    """SIGKILL ``pid`` and everything it started, all at once (a node
    dying)."""
    for p in [pid] + _descendants(pid):
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def train_until_marker(cfg: str, procs: int, marker: str) -> str:
    """Start training; SIGKILL the whole job (launcher and ranks) once
    ``marker`` exists. Returns the output."""
    proc = subprocess.Popen(_command(cfg, procs), cwd=osp.dirname(cfg),
                            env=subprocess_env(launcher=True),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        deadline = time.time() + 600
        while not osp.exists(marker) and proc.poll() is None:
            assert time.time() < deadline, 'the job never reached the marker'
            time.sleep(0.2)
    finally:
        _kill_job(proc.pid)
    out = proc.communicate(timeout=60)[0]
    assert osp.exists(marker), out[-5000:]
    return out


def load(path: str) -> dict:
    return torch.load(path, map_location='cpu')


def assert_same_run(full: dict, resumed: dict) -> None:
    """Weights, optimizer and scheduler state and every logged loss of
    two final checkpoints are identical."""
    assert full['meta']['iter'] == resumed['meta']['iter']
    for key, value in full['state_dict'].items():
        assert torch.equal(value, resumed['state_dict'][key]), key
    states = (full['optimizer']['state'], resumed['optimizer']['state'])
    assert states[0].keys() == states[1].keys()
    for idx, state in states[0].items():
        for name, value in state.items():
            other = states[1][idx][name]
            assert torch.equal(torch.as_tensor(value),
                               torch.as_tensor(other)), (idx, name)
    assert full['param_schedulers'] == resumed['param_schedulers']
    logs = (full['message_hub']['log_scalars'],
            resumed['message_hub']['log_scalars'])
    losses = [k for k in logs[0] if 'loss' in k]
    assert 'train/loss' in losses
    for key in losses:
        a, b = logs[0][key].data[0], logs[1][key].data[0]
        assert len(a) == full['meta']['iter'], key  # one value an iteration
        assert a.tolist() == b.tolist(), key


@pytest.mark.parametrize('procs', [1, 2])
def test_sigkill_then_resume_equals_uninterrupted(tmp_path, procs):
    full_cfg = seg_config(str(tmp_path / 'full'))
    train(full_cfg, procs)
    full = load(str(tmp_path / 'full' / 'work' / 'iter_6.pth'))

    root = tmp_path / 'killed'
    work = root / 'work'
    marker = str(root / 'killed_here')
    if procs == 1:  # killed while writing iter_4.pth
        hooks = [dict(type='BrokenSaveHook', at=4, mode='kill')]
        expected_resume = 2
    else:  # the whole job killed during iteration 6
        hooks = [dict(type='BlockAtIterHook', at=5, marker=marker)]
        expected_resume = 4
    cfg = seg_config(str(root), hooks=hooks)
    if procs == 1:
        proc = train(cfg, 1, check=False)
        assert proc.returncode == -signal.SIGKILL, proc.stdout[-3000:]
        # the half-written checkpoint is a temporary file, never iter_4.pth
        assert not (work / 'iter_4.pth').exists()
        assert any(n.startswith('.iter_4.pth.') for n in os.listdir(work))
    else:
        train_until_marker(cfg, 2, marker)
        assert (work / 'iter_4.pth').exists()
    last = (work / 'last_checkpoint').read_text()
    assert last == str(work / f'iter_{expected_resume}.pth')
    assert load(last)['meta']['iter'] == expected_resume

    # the same config, minus the faults, continued with --resume
    cfg = seg_config(str(root))
    proc = train(cfg, procs, '--resume')
    log = proc.stdout
    assert f'resumed epoch: 0, iter: {expected_resume}' in log, log[-3000:]
    # training went on from the checkpoint, not from 0 or the kill point
    assert f'Iter(train) [{expected_resume + 1}/6]' in log, log[-3000:]
    assert f'Iter(train) [{expected_resume}/6]' not in log
    assert not any(n.endswith('.tmp') for n in os.listdir(work))
    assert_same_run(full, load(str(work / 'iter_6.pth')))
