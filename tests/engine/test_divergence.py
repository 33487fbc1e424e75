"""Runs that diverge stop cleanly; AMP overflow steps do not stop a run.

- a NaN injected on one rank of a real 2-process run (the shrunk
  ``sem_fpn_pola_pvt_t_ade20k.py``): every rank stops at that iteration
  with a message naming it and the loss terms, non-zero exit, and the last
  checkpoint is the last good one;
- every task family's configs get the hooks from ``tools/train.py``, and
  their registries find them by name;
- ``--amp``: an Inf gradient is absorbed by the dynamic loss scale (step
  skipped, scale halved) and training goes on. mmengine's
  ``AmpOptimWrapper`` refuses to run without a GPU, so the test gives it
  torch's CPU ``GradScaler`` (same class, ``device='cpu'``); everything
  else is the tool's config and mmengine's Runner.
"""
import math
import os.path as osp
import subprocess

import e2e_data
import pytest
import torch
from fault_injection import seg_config
from helpers import REPO, subprocess_env
from mmengine.config import Config

import pola_mm  # noqa: F401
from pola_mm.cli.train_test import (build_runner, prepare_train_config,
                                    train_parser)
from pola_mm.engine import InvalidLossHook, NonFiniteLossError

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


def test_invalid_loss_hook_names_iteration_and_terms(tmp_path):
    from types import SimpleNamespace
    hook = InvalidLossHook()
    runner = SimpleNamespace(iter=6, epoch=0, work_dir=str(tmp_path),
                             train_loop=None)
    finite = dict(loss=torch.tensor(1.5), loss_cls=torch.tensor(1.5),
                  acc=torch.tensor(float('nan')))  # not a loss: ignored
    hook.after_train_iter(runner, 0, outputs=finite)
    (tmp_path / 'last_checkpoint').write_text('work/iter_6.pth')
    broken = dict(loss=torch.tensor(float('inf')),
                  loss_cls=torch.tensor(0.5),
                  loss_bbox=[torch.tensor(float('inf')), torch.tensor(1.)])
    with pytest.raises(NonFiniteLossError) as err:
        hook.after_train_iter(runner, 0, outputs=broken)
    assert str(err.value).startswith(
        'training diverged at iteration 7: non-finite loss, loss_bbox '
        '(loss=inf, loss_cls=0.5, loss_bbox=inf). Stopped before saving '
        'the broken weights; the last good checkpoint is work/iter_6.pth.')
    assert str(err.value).endswith('then --resume from it')
    # before any checkpoint: nothing to resume from, and it says so
    (tmp_path / 'last_checkpoint').unlink()
    with pytest.raises(NonFiniteLossError) as err:
        hook.after_train_iter(runner, 0, outputs=broken)
    msg = str(err.value)
    assert 'no checkpoint had been saved yet' in msg
    assert msg.endswith('then train again from the start')
    assert '--resume' not in msg
    with pytest.raises(ValueError, match='interval must be a positive'):
        InvalidLossHook(interval=0)


def test_nan_loss_stops_every_rank_and_keeps_last_good_checkpoint(tmp_path):
    pytest.importorskip('mmseg.models')
    root = str(tmp_path)
    # NaN weights on rank 0 before iteration 4; checkpoints at 2, 4, 6
    cfg = seg_config(root, hooks=[dict(type='NaNAtIterHook', at=3)])
    env = subprocess_env(launcher=True)
    proc = subprocess.run(
        ['bash', osp.join(REPO, 'tools', 'dist_train.sh'), cfg, '2'],
        cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, timeout=600)
    log = proc.stdout
    assert proc.returncode != 0, log[-3000:]
    work = osp.join(root, 'work')
    # both ranks stop at iteration 4 with the same verdict
    assert log.count('error: training diverged at iteration 4: ') == 2, \
        log[-3000:]
    assert 'rank 0: non-finite loss, decode.loss_ce (' in log, log[-3000:]
    assert 'rank 1:' not in log  # rank 1's own loss was still finite
    assert f'the last good checkpoint is {work}/iter_2.pth' in log
    assert not osp.exists(osp.join(work, 'iter_4.pth'))
    with open(osp.join(work, 'last_checkpoint')) as f:
        assert f.read() == osp.join(work, 'iter_2.pth')
    good = torch.load(osp.join(work, 'iter_2.pth'), map_location='cpu')
    assert all(torch.isfinite(v).all() for v in good['state_dict'].values()
               if v.is_floating_point())


@pytest.mark.parametrize('name, scope', [
    ('mask_rcnn_pola_swin_t.py', 'mmdet'),
    ('upernet_pola_swin_t_ade20k.py', 'mmseg'),
    ('pola_swin_t_in1k.py', 'mmpretrain'),
])
def test_train_tool_adds_the_hooks_in_every_family(name, scope):
    registry = pytest.importorskip(f'{scope}.registry')
    cfg = prepare_train_config(train_parser().parse_args(
        [osp.join(e2e_data.CONFIGS, name)]))
    assert cfg.default_scope == scope
    assert [h['type'] for h in cfg.custom_hooks].count('InvalidLossHook') \
        == 1
    ckpt = cfg.default_hooks.checkpoint
    assert ckpt.type == 'ResumableCheckpointHook'
    # the config's own checkpoint settings are kept
    plain = Config.fromfile(osp.join(e2e_data.CONFIGS, name))
    for key, value in plain.default_hooks.checkpoint.items():
        if key != 'type':
            assert ckpt[key] == value, key
    # and the codebase's registry builds both by name
    from mmengine.registry import DefaultScope
    with DefaultScope.overwrite_default_scope(scope):
        hook = registry.HOOKS.build(dict(ckpt))
        assert type(hook).__name__ == 'ResumableCheckpointHook'
        assert type(registry.HOOKS.build(
            dict(type='InvalidLossHook'))).__name__ == 'InvalidLossHook'


def test_amp_dynamic_loss_scale_skips_overflow_step(tmp_path, monkeypatch):
    from mmengine.optim.optimizer import amp_optimizer_wrapper as amp
    monkeypatch.setattr(amp, 'is_cuda_available', lambda: True)
    monkeypatch.setattr(amp, 'GradScaler',
                        lambda **kw: torch.amp.GradScaler('cpu', **kw))
    base = Config.fromfile(osp.join(REPO, 'tests', 'compat_tiny_cfg.py'))
    base.custom_imports = dict(imports=['compat_tiny', 'fault_injection'])
    base.custom_hooks = [dict(type='InfGradAtIterHook', at=1)]
    path = str(tmp_path / 'cfg.py')
    base.dump(path)
    cfg = prepare_train_config(train_parser().parse_args(
        [path, '--amp', '--work-dir', str(tmp_path / 'work')]))
    runner = build_runner(cfg)
    runner.train()  # InvalidLossHook is on and does not stop the run
    assert runner.iter == 4
    assert type(runner.optim_wrapper).__name__ == 'AmpOptimWrapper'
    inject = next(h for h in runner.hooks
                  if type(h).__name__ == 'InfGradAtIterHook')
    # the overflow step was skipped: the weights did not move ...
    assert torch.equal(inject.before, inject.after)
    # ... the scale was halved once (no growth within 2000 steps) ...
    scaler = runner.optim_wrapper.loss_scaler
    assert scaler.get_scale() == 2.0**16 / 2
    # ... and the other steps trained: finite weights, losses, a real fit
    for p in runner.model.parameters():
        assert torch.isfinite(p).all()
    losses = runner.message_hub.get_scalar('train/loss').data[0]
    assert len(losses) == 4 and all(math.isfinite(v) for v in losses)
    assert not torch.equal(inject.after,
                           next(runner.model.parameters()).detach())
