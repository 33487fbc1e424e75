"""Every config of the paper's matrix loads, states its recipe, and builds.

35 configs: 8 ImageNet-1k (mmpretrain; the 7 at 224 and the Pola-Swin-B
384 fine-tune), 20 COCO (mmdet), 7 ADE20K (mmseg). Each is read with
``Config.fromfile`` and its full-size model is built on the CPU (no
forward). The recipe values (optimiser, lr, weight decay and its groups,
schedule, drop path, pipelines, heads, images per GPU, ImageNet weights
location) are checked against the tables below: the reference protocol
(LeapLabTHU/Agent-Attention ``downstream/{detection,segmentation}/configs``,
which PolaFormer follows; see docs/protocol.md), which is also the README's
table.
"""
import glob
import os.path as osp

import e2e_data
import pytest
from mmengine.config import Config

CONFIGS = e2e_data.CONFIGS

SWIN = {'t': 'tiny', 's': 'small', 'b': 'base'}
PVT = {'t': 'tiny', 's': 'small', 'm': 'medium', 'l': 'large'}

IN1K = [f'pola_swin_{k}_in1k.py' for k in SWIN] + \
    [f'pola_pvt_{k}_in1k.py' for k in PVT] + ['pola_swin_b_384_in1k.py']

# Drop path of the reference configs (agent_pvt/agent_pvt_*_{rtn,mrcnn}_1x,
# agent_swin/agent_swin_*_{mrcnn,crcnn}_{1x,3x}); where the reference has no
# config (Swin-S Cascade 1x, Swin-B Mask R-CNN, Swin-B Cascade 1x) the
# reference's value for the same backbone (it does not vary with detector or
# schedule there).
RETINA_DPR = {'t': 0.1, 's': 0.1, 'm': 0.2, 'l': 0.3}
MRCNN_PVT_DPR = {'t': 0.1, 's': 0.2, 'm': 0.1, 'l': 0.2}
SWIN_DET_DPR = {'t': 0.1, 's': 0.1, 'b': 0.4}

# name -> (backbone type, arch, lr, weight decay, schedule, images per GPU,
#          drop path)
DET = {}
for k in PVT:
    DET[f'retinanet_pola_pvt_{k}.py'] = (
        'PolaPVT', PVT[k], 1e-4, 1e-4, '1x', 2, RETINA_DPR[k])
    DET[f'mask_rcnn_pola_pvt_{k}.py'] = (
        'PolaPVT', PVT[k], 2e-4, 1e-4, '1x', 2, MRCNN_PVT_DPR[k])
for k in SWIN:
    for det in ('mask_rcnn', 'cascade_mask_rcnn'):
        DET[f'{det}_pola_swin_{k}.py'] = (
            'PolaSwinTransformer', SWIN[k], 1e-4, 0.05, '1x', 2,
            SWIN_DET_DPR[k])
        DET[f'{det}_pola_swin_{k}_3x.py'] = (
            'PolaSwinTransformer', SWIN[k], 1e-4, 0.05, '3x', 2,
            SWIN_DET_DPR[k])

# name -> (backbone type, arch, lr, weight decay, iterations, warm-up iters,
#          poly power, images per GPU, drop path)
SEG = {}
for k, dpr in {'t': 0.1, 's': 0.1, 'm': 0.2, 'l': 0.1}.items():
    SEG[f'sem_fpn_pola_pvt_{k}_ade20k.py'] = (
        'PolaPVT', PVT[k], 2e-4, 1e-4, 40000, 0, 0.9, 2, dpr)
for k, dpr in {'t': 0.3, 's': 0.3, 'b': 0.5}.items():
    SEG[f'upernet_pola_swin_{k}_ade20k.py'] = (
        'PolaSwinTransformer', SWIN[k], 6e-5, 0.01, 160000, 1500, 1.0, 2, dpr)

ALL = IN1K + sorted(DET) + sorted(SEG)

# The reference's Swin paramwise_cfg, less the keys of parameters that
# Pola-Swin does not have (absolute_pos_embed and Agent Attention's own
# an/na/ah/aw/ha/wa biases); its PVT configs have no paramwise_cfg.
SWIN_NO_DECAY_KEYS = {'norm', 'relative_position_bias_table'}


def _load(name: str) -> Config:
    return Config.fromfile(osp.join(CONFIGS, name))


def test_the_matrix_is_complete():
    assert len(ALL) == 35
    present = {osp.basename(p) for p in glob.glob(osp.join(CONFIGS, '*.py'))}
    assert set(ALL) <= present, sorted(set(ALL) - present)


def _pretrained_name(cfg: Config) -> str:
    bb = cfg.model.backbone
    arch = {v: k for k, v in (SWIN if 'Swin' in bb.type else PVT).items()}
    fam = 'swin' if 'Swin' in bb.type else 'pvt'
    return f'checkpoints/pola_{fam}_{arch[bb.arch]}_in1k.pth'


@pytest.mark.slow
@pytest.mark.parametrize('name', sorted(DET))
def test_detection_recipe(name):
    cfg = _load(name)
    bb_type, arch, lr, wd, sched, per_gpu, dpr = DET[name]
    assert cfg.custom_imports == dict(imports=['pola_mm'],
                                      allow_failed_imports=False)
    assert cfg.default_scope == 'mmdet'
    assert cfg.model.backbone.type == bb_type
    assert cfg.model.backbone.arch == arch
    assert cfg.model.backbone.drop_path_rate == dpr
    assert cfg.model.backbone.init_cfg == dict(
        type='Pretrained', checkpoint=_pretrained_name(cfg))
    opt = cfg.optim_wrapper.optimizer
    assert (opt.type, opt.lr, opt.weight_decay) == ('AdamW', lr, wd)
    assert tuple(opt.betas) == (0.9, 0.999)
    assert cfg.optim_wrapper.get('clip_grad') is None
    if bb_type == 'PolaPVT':
        # the reference decays every parameter of the PVT detectors
        assert 'paramwise_cfg' not in cfg.optim_wrapper
    else:
        keys = cfg.optim_wrapper.paramwise_cfg.custom_keys
        assert set(keys) == SWIN_NO_DECAY_KEYS
        assert all(v == dict(decay_mult=0.) for v in keys.values())
        assert set(cfg.optim_wrapper.paramwise_cfg) == {'custom_keys'}
    assert cfg.train_dataloader.batch_size == per_gpu
    assert cfg.auto_scale_lr.base_batch_size == 16
    warm, steps = cfg.param_scheduler
    assert (warm.type, warm.by_epoch, warm.begin, warm.end,
            warm.start_factor) == ('LinearLR', False, 0, 500, 0.001)
    epochs, milestones = (12, [8, 11]) if sched == '1x' else (36, [27, 33])
    assert cfg.train_cfg.type == 'EpochBasedTrainLoop'
    assert cfg.train_cfg.max_epochs == epochs
    assert (steps.type, steps.milestones, steps.end, steps.gamma) == (
        'MultiStepLR', milestones, epochs, 0.1)
    pipeline = cfg.train_dataloader.dataset.pipeline
    types = [t.type for t in pipeline]
    if bb_type == 'PolaSwinTransformer':
        # the reference trains every Swin detector, 1x and 3x, with the
        # DETR-style multi-scale (480-800) + random crop augmentation
        assert types == ['LoadImageFromFile', 'LoadAnnotations', 'RandomFlip',
                         'RandomChoice', 'PackDetInputs']
        ms, crop = pipeline[3].transforms
        scales = [(s, 1333) for s in range(480, 801, 32)]
        assert [t.type for t in ms] == ['RandomChoiceResize']
        assert [tuple(x) for x in ms[0].scales] == scales
        assert [t.type for t in crop] == [
            'RandomChoiceResize', 'RandomCrop', 'RandomChoiceResize']
        assert [tuple(x) for x in crop[0].scales] == [
            (400, 1333), (500, 1333), (600, 1333)]
        assert (crop[1].crop_type, tuple(crop[1].crop_size),
                crop[1].allow_negative_crop) == ('absolute_range', (384, 600),
                                                 True)
        assert [tuple(x) for x in crop[2].scales] == scales
        assert all(t.keep_ratio for t in (ms[0], crop[0], crop[2]))
    else:
        assert types == ['LoadImageFromFile', 'LoadAnnotations', 'Resize',
                         'RandomFlip', 'PackDetInputs']
        assert (tuple(pipeline[2].scale), pipeline[2].keep_ratio) == (
            (1333, 800), True)
    test_types = [t.type for t in cfg.test_dataloader.dataset.pipeline]
    assert 'Resize' in test_types and tuple(
        cfg.test_dataloader.dataset.pipeline[1].scale) == (1333, 800)
    has_mask = 'mask' in name
    assert pipeline[1].get('with_mask', False) == has_mask
    assert cfg.val_evaluator.metric == (['bbox', 'segm'] if has_mask
                                        else 'bbox')
    if name.startswith('cascade'):
        _check_cascade_heads(cfg.model.roi_head.bbox_head)
    elif name.startswith('mask_rcnn'):
        assert cfg.model.roi_head.bbox_head.type == 'Shared2FCBBoxHead'
    else:
        assert cfg.model.neck.start_level == 1
        assert cfg.model.neck.add_extra_convs == 'on_input'


def _check_cascade_heads(heads):
    """The reference's Cascade heads: ConvFCBBoxHead with 4 shared convs +
    1 shared fc (mmdet 3.x: Shared4Conv1FCBBoxHead), SyncBN, decoded boxes
    with GIoU loss (weight 10), class-specific regression."""
    stds = [[0.1, 0.1, 0.2, 0.2], [0.05, 0.05, 0.1, 0.1],
            [0.033, 0.033, 0.067, 0.067]]
    assert len(heads) == 3
    for head, std in zip(heads, stds):
        assert head.type == 'Shared4Conv1FCBBoxHead'
        assert (head.conv_out_channels, head.fc_out_channels) == (256, 1024)
        assert head.norm_cfg == dict(type='SyncBN', requires_grad=True)
        assert head.reg_decoded_bbox is True
        assert head.reg_class_agnostic is False
        assert head.loss_bbox == dict(type='GIoULoss', loss_weight=10.0)
        assert head.loss_cls == dict(type='CrossEntropyLoss',
                                     use_sigmoid=False, loss_weight=1.0)
        assert head.bbox_coder.target_stds == std


@pytest.mark.slow
@pytest.mark.parametrize('name', sorted(SEG))
def test_segmentation_recipe(name):
    cfg = _load(name)
    bb_type, arch, lr, wd, iters, warmup, power, per_gpu, dpr = SEG[name]
    assert cfg.custom_imports == dict(imports=['pola_mm'],
                                      allow_failed_imports=False)
    assert cfg.default_scope == 'mmseg'
    assert cfg.model.backbone.type == bb_type
    assert cfg.model.backbone.arch == arch
    assert cfg.model.backbone.drop_path_rate == dpr
    assert cfg.model.backbone.init_cfg == dict(
        type='Pretrained', checkpoint=_pretrained_name(cfg))
    assert cfg.model.pretrained is None
    assert cfg.model.decode_head.num_classes == 150
    opt = cfg.optim_wrapper.optimizer
    assert (opt.type, opt.lr, opt.weight_decay) == ('AdamW', lr, wd)
    if bb_type == 'PolaPVT':
        # the reference's Semantic FPN decays every parameter
        assert 'paramwise_cfg' not in cfg.optim_wrapper
        assert cfg.model.decode_head.type == 'FPNHead'
    else:
        keys = cfg.optim_wrapper.paramwise_cfg.custom_keys
        assert set(keys) == SWIN_NO_DECAY_KEYS
        assert cfg.model.decode_head.type == 'UPerHead'
        assert cfg.model.auxiliary_head.in_channels == \
            cfg.model.decode_head.in_channels[2]
    assert cfg.train_dataloader.batch_size == per_gpu
    assert cfg.train_cfg.type == 'IterBasedTrainLoop'
    assert cfg.train_cfg.max_iters == iters
    poly = cfg.param_scheduler[-1]
    # mmcv 1.x (the reference) computes poly over all iterations and
    # multiplies the warm-up factor onto it: both schedulers begin at 0
    assert (poly.type, poly.power, poly.eta_min, poly.begin, poly.end,
            poly.by_epoch) == ('PolyLR', power, 0.0, 0, iters, False)
    if warmup:
        warm = cfg.param_scheduler[0]
        assert (warm.type, warm.begin, warm.end, warm.start_factor,
                warm.by_epoch) == ('LinearLR', 0, warmup, 1e-6, False)
    else:
        assert len(cfg.param_scheduler) == 1
    assert cfg.crop_size == (512, 512)
    assert cfg.model.data_preprocessor.size == (512, 512)
    # training: mmseg's ADE20K augmentation (= the reference's ade20k.py)
    train = cfg.train_dataloader.dataset.pipeline
    assert [t.type for t in train] == [
        'LoadImageFromFile', 'LoadAnnotations', 'RandomResize', 'RandomCrop',
        'RandomFlip', 'PhotoMetricDistortion', 'PackSegInputs']
    assert (tuple(train[2].scale), tuple(train[2].ratio_range)) == (
        (2048, 512), (0.5, 2.0))
    assert (tuple(train[3].crop_size), train[3].cat_max_ratio) == (
        (512, 512), 0.75)
    # test: Resize(2048, 512) keeping the ratio, nothing else (in particular
    # no ResizeToMultiple), whole-image inference
    for loader in (cfg.val_dataloader, cfg.test_dataloader):
        test = loader.dataset.pipeline
        assert [t.type for t in test] == [
            'LoadImageFromFile', 'Resize', 'LoadAnnotations', 'PackSegInputs']
        assert tuple(test[1].scale) == (2048, 512) and test[1].keep_ratio
        assert loader.batch_size == 1
    assert cfg.model.test_cfg == dict(mode='whole')


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
    # every no-weight-decay key of the config matches something
    keys = cfg.optim_wrapper.get('paramwise_cfg', {}).get('custom_keys', {})
    for key in keys:
        if key == 'absolute_pos_embed':  # the authors' skip list; none here
            continue
        assert any(key in n for n in params), (
            f'{key} matches no parameter of {name}')
    if name.startswith('cascade'):
        import torch.nn as nn
        for head in model.roi_head.bbox_head:
            assert len(head.shared_convs) == 4 and len(head.shared_fcs) == 1
            assert not head.cls_convs and not head.reg_convs
            assert all(isinstance(conv.bn, nn.SyncBatchNorm)
                       for conv in head.shared_convs)
            assert type(head.loss_bbox).__name__ == 'GIoULoss'
            assert head.reg_decoded_bbox and not head.reg_class_agnostic


def _decay_of_each_parameter(cfg: Config):
    """Build the config's model (tiny backbone of the same type) and its
    optimiser exactly as the Runner does; ``{name: weight decay}``."""
    from mmengine.optim import build_optim_wrapper
    e2e_data.shrink_backbone(cfg)
    if cfg.default_scope == 'mmseg' and 'auxiliary_head' in cfg.model:
        ch = e2e_data.backbone_channels(cfg)
        cfg.model.decode_head.in_channels = ch
        cfg.model.auxiliary_head.in_channels = ch[2]
    elif 'neck' in cfg.model:
        cfg.model.neck.in_channels = e2e_data.backbone_channels(cfg)
    model = _build(cfg)
    optimizer = build_optim_wrapper(model, cfg.optim_wrapper).optimizer
    default = optimizer.defaults['weight_decay']
    decay = {}
    for group in optimizer.param_groups:
        for p in group['params']:
            decay[id(p)] = group.get('weight_decay', default)
    return {n: decay[id(p)] for n, p in model.named_parameters()}


@pytest.mark.slow
@pytest.mark.parametrize('name', [
    'retinanet_pola_pvt_t.py', 'mask_rcnn_pola_pvt_s.py',
    'sem_fpn_pola_pvt_m_ade20k.py', 'mask_rcnn_pola_swin_t.py',
    'cascade_mask_rcnn_pola_swin_s_3x.py', 'upernet_pola_swin_b_ade20k.py'
])
def test_downstream_weight_decay_groups(name):
    """The optimiser the Runner builds decays what the reference decays:
    PVT (no paramwise_cfg) every parameter; Swin all but the parameters whose
    name contains ``norm`` or ``relative_position_bias_table`` -- biases and
    the polarity attention's ``power`` / ``scale`` / ``positional_encoding``
    are decayed."""
    pytest.importorskip('mmdet.models')
    pytest.importorskip('mmseg.models')
    import pola_mm  # noqa: F401
    cfg = _load(name)
    wd = cfg.optim_wrapper.optimizer.weight_decay
    decay = _decay_of_each_parameter(cfg)
    for kind in ('power', 'scale', 'positional_encoding'):
        hits = [n for n in decay if n.startswith('backbone.')
                and n.endswith('attn.' + kind)]
        assert hits, kind
        assert all(decay[n] == wd for n in hits), kind
    for n, d in decay.items():
        if 'Swin' in cfg.model.backbone.type and (
                'norm' in n or 'relative_position_bias_table' in n):
            assert d == 0.0, n
        else:
            assert d == wd, n
    if 'Swin' in cfg.model.backbone.type:
        assert any('relative_position_bias_table' in n for n in decay)
        assert any(n.endswith('.bias') and decay[n] == wd for n in decay)
    else:
        assert any(n.startswith('backbone.pos_embed') for n in decay)


def _scheduled_lrs(cfg: Config, iters: int):
    """The lr of every iteration under the config's param_scheduler, built
    and stepped as mmengine's ParamSchedulerHook does (iteration-based)."""
    import torch
    from mmengine.optim.scheduler import LinearLR, PolyLR
    kinds = dict(LinearLR=LinearLR, PolyLR=PolyLR)
    lr = cfg.optim_wrapper.optimizer.lr
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    scheds = []
    for c in cfg.param_scheduler:
        c = dict(c)
        scheds.append(kinds[c.pop('type')](opt, **c))
    out = []
    for _ in range(iters):
        out.append(opt.param_groups[0]['lr'])
        for s in scheds:
            s.step()
    return out


def test_upernet_lr_is_mmcv_1x_poly_with_warmup():
    """The reference's lr (mmcv 1.x PolyLrUpdaterHook, linear warm-up):
    ``lr0 * (1 - t / T) ** 1.0 * (r + (1 - r) * t / w)`` for t < w, the poly
    term alone after; T 160k, w 1500, r 1e-6. mmengine's schedulers reach
    their end value at their last step (t / (w - 1), t / (T - 1)): that is
    the only difference, < 1 / (w - 1) relative during the warm-up and
    < lr0 / T absolute after it (a schedule that starts the poly after the
    warm-up, as mmseg 1.x's Swin configs, is ~1 % off mid-training)."""
    cfg = _load('upernet_pola_swin_t_ade20k.py')
    lr0, T, w, r = 6e-5, 160000, 1500, 1e-6
    lrs = _scheduled_lrs(cfg, T)
    for t in list(range(0, 3000, 7)) + list(range(3000, T, 997)) + [T - 1]:
        want = lr0 * (1 - t / T)
        if t < w:
            want *= r + (1 - r) * t / w
            assert abs(lrs[t] - want) <= want / (w - 1) + 1e-15, t
        else:
            assert abs(lrs[t] - want) <= lr0 / T, t
    mid = lr0 * (1 - 80000 / T)
    assert lrs[80000] == pytest.approx(mid, rel=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize('name', [
    'retinanet_pola_pvt_t.py', 'mask_rcnn_pola_swin_t.py',
    'mask_rcnn_pola_swin_t_3x.py', 'cascade_mask_rcnn_pola_swin_t.py',
    'sem_fpn_pola_pvt_t_ade20k.py', 'upernet_pola_swin_t_ade20k.py'
])
def test_training_pipeline_runs(name, tmp_path):
    """The configs' own training augmentation (incl. the Swin recipe's
    multi-scale + random crop, 1x and 3x) runs on a synthetic sample and
    yields the stated sizes."""
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
              for i in range(8)]
    if cfg.default_scope == 'mmseg':
        assert all(max(s) <= 512 for s in shapes), shapes
    elif 'swin' in name:
        # short side 480-800 after the final multi-scale resize, or less
        # where the long side hit 1333
        assert all(min(s) <= 800 and max(s) <= 1333 for s in shapes), shapes
        assert len({min(s) for s in shapes}) > 1, shapes  # multi-scale
    else:
        assert all(s == (800, 800) for s in shapes), shapes  # 1333x800
