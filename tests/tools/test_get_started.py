"""README's "Get started" example, as written, under mmdet's own
``tools/train.py`` in a fresh folder: it trains without diverging, and a
forced divergence stops the upstream tool with one line and a non-zero
exit.

The user's config is the README's block verbatim (read from README.md at
test time). The test's own ``tiny.py`` on top only points the data at a
synthetic COCO set, makes the images small, the run a few iterations and
the warm-up short (so the snippet's AdamW lr is reached), and writes no
checkpoint files beyond mmdet's defaults. The ImageNet weights the snippet
names are a randomly initialised Pola-Swin-T saved where the snippet looks
(``checkpoints/pola_swin_t_in1k.pth``): the run starts as from scratch,
which is where mmdet's R50 optimiser (SGD lr 0.02) diverged.
"""
import math
import re
import subprocess
import sys
import textwrap

import e2e_data
import pytest
import torch
from helpers import clean_env, get_started_config, upstream_tool

pytest.importorskip('mmdet')

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


TINY = '''
_base_ = ['./my_config.py']
data_root = 'data/coco/'
pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='Resize', scale=(128, 128), keep_ratio=True),
    dict(type='PackDetInputs')]
train_dataloader = dict(
    batch_size=2, num_workers=0, persistent_workers=False,
    dataset=dict(data_root=data_root, ann_file='annotations.json',
                 data_prefix=dict(img='images/'),
                 metainfo=dict(classes=('person', 'bicycle', 'car')),
                 pipeline=pipeline))
train_cfg = dict(max_epochs={epochs}, val_interval=100)
val_cfg = None
val_dataloader = None
val_evaluator = None
test_cfg = None
test_dataloader = None
test_evaluator = None
param_scheduler = [
    dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=2)]
default_hooks = dict(logger=dict(interval=1),
                     checkpoint=dict(interval=1, max_keep_ckpts=1))
'''


@pytest.fixture(scope='module')
def project(tmp_path_factory):
    """A fresh folder: the README's config, COCO data, the weights file."""
    root = tmp_path_factory.mktemp('get_started')
    (root / 'my_config.py').write_text(get_started_config())
    e2e_data.make_coco(str(root / 'data' / 'coco'), num_images=4, size=128)
    from pola_mm.models.backbones import PolaSwinTransformer
    torch.manual_seed(0)
    backbone = PolaSwinTransformer(arch='tiny', window_size=56,
                                   attn_layout='LLSS')
    backbone.init_weights()
    (root / 'checkpoints').mkdir()
    torch.save(backbone.state_dict(),
               root / 'checkpoints' / 'pola_swin_t_in1k.pth')
    return root


def train(root, epochs: int, work_dir: str,
          *options: str) -> subprocess.CompletedProcess:
    (root / 'tiny.py').write_text(textwrap.dedent(TINY.format(epochs=epochs)))
    args = [sys.executable, upstream_tool('mmdet', 'train.py'), 'tiny.py',
            '--work-dir', work_dir]
    if options:
        args += ['--cfg-options', *options]
    return subprocess.run(args, cwd=str(root), env=clean_env(),
                          capture_output=True, text=True, timeout=600)


def losses(out: str):
    return [float(v) for v in re.findall(
        r'Epoch\(train\) +\[\d+\]\[\s*\d+/\d+\].*? loss: (\S+?) ', out)]


def test_readme_get_started_trains_under_mmdet_train_py(project):
    """Four iterations at the snippet's AdamW lr 1e-4 (mmdet's R50 config
    below the snippet would give SGD lr 0.02): every loss finite, the
    ImageNet file loaded, a checkpoint written."""
    proc = train(project, 2, 'work')
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    values = losses(out)
    assert len(values) == 4, out[-4000:]
    assert all(math.isfinite(v) for v in values), values
    dumped = next((project / 'work').glob('*/vis_data/config.py')).read_text()
    assert "type='AdamW'" in dumped and 'SGD' not in dumped
    assert "type='InvalidLossHook'" in dumped
    assert 'checkpoints/pola_swin_t_in1k.pth' in out  # init_cfg loaded it
    assert (project / 'work' / 'epoch_2.pth').is_file()
    # the snippet's hook and optimiser name their scope: no registry
    # fallback warnings
    assert 'Failed to search registry' not in out, [
        line for line in out.splitlines() if 'Failed to search' in line]


def test_forced_divergence_stops_mmdet_train_py_with_one_line(project):
    """An absurd lr makes the loss non-finite: mmdet's ``train.py`` stops at
    that iteration with one line naming it, no traceback, a non-zero exit,
    and no checkpoint of the broken weights."""
    work = project / 'work'
    before = set(work.glob('epoch_*.pth')) if work.is_dir() else set()
    proc = train(project, 1, 'diverged', 'optim_wrapper.optimizer.lr=1e12')
    err = proc.stderr
    assert proc.returncode != 0, (proc.stdout + err)[-4000:]
    assert 'Traceback' not in err, err[-4000:]
    last = [line for line in err.splitlines() if line.strip()][-1]
    assert re.match(r'error: training diverged at iteration \d+ \(epoch 1\): '
                    r'non-finite .*loss', last), err[-4000:]
    assert 'no checkpoint had been saved yet' in last
    assert not list((project / 'diverged').glob('*.pth'))
    assert set(work.glob('epoch_*.pth')) == before
