"""The upstream packages' own tools on a user's config with ``pola_mm::``
bases, unchanged: mmdet's, mmseg's and mmpretrain's scripts as shipped in
those packages (``<package>/.mim/tools``) and openmim's ``mim train`` /
``mim test``.

Every tool runs as a subprocess of this interpreter from a fresh folder
(``tmp_path``) with a clean environment: no ``PYTHONPATH`` (the repository
and ``tests/`` are not importable there), nothing imported first. What
lets mmengine read ``pola_mm::`` is the installed package's start-up hook
(``pola_mm_startup.pth`` in site-packages, :mod:`pola_mm_startup`); the
first test shows the same config refused with the hook turned off.
"""
import json
import os
import os.path as osp
import re
import subprocess
import sys
import sysconfig
import textwrap
from typing import List

import e2e_data
import pytest
from helpers import REPO, clean_env, copy_source_tree, upstream_tool

pytest.importorskip('mmdet')

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

#: the snippet families: (snippet, backbone type, channels)
SNIPPETS = {
    'Pola-Swin': ('pola_swin_t_fpn.py', 'PolaSwinTransformer',
                  [96, 192, 384, 768]),
    'Pola-PVT': ('pola_pvt_t_fpn.py', 'PolaPVT', [64, 128, 320, 512]),
    'PolaPP': ('polapp_b1_fpn.py', 'PolaPP', [32, 64, 192, 384]),
}


def run(args: List[str], cwd, timeout: int = 300,
        **env: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(args, cwd=str(cwd), env=clean_env(**env),
                          capture_output=True, text=True, timeout=timeout)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f'{args} failed ({proc.returncode}):\n' + \
        out[-4000:]
    return proc


def write(path, text: str) -> str:
    path.write_text(textwrap.dedent(text))
    return str(path)


# -- the hook -----------------------------------------------------------------
PROBE = '''
import json, sys
before = sorted(m for m in ('torch', 'mmengine', 'pola_mm', 'numpy')
                if m in sys.modules)
hooked = 'pola_mm_startup' in sys.modules
from mmengine.config import Config
from mmengine.config.utils import MODULE2PACKAGE
early = 'pola_mm' in MODULE2PACKAGE
try:
    cfg = Config.fromfile('my_config.py', import_custom_modules=False)
    result = cfg.model.backbone.type
except Exception as exc:
    result = f'{type(exc).__name__}: {exc}'
print(json.dumps(dict(before=before, hooked=hooked, early=early,
                      registered='pola_mm' in MODULE2PACKAGE,
                      pola_mm_imported='pola_mm' in sys.modules,
                      result=result)))
'''


def test_start_up_hook_registers_the_scope_lazily(tmp_path):
    """At start-up only the hook module is loaded (no torch, mmengine or
    pola_mm); mmengine's config reader registers ``pola_mm::`` at the
    first such entry (not before), with pola_mm not imported. With the
    hook off, mmengine refuses the config."""
    write(tmp_path / 'my_config.py', '''
        _base_ = ['mmdet::retinanet/retinanet_r50_fpn_1x_coco.py',
                  'pola_mm::_base_/models/pola_pvt_t_fpn.py']
        model = dict(backbone=_base_.pola_backbone, neck=_base_.pola_neck)
        ''')
    write(tmp_path / 'probe.py', PROBE)
    on = json.loads(run([sys.executable, 'probe.py'], tmp_path)
                    .stdout.strip().splitlines()[-1])
    assert on == dict(before=[], hooked=True, early=False, registered=True,
                      pola_mm_imported=False, result='PolaPVT')
    off = json.loads(run([sys.executable, 'probe.py'], tmp_path,
                         POLA_MM_STARTUP_HOOK='0')
                     .stdout.strip().splitlines()[-1])
    assert off['registered'] is False
    assert off['result'] == ('AssertionError: mmengine does not support to '
                             'load pola_mm config.')


@pytest.mark.parametrize('name', ['mask_rcnn_pola_swin_t.py',
                                  'upernet_pola_swin_t_ade20k.py'])
def test_start_up_hook_reads_a_complete_config_by_scope(tmp_path, name):
    """A user's config inherits a whole shipped config by ``pola_mm::``
    (no folder: mmengine alone refuses it); the hook alone reads it, before
    pola_mm, torch or mmengine are imported, with pola_mm's backbone."""
    write(tmp_path / 'my_config.py', f"_base_ = ['pola_mm::{name}']\n")
    write(tmp_path / 'probe.py', PROBE)
    on = json.loads(run([sys.executable, 'probe.py'], tmp_path)
                    .stdout.strip().splitlines()[-1])
    assert on == dict(before=[], hooked=True, early=False, registered=True,
                      pola_mm_imported=False, result='PolaSwinTransformer')
    off = json.loads(run([sys.executable, 'probe.py'], tmp_path,
                         POLA_MM_STARTUP_HOOK='0')
                     .stdout.strip().splitlines()[-1])
    assert off['result'].startswith(
        'ValueError: `_get_package_and_cfg_path` is used for get external '
        'package'), off['result']


def test_start_up_hook_is_installed_in_site_packages():
    pth = osp.join(sysconfig.get_paths()['purelib'], 'pola_mm_startup.pth')
    assert osp.isfile(pth), 'pip install [-e] . writes it (setup.py)'
    with open(pth) as f:
        assert f.read().strip() == \
            'import pola_mm_startup; pola_mm_startup.install()'


# -- mmdet: train.py, test.py, mim test ---------------------------------------
DET_USER_CONFIG = '''
# A user's config in their own project: the demo model by pola_mm::
_base_ = ['pola_mm::demo/mask_rcnn_pola_swin_shapes.py']

train_dataloader = dict(batch_size=2)
train_cfg = dict(max_iters=4, val_interval=4)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=2)]
default_hooks = dict(logger=dict(interval=1),
                     checkpoint=dict(interval=4, max_keep_ckpts=1))
# 4 iterations: keep every box, so the evaluation has detections to score
model = dict(test_cfg=dict(rcnn=dict(score_thr=0.0)))
'''


def _metrics(text: str) -> dict:
    return {k: float(v) for k, v in
            re.findall(r'(coco/(?:bbox|segm)_mAP): (-?\d+\.\d+)', text)}


def test_mmdet_tools_train_and_test_a_pola_mm_config(tmp_path):
    """``mim train mmdet`` runs mmdet's shipped ``tools/train.py``, which
    trains the demo model listed by ``pola_mm::`` for 4 iterations on the
    shapes data; ``mim test mmdet`` runs mmdet's shipped ``tools/test.py``
    on the checkpoint, which evaluates it."""
    from pola_mm.demo.shapes import make_shapes_dataset
    make_shapes_dataset(str(tmp_path / 'data' / 'shapes'), num_train=8,
                        num_val=2, seed=1)
    cfg = write(tmp_path / 'my_config.py', DET_USER_CONFIG)
    train = run([sys.executable, '-m', 'mim', 'train', 'mmdet', cfg,
                 '--work-dir', 'work'], tmp_path)
    out = train.stdout + train.stderr
    # mim's own line: the command it ran is the shipped tool on our config
    assert f'{upstream_tool("mmdet", "train.py")} {cfg}' in out
    losses = [float(v) for v in re.findall(r'Iter\(train\) +\[\s*\d+/4\].*?'
                                           r' loss: (\d+\.\d+)', out)]
    assert len(losses) == 4, out[-3000:]
    assert 'PolaSwinTransformer' in open(
        next((tmp_path / 'work').glob('*/vis_data/config.py'))).read()
    ckpt = tmp_path / 'work' / 'iter_4.pth'
    assert ckpt.is_file()

    test = run([sys.executable, '-m', 'mim', 'test', 'mmdet', cfg,
                '--checkpoint', str(ckpt), '--work-dir', 'test_work'],
               tmp_path)
    out = test.stdout + test.stderr
    assert f'{upstream_tool("mmdet", "test.py")} {cfg} {ckpt}' in out
    metrics = _metrics(out)
    assert set(metrics) == {'coco/bbox_mAP', 'coco/segm_mAP'}, out[-3000:]
    assert all(0.0 <= v <= 1.0 for v in metrics.values())


# -- mmseg and mmpretrain: parse, build, one training iteration ---------------
#: users' configs: a complete upstream config plus one snippet each
SEG_UPERNET = """
_base_ = ['mmseg::swin/swin-tiny-patch4-window7-in1k-pre_upernet_'
          '8xb2-160k_ade20k-512x512.py',
          'pola_mm::_base_/models/{snippet}']
model = dict(
    backbone=dict(_base_.pola_backbone, init_cfg=None),  # no weights here
    decode_head=dict(in_channels=_base_.pola_channels),
    auxiliary_head=dict(in_channels=_base_.pola_channels[2]))
"""
SEG_FPN = """
_base_ = ['mmseg::sem_fpn/fpn_r50_4xb4-160k_ade20k-512x512.py',
          'pola_mm::_base_/models/{snippet}']
model = dict(
    pretrained=None,
    backbone=dict(_base_.pola_backbone, init_cfg=None),  # no weights here
    neck=_base_.pola_neck)
"""
CLS = """
_base_ = ['mmpretrain::swin_transformer/swin-tiny_16xb64_in1k.py',
          'pola_mm::_base_/models/{snippet}']
model = dict(
    backbone=dict(_base_.pola_backbone, init_cfg=None, out_indices=(3, )),
    head=dict(in_channels=_base_.pola_channels[-1]))
"""
#: the test's own overrides on top (tiny images, one iteration, no files)
SEG_TINY = """
_base_ = ['./my_config.py']
crop_size = (64, 64)
model = dict(data_preprocessor=dict(size=crop_size))
train_dataloader = dict(
    batch_size=2, num_workers=0, persistent_workers=False,
    dataset=dict(data_root='ade', pipeline=[
        dict(type='LoadImageFromFile'),
        dict(type='LoadAnnotations', reduce_zero_label=True),
        dict(type='Resize', scale=crop_size, keep_ratio=False),
        dict(type='PackSegInputs')]))
train_cfg = dict(max_iters=1)
"""
CLS_TINY = """
_base_ = ['./my_config.py']
model = dict(train_cfg=None)  # no Mixup / CutMix
train_dataloader = dict(
    batch_size=2, num_workers=0, persistent_workers=False,
    dataset=dict(_delete_=True, type='CustomDataset',
                 data_root='images/train', pipeline=[
                     dict(type='LoadImageFromFile'),
                     dict(type='Resize', scale=(64, 64)),
                     dict(type='PackInputs')]))
train_cfg = dict(max_epochs=1)
param_scheduler = None  # the 20 warm-up epochs do not fit in one
"""
NO_FILES = """
val_cfg = None
val_dataloader = None
val_evaluator = None
default_hooks = dict(checkpoint=None, logger=dict(interval=1))
"""


@pytest.mark.parametrize('tool, family, user_config', [
    ('mmseg', 'Pola-Swin', SEG_UPERNET),
    ('mmseg', 'Pola-PVT', SEG_FPN),
    ('mmpretrain', 'PolaPP', CLS),
])
def test_mmseg_mmpretrain_train_py_builds_a_pola_mm_config(
        tmp_path, tool, family, user_config):
    """mmseg's / mmpretrain's shipped ``tools/train.py`` read a user's
    config that lists a ``pola_mm::`` snippet, build the model with the
    snippet's backbone and train one iteration on a tiny synthetic set."""
    snippet, backbone, channels = SNIPPETS[family]
    write(tmp_path / 'my_config.py', user_config.format(snippet=snippet))
    if tool == 'mmseg':
        e2e_data.make_ade(str(tmp_path / 'ade'), num_images=2)
        tiny = SEG_TINY
    else:
        e2e_data.make_image_folder(str(tmp_path / 'images'), per_class=1)
        tiny = CLS_TINY
    cfg = write(tmp_path / 'tiny.py', tiny + NO_FILES)
    proc = run([sys.executable, upstream_tool(tool, 'train.py'), cfg,
                '--work-dir', 'work'], tmp_path)
    out = proc.stdout + proc.stderr
    assert re.search(r'(Iter|Epoch)\(train\).* loss: \d+\.\d+', out), \
        out[-3000:]
    dumped = re.sub(r',([\])])', r'\1', ''.join(  # the config as run
        next((tmp_path / 'work').glob('*/vis_data/config.py'))
        .read_text().split()))
    assert f"type='{backbone}'" in dumped
    assert str(channels).replace(' ', '') in dumped


#: users' configs that inherit a whole shipped config by ``pola_mm::``
COMPLETE_USER = """
_base_ = ['pola_mm::{name}']
model = dict(backbone=dict(init_cfg=None))  # no ImageNet weights here
"""
#: the test's own overrides for mmdet (tiny COCO-style set, one iteration)
DET_TINY = """
_base_ = ['./my_config.py']
dataset = dict(
    data_root='coco', ann_file='annotations.json',
    data_prefix=dict(img='images/'),
    metainfo=dict(classes=('person', 'bicycle', 'car')),
    pipeline=[
        dict(type='LoadImageFromFile'),
        dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
        dict(type='Resize', scale=(64, 64), keep_ratio=True),
        dict(type='PackDetInputs')])
train_dataloader = dict(batch_size=2, num_workers=0,
                        persistent_workers=False, dataset=dataset)
train_cfg = dict(max_epochs=1)
"""


@pytest.mark.parametrize('tool, name', [
    ('mmdet', 'mask_rcnn_pola_swin_t.py'),
    ('mmseg', 'upernet_pola_swin_t_ade20k.py'),
])
def test_train_py_trains_a_complete_config_by_scope(tmp_path, tool, name):
    """mmdet's / mmseg's shipped ``tools/train.py`` train one iteration of
    a user's config that inherits a whole shipped config by ``pola_mm::``
    (the tiny data, image size and iteration count set on top): the
    config's own backbone, and its types built in the codebase's scope
    (mmengine never falls back from a ``'pola_mm'`` scope)."""
    write(tmp_path / 'my_config.py', COMPLETE_USER.format(name=name))
    if tool == 'mmdet':
        e2e_data.make_coco(str(tmp_path / 'coco'), num_images=2, size=64)
        tiny = DET_TINY
    else:
        e2e_data.make_ade(str(tmp_path / 'ade'), num_images=2)
        tiny = SEG_TINY
    cfg = write(tmp_path / 'tiny.py', tiny + NO_FILES)
    proc = run([sys.executable, upstream_tool(tool, 'train.py'), cfg,
                '--work-dir', 'work'], tmp_path)
    out = proc.stdout + proc.stderr
    assert re.search(r'(Iter|Epoch)\(train\).* loss: \d+\.\d+', out), \
        out[-3000:]
    assert 'Failed to search registry with scope' not in out, out[-3000:]
    dumped = re.sub(r',([\])])', r'\1', ''.join(  # the config as run
        next((tmp_path / 'work').glob('*/vis_data/config.py'))
        .read_text().split()))
    assert "type='PolaSwinTransformer'" in dumped
    assert '[96,192,384,768]' in dumped


# -- a regular (non-editable) install -----------------------------------------
def test_wheel_install_carries_the_hook_configs_and_metadata(tmp_path):
    """``pip wheel`` of this checkout, installed into a fresh venv that sees
    the OpenMMLab stack of this one: the wheel holds the hook, the configs
    (real files, not the repository's links) and the mim metadata, and
    mmengine and ``mim search`` work from it as from the editable install."""
    src = copy_source_tree(tmp_path / 'src')
    run([sys.executable, '-m', 'pip', 'wheel', '--no-deps',
         '--no-build-isolation', '-q', '-w', str(tmp_path / 'dist'),
         str(src)], tmp_path)
    wheel = next((tmp_path / 'dist').glob('pola_mm-*.whl'))

    venv = tmp_path / 'venv'
    run([sys.executable, '-m', 'venv', '--without-pip', str(venv)], tmp_path)
    python = str(venv / 'bin' / 'python')
    site = subprocess.run(
        [python, '-c', 'import sysconfig; '
         "print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True).stdout.strip()
    # the OpenMMLab stack of this environment, after the venv's own packages
    with open(osp.join(site, '_stack.pth'), 'w') as f:
        f.write(sysconfig.get_paths()['purelib'] + '\n')
    run([sys.executable, '-m', 'pip', '--python', python, 'install',
         '--no-deps', '--no-index', '-q', str(wheel)], tmp_path)
    assert osp.isfile(osp.join(site, 'pola_mm_startup.pth'))
    package = osp.join(site, 'pola_mm')
    mim_dir = osp.join(package, '.mim')
    for rel in ('configs', 'model-index.yml'):
        assert not osp.islink(osp.join(mim_dir, rel)), rel
    for rel in ('configs/_base_/models/pola_pvt_t_fpn.py',
                'configs/demo/mask_rcnn_pola_swin_shapes.py',
                'configs/pola_swin/metafile.yml', 'model-index.yml'):
        assert osp.isfile(osp.join(mim_dir, rel)), rel

    write(tmp_path / 'my_config.py', '''
        _base_ = ['mmdet::retinanet/retinanet_r50_fpn_1x_coco.py',
                  'pola_mm::_base_/models/pola_pvt_t_fpn.py']
        model = dict(backbone=_base_.pola_backbone, neck=_base_.pola_neck)
        ''')
    write(tmp_path / 'probe.py', PROBE + '''
import pola_mm
print(pola_mm.__file__)
''')
    out = run([python, 'probe.py'], tmp_path).stdout.strip().splitlines()
    assert json.loads(out[-2]) == dict(
        before=[], hooked=True, early=False, registered=True,
        pola_mm_imported=False, result='PolaPVT')
    assert out[-1] == osp.join(package, '__init__.py')

    run([python, '-m', 'mim', 'search', 'pola_mm', '--json', 'search.json'],
        tmp_path)
    table = json.loads((tmp_path / 'search.json').read_text())
    configs = sorted(f'configs/{f}' for f in os.listdir(
        osp.join(REPO, 'configs')) if f.endswith('.py'))
    assert sorted(table['config'].values()) == configs
