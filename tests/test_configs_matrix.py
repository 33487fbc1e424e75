"""Every config of the paper's matrix loads, states its recipe, and builds.

34 configs: 7 ImageNet-1k (mmpretrain), 20 COCO (mmdet), 7 ADE20K (mmseg).
Each is read with ``Config.fromfile`` and its full-size model is built on the
CPU (no forward). The recipe values (optimiser, lr, weight decay, schedule,
images per GPU, ImageNet weights location) are checked against the table
below, which is also the README's table.
"""
import glob
import os.path as osp

import pytest
from mmengine.config import Config

import e2e_data

CONFIGS = e2e_data.CONFIGS

SWIN = {'t': 'tiny', 's': 'small', 'b': 'base'}
PVT = {'t': 'tiny', 's': 'small', 'm': 'medium', 'l': 'large'}

IN1K = [f'pola_swin_{k}_in1k.py' for k in SWIN] + \
    [f'pola_pvt_{k}_in1k.py' for k in PVT]

# name -> (backbone type, arch, lr, weight decay, schedule, images per GPU)
DET = {}
for k in PVT:
    DET[f'retinanet_pola_pvt_{k}.py'] = (
        'PolaPVT', PVT[k], 1e-4, 1e-4, '1x', 2)
    DET[f'mask_rcnn_pola_pvt_{k}.py'] = (
        'PolaPVT', PVT[k], 2e-4, 1e-4, '1x', 2)
for k in SWIN:
    for det in ('mask_rcnn', 'cascade_mask_rcnn'):
        DET[f'{det}_pola_swin_{k}.py'] = (
            'PolaSwinTransformer', SWIN[k], 1e-4, 0.05, '1x', 2)
        DET[f'{det}_pola_swin_{k}_3x.py'] = (
            'PolaSwinTransformer', SWIN[k], 1e-4, 0.05, '3x', 2)

# name -> (backbone type, arch, lr, weight decay, iterations, warm-up iters,
#          poly power, images per GPU)
SEG = {}
for k in PVT:
    SEG[f'sem_fpn_pola_pvt_{k}_ade20k.py'] = (
        'PolaPVT', PVT[k], 2e-4, 1e-4, 40000, 0, 0.9, 4)
for k in SWIN:
    SEG[f'upernet_pola_swin_{k}_ade20k.py'] = (
        'PolaSwinTransformer', SWIN[k], 6e-5, 0.01, 160000, 1500, 1.0, 2)

ALL = IN1K + sorted(DET) + sorted(SEG)

NO_DECAY_KEYS = {'norm', '.pos_embed', '.positional_encoding',
                 '.relative_position_bias_table', '.power', 'attn.scale'}


def _load(name: str) -> Config:
    return Config.fromfile(osp.join(CONFIGS, name))


def test_the_matrix_is_complete():
    assert len(ALL) == 34
    present = {osp.basename(p) for p in glob.glob(osp.join(CONFIGS, '*.py'))}
    assert set(ALL) <= present, sorted(set(ALL) - present)


def _pretrained_name(cfg: Config) -> str:
    bb = cfg.model.backbone
    arch = {v: k for k, v in (SWIN if 'Swin' in bb.type else PVT).items()}
    fam = 'swin' if 'Swin' in bb.type else 'pvt'
    return f'checkpoints/pola_{fam}_{arch[bb.arch]}_in1k.pth'


@pytest.mark.parametrize('name', sorted(DET))
def test_detection_recipe(name):
    cfg = _load(name)
    bb_type, arch, lr, wd, sched, per_gpu = DET[name]
    assert cfg.custom_imports == dict(imports=['pola_mm'],
                                      allow_failed_imports=False)
    assert cfg.default_scope == 'mmdet'
    assert cfg.model.backbone.type == bb_type
    assert cfg.model.backbone.arch == arch
    assert cfg.model.backbone.init_cfg == dict(
        type='Pretrained', checkpoint=_pretrained_name(cfg))
    opt = cfg.optim_wrapper.optimizer
    assert (opt.type, opt.lr, opt.weight_decay) == ('AdamW', lr, wd)
    assert set(cfg.optim_wrapper.paramwise_cfg.custom_keys) == NO_DECAY_KEYS
    assert all(v == dict(decay_mult=0.) for v in
               cfg.optim_wrapper.paramwise_cfg.custom_keys.values())
    assert cfg.train_dataloader.batch_size == per_gpu
    assert cfg.auto_scale_lr.base_batch_size == 16
    warm, steps = cfg.param_scheduler
    assert (warm.type, warm.by_epoch, warm.begin, warm.end) == (
        'LinearLR', False, 0, 500)
    epochs, milestones = (12, [8, 11]) if sched == '1x' else (36, [27, 33])
    assert cfg.train_cfg.type == 'EpochBasedTrainLoop'
    assert cfg.train_cfg.max_epochs == epochs
    assert (steps.type, steps.milestones, steps.end) == (
        'MultiStepLR', milestones, epochs)
    pipeline = [t.type for t in cfg.train_dataloader.dataset.pipeline]
    if sched == '3x':
        choice = cfg.train_dataloader.dataset.pipeline[3]
        assert choice.type == 'RandomChoice'
        sizes = {s[0] for s in choice.transforms[0][0].scales}
        assert min(sizes) == 480 and max(sizes) == 800
        assert choice.transforms[1][1].type == 'RandomCrop'
    else:
        assert 'Resize' in pipeline and 'RandomChoice' not in pipeline
    has_mask = 'mask' in name
    assert cfg.train_dataloader.dataset.pipeline[1].get('with_mask',
                                                        False) == has_mask
    assert cfg.val_evaluator.metric == (['bbox', 'segm'] if has_mask
                                        else 'bbox')


@pytest.mark.parametrize('name', sorted(SEG))
def test_segmentation_recipe(name):
    cfg = _load(name)
    bb_type, arch, lr, wd, iters, warmup, power, per_gpu = SEG[name]
    assert cfg.custom_imports == dict(imports=['pola_mm'],
                                      allow_failed_imports=False)
    assert cfg.default_scope == 'mmseg'
    assert cfg.model.backbone.type == bb_type
    assert cfg.model.backbone.arch == arch
    assert cfg.model.backbone.init_cfg == dict(
        type='Pretrained', checkpoint=_pretrained_name(cfg))
    assert cfg.model.pretrained is None
    assert cfg.model.decode_head.num_classes == 150
    opt = cfg.optim_wrapper.optimizer
    assert (opt.type, opt.lr, opt.weight_decay) == ('AdamW', lr, wd)
    assert set(cfg.optim_wrapper.paramwise_cfg.custom_keys) == NO_DECAY_KEYS
    assert cfg.train_dataloader.batch_size == per_gpu
    assert cfg.train_cfg.type == 'IterBasedTrainLoop'
    assert cfg.train_cfg.max_iters == iters
    poly = cfg.param_scheduler[-1]
    assert (poly.type, poly.power, poly.end, poly.begin) == (
        'PolyLR', power, iters, warmup)
    if warmup:
        warm = cfg.param_scheduler[0]
        assert (warm.type, warm.end) == ('LinearLR', warmup)
    else:
        assert len(cfg.param_scheduler) == 1
    assert cfg.crop_size == (512, 512)
    assert cfg.model.data_preprocessor.size == (512, 512)


def _build(cfg: Config):
    from mmengine.registry import init_default_scope
    init_default_scope(cfg.default_scope)
    scope = __import__(f'{cfg.default_scope}.registry',
                       fromlist=['MODELS'])
    return scope.MODELS.build(cfg.model)


@pytest.mark.parametrize('name', ALL)
def test_config_builds_its_model(name):
    pytest.importorskip('mmdet.models')
    pytest.importorskip('mmseg.models')
    pytest.importorskip('mmpretrain.models')
    import pola_mm  # noqa: F401
    cfg = _load(name)
    model = _build(cfg)
    params = dict(model.named_parameters())
    assert params
    # the backbone the config names, at the size it names
    assert type(model.backbone).__name__ == cfg.model.backbone.type
    # every no-weight-decay key of the config matches something, and
    # ``power`` / ``scale`` only the backbone's attention
    keys = cfg.optim_wrapper.get('paramwise_cfg', {}).get('custom_keys', {})
    for key in keys:
        hits = [n for n in params if key in n]
        if key in ('.power', 'attn.scale', '.positional_encoding'):
            assert hits, f'{key} matches no parameter of {name}'
            assert all(n.startswith('backbone.') for n in hits), hits


@pytest.mark.parametrize('name', ['mask_rcnn_pola_pvt_t.py',
                                  'upernet_pola_swin_t_ade20k.py'])
def test_missing_weights_give_one_clear_message(name, tmp_path, monkeypatch):
    """No ImageNet file at the documented place: FileNotFoundError naming
    the path, raised when the weights are loaded (``init_weights``)."""
    pytest.importorskip('mmdet.models')
    pytest.importorskip('mmseg.models')
    import pola_mm  # noqa: F401
    monkeypatch.chdir(tmp_path)  # no checkpoints/ folder here
    cfg = _load(name)
    model = _build(cfg)
    with pytest.raises(FileNotFoundError) as info:
        model.init_weights()
    assert cfg.model.backbone.init_cfg.checkpoint in str(info.value)


@pytest.mark.parametrize('name', [
    'retinanet_pola_pvt_t.py', 'mask_rcnn_pola_swin_t.py',
    'mask_rcnn_pola_swin_t_3x.py', 'sem_fpn_pola_pvt_t_ade20k.py',
    'upernet_pola_swin_t_ade20k.py'
])
def test_training_pipeline_runs(name, tmp_path):
    """The configs' own training augmentation (incl. the 3x multi-scale +
    random crop) runs on a synthetic sample and yields the stated sizes."""
    pytest.importorskip('mmdet.datasets')
    pytest.importorskip('mmseg.datasets')
    import numpy as np
    from mmengine.registry import init_default_scope
    cfg = _load(name)
    init_default_scope(cfg.default_scope)
    ds_cfg = cfg.train_dataloader.dataset
    if cfg.default_scope == 'mmdet':
        data = e2e_data.make_coco(str(tmp_path), num_images=2, size=160)
        ds_cfg.update(data_root=data['data_root'], ann_file=data['ann_file'],
                      data_prefix=dict(img=data['img_prefix']),
                      metainfo=dict(classes=e2e_data.COCO_NAMES))
        from mmdet.registry import DATASETS
    else:
        data = e2e_data.make_ade(str(tmp_path), num_images=2, size=96)
        ds_cfg.update(data_root=data['data_root'])
        from mmseg.registry import DATASETS
    dataset = DATASETS.build(ds_cfg)
    np.random.seed(0)
    shapes = [tuple(dataset[i % len(dataset)]['inputs'].shape[1:])
              for i in range(6)]
    if cfg.default_scope == 'mmseg':
        assert all(max(s) <= 512 for s in shapes), shapes
    elif name.endswith('_3x.py'):
        # short side 480-800 after the final multi-scale resize, or less
        # where the long side hit 1333
        assert all(min(s) <= 800 and max(s) <= 1333 for s in shapes), shapes
        assert len({min(s) for s in shapes}) > 1, shapes  # multi-scale
    else:
        assert all(s == (800, 800) for s in shapes), shapes  # 1333x800
