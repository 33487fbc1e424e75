"""``pola_mm::`` snippets in a user's own config, outside the repository.

The config is written into ``tmp_path`` and read with that folder as the
working directory: ``pola_mm::_base_/...`` must resolve through the installed
package (``pola_mm/.mim/configs``), next to an ``mmdet::`` / ``mmseg::`` base.
"""
import os.path as osp
import textwrap

import e2e_data
import pytest
import torch
from mmengine.config import Config

import pola_mm  # noqa: F401  (as tools/train.py: registers the pola_mm scope)

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

SWIN_T_CH = [96, 192, 384, 768]
SNIPPETS = {
    'pola_swin_t_fpn.py': ('PolaSwinTransformer', 'tiny', SWIN_T_CH),
    'pola_swin_s_fpn.py': ('PolaSwinTransformer', 'small', SWIN_T_CH),
    'pola_swin_b_fpn.py': ('PolaSwinTransformer', 'base',
                           [128, 256, 512, 1024]),
    'pola_pvt_t_fpn.py': ('PolaPVT', 'tiny', [64, 128, 320, 512]),
    'pola_pvt_s_fpn.py': ('PolaPVT', 'small', [64, 128, 320, 512]),
    'pola_pvt_m_fpn.py': ('PolaPVT', 'medium', [64, 128, 320, 512]),
    'pola_pvt_l_fpn.py': ('PolaPVT', 'large', [64, 128, 320, 512]),
}

MMDET_USER_CFG = '''
_base_ = ['mmdet::{base}',
          'pola_mm::_base_/models/{snippet}']
model = dict(backbone=_base_.pola_backbone, neck=_base_.pola_neck)
'''


def _write(tmp_path, text: str, name: str = 'my_config.py') -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_importing_pola_mm_registers_the_config_scope():
    from mmengine.config import config as config_module
    from mmengine.config.utils import MODULE2PACKAGE
    assert 'pola_mm' in MODULE2PACKAGE, (
        'import pola_mm must run pola_mm.mim_scope.register_config_scope() '
        '(pola_mm/__init__.py: from . import mim_scope)')
    assert config_module.get_installed_path('pola_mm') == \
        osp.dirname(pola_mm.__file__)


def test_every_snippet_is_in_the_package():
    snippet_dir = osp.join(osp.dirname(pola_mm.__file__), '.mim', 'configs',
                           '_base_', 'models')
    for name in SNIPPETS:
        assert osp.isfile(osp.join(snippet_dir, name)), name


@pytest.mark.parametrize('snippet', sorted(SNIPPETS))
def test_snippet_over_mmdet_base_resolves_anywhere(snippet, tmp_path,
                                                   monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = _write(tmp_path, MMDET_USER_CFG.format(
        base='mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py', snippet=snippet))
    cfg = Config.fromfile(osp.basename(path))
    bb_type, arch, channels = SNIPPETS[snippet]
    assert cfg.model.type == 'MaskRCNN'
    assert cfg.model.backbone.type == bb_type
    assert cfg.model.backbone.arch == arch
    assert 'depth' not in cfg.model.backbone  # ResNet's settings are gone
    assert cfg.model.neck.type == 'FPN'
    assert cfg.model.neck.in_channels == channels
    assert cfg.custom_imports.imports == ['pola_mm']
    # read from the installed package, not from a path relative to here
    assert osp.join('.mim', 'configs', '_base_', 'models', snippet) in cfg.text


def test_snippet_weights_location_follows_pola_pretrained(tmp_path,
                                                          monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = _write(tmp_path, MMDET_USER_CFG.format(
        base='retinanet/retinanet_r50_fpn_1x_coco.py',
        snippet='pola_pvt_s_fpn.py'))
    cfg = Config.fromfile(path)
    assert cfg.model.backbone.init_cfg == dict(
        type='Pretrained', checkpoint='checkpoints/pola_pvt_s_in1k.pth')
    monkeypatch.setenv('POLA_PRETRAINED', '/weights/pola')
    cfg = Config.fromfile(path)
    assert cfg.model.backbone.init_cfg.checkpoint == \
        '/weights/pola/pola_pvt_s_in1k.pth'


def test_external_mmdet_config_builds_and_trains(tmp_path, monkeypatch):
    """A user's Mask R-CNN config from snippets trains and evaluates."""
    pytest.importorskip('mmdet.models')
    from mmengine.runner import Runner
    monkeypatch.chdir(tmp_path)
    path = _write(tmp_path, MMDET_USER_CFG.format(
        base='mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py',
        snippet='pola_swin_t_fpn.py'))
    data = e2e_data.make_coco(str(tmp_path / 'coco'), num_images=4)
    cfg = e2e_data.tiny_det(Config.fromfile(path), data,
                            str(tmp_path / 'work'), epochs=1)
    cfg.model.test_cfg.rcnn.score_thr = 0.0  # 2 iterations: keep every box
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        runner = Runner.from_cfg(cfg)
        runner.train()
        metrics = runner.test()
    finally:
        torch.set_num_threads(threads)
    assert type(runner.model.backbone).__name__ == 'PolaSwinTransformer'
    assert 'coco/bbox_mAP' in metrics and 'coco/segm_mAP' in metrics
    assert osp.isfile(tmp_path / 'work' / 'epoch_1.pth')


def test_external_mmseg_upernet_config_builds(tmp_path, monkeypatch):
    """The UperNet usage documented in the snippet builds its model."""
    pytest.importorskip('mmseg.models')
    monkeypatch.chdir(tmp_path)
    path = _write(tmp_path, '''
        _base_ = ['mmseg::_base_/models/upernet_swin.py',
                  'pola_mm::_base_/models/pola_swin_t_fpn.py']
        model = dict(
            backbone=dict(_base_.pola_backbone, init_cfg=None),
            decode_head=dict(in_channels=_base_.pola_channels),
            auxiliary_head=dict(in_channels=_base_.pola_channels[2]))
        ''')
    cfg = Config.fromfile(path)
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS
    init_default_scope('mmseg')
    model = MODELS.build(cfg.model)
    assert type(model.backbone).__name__ == 'PolaSwinTransformer'
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        feats = model.extract_feat(x)
    assert [f.shape[1] for f in feats] == [96, 192, 384, 768]


#: snippet -> (the family's COCO config, its ADE20K config): the snippet's
#: optimisers must be exactly theirs
TRAINING_TWINS = {
    'pola_swin_t_fpn.py': ('mask_rcnn_pola_swin_t.py',
                           'upernet_pola_swin_t_ade20k.py'),
    'pola_swin_b_fpn.py': ('cascade_mask_rcnn_pola_swin_b.py',
                           'upernet_pola_swin_b_ade20k.py'),
    'pola_pvt_t_fpn.py': ('mask_rcnn_pola_pvt_t.py',
                          'sem_fpn_pola_pvt_t_ade20k.py'),
    'pola_pvt_l_fpn.py': ('mask_rcnn_pola_pvt_l.py',
                          'sem_fpn_pola_pvt_l_ade20k.py'),
    'polapp_b3_fpn.py': ('mask_rcnn_polapp_b3.py',
                         'upernet_polapp_b3_ade20k.py'),
}


def _optimiser(wrapper: dict) -> dict:
    """What the optimiser does: its settings and the paramwise rules (the
    wrapper type aside: the PolaPP detectors train with fp16 on GPUs)."""
    wrapper = Config(dict(w=wrapper)).to_dict()['w']
    return dict(optimizer=wrapper['optimizer'],
                paramwise_cfg=wrapper.get('paramwise_cfg'),
                clip_grad=wrapper.get('clip_grad'))


@pytest.mark.parametrize('snippet', sorted(TRAINING_TWINS))
def test_snippet_carries_its_family_training_settings(snippet):
    """``pola_optim_wrapper`` / ``pola_seg_optim_wrapper`` are the optimisers
    of the family's own COCO / ADE20K configs (the reference's), replace an
    upstream optimiser (``_delete_``), and ``pola_custom_hooks`` holds the
    NaN / Inf stop."""
    cfg = Config.fromfile(osp.join(e2e_data.CONFIGS, '_base_', 'models',
                                   snippet))
    det, seg = (Config.fromfile(osp.join(e2e_data.CONFIGS, name))
                for name in TRAINING_TWINS[snippet])
    assert cfg.pola_optim_wrapper['_delete_'] is True
    assert cfg.pola_seg_optim_wrapper['_delete_'] is True
    assert cfg.pola_optim_wrapper.type == 'OptimWrapper'
    assert _optimiser(cfg.pola_optim_wrapper) == _optimiser(det.optim_wrapper)
    assert _optimiser(cfg.pola_seg_optim_wrapper) == \
        _optimiser(seg.optim_wrapper)
    assert cfg.pola_optim_wrapper.optimizer.type == 'AdamW'
    assert [h['type'] for h in cfg.pola_custom_hooks] == ['InvalidLossHook']


def test_snippet_optimiser_replaces_the_upstream_sgd(tmp_path, monkeypatch):
    """Over mmdet's R50 Mask R-CNN (SGD lr 0.02, momentum 0.9) the README's
    lines give exactly the snippet's AdamW: nothing of SGD is left."""
    monkeypatch.chdir(tmp_path)
    path = _write(tmp_path, MMDET_USER_CFG.format(
        base='mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py',
        snippet='pola_pvt_t_fpn.py') +
        'optim_wrapper = _base_.pola_optim_wrapper\n'
        'custom_hooks = _base_.pola_custom_hooks\n')
    cfg = Config.fromfile(path)
    wrapper = cfg.optim_wrapper.to_dict()
    # the snippet names the scope of its types (mmengine's): no registry
    # fallback warning under the upstream tools
    assert wrapper.pop('_scope_') == 'mmengine'
    assert wrapper == dict(
        type='OptimWrapper',
        optimizer=dict(type='AdamW', lr=2e-4, betas=(0.9, 0.999),
                       weight_decay=1e-4))
    assert [h['type'] for h in cfg.custom_hooks] == ['InvalidLossHook']
