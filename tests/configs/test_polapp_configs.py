"""The PolaFormer++ configs state the authors' recipes, build, and train.

The configs of ``configs/*polapp*`` and the two PaCS examples
(``pola_swin_t_pacs_in1k.py``, ``mask_rcnn_pola_swin_t_pacs.py``). The
values below restate the authors' public sources (ZacharyMeng/PolaFormerPP:
``downstream/detection/configs/PolaPP/*.py`` over their mmdet 2.x bases,
``downstream/segmentation/configs/PolaPP/polapp_b{1,2,3}.py`` over their
mmseg 0.x bases, ``run.sh``; see docs/protocol.md, section PolaFormer++):

* every detector: AdamW lr 1e-4, 2 images per GPU x 8 GPUs, 1x = 12 epochs
  (steps 8, 11), 3x = 36 epochs (steps 27, 33), 500-iteration warm-up from
  0.001, fp16 with a static loss scale of 512 (mmcv 1.x
  ``Fp16OptimizerHook``'s default, ``fp16 = dict()``), the backbone's own
  drop path; Mask R-CNN weight decay 0.05 except names containing ``norm``,
  1x single scale, 3x multi-scale + crop; RetinaNet weight decay 1e-4 on
  everything, FPN from stage 2;
* segmentation: LightHamHead (512 channels, NMF R 16, GroupNorm 32) on
  stages 2-4, AdamW lr 6e-5 (x10 on the head), weight decay 0.01 except
  ``norm``, poly 1.0 with a 1500-iteration warm-up from 1e-6, 160k
  iterations, 8 images per GPU x 8 GPUs, test resize to 2048x512 then to a
  multiple of 32, the backbone's BatchNorms in eval mode.

The full-size backbones must have the parameter count of the authors' model
definitions (their ``PolaPP_b*`` built outside this repository: the numbers
below), and one config of each task family trains on synthetic data.
"""
import copy
import functools
import glob
import math
import os.path as osp
from typing import Dict, List

import e2e_data
import pytest
import torch
from helpers import PVT_TINY
from mmengine.config import Config

import pola_mm  # noqa: F401  (registers PolaPP and the pola_mm:: scope)

CONFIGS = e2e_data.CONFIGS

# arch -> (embed dims, the authors' drop path)
ARCH = {
    'b0': ([32, 64, 128, 384], 0.1),
    'b1': ([32, 64, 192, 384], 0.1),
    'b2': ([64, 128, 256, 512], 0.1),
    'b3': ([64, 128, 320, 512], 0.15),
    'b4': ([96, 192, 384, 512], 0.4),
    'b5': ([96, 192, 448, 640], 0.55),
}
# Parameters of the authors' downstream ``PolaPP_b*`` (all four
# ``extra_norms``), counted by building their class with torch + timm (b0,
# which has no downstream config of theirs: their downstream class with
# POLA_b0's arch).
AUTHORS_BACKBONE_PARAMS = {
    'b0': 4_708_352, 'b1': 6_387_264, 'b2': 13_348_864, 'b3': 24_044_224,
    'b4': 46_697_440,
    'b5': 93_568_672,
}
# Parameters of the authors' ImageNet classifiers ``POLA_b*``
# (polaformer++/models/pola.py, 1000 classes), counted by building their
# class with torch + timm.
AUTHORS_CLASSIFIER_PARAMS = {
    'b0': 7_548_712, 'b1': 9_227_496, 'b2': 16_450_664, 'b3': 27_145_896,
    'b4': 49_798_792,
    'b5': 97_773_000,
}

# name -> (arch, detector, schedule)
DET = {f'mask_rcnn_polapp_{k}.py': (k, 'mask_rcnn', '1x')
       for k in ('b2', 'b3', 'b4', 'b5')}
DET.update({f'mask_rcnn_polapp_{k}_3x.py': (k, 'mask_rcnn', '3x')
            for k in ('b2', 'b3', 'b4')})
DET.update({f'retinanet_polapp_{k}.py': (k, 'retinanet', '1x')
            for k in ('b2', 'b3')})
# the authors' PolaPP_cas_rcnn.py base, with their Mask R-CNN b3 1x recipe
DET['cascade_mask_rcnn_polapp_b3.py'] = ('b3', 'cascade', '1x')
SEG = {f'ham_polapp_{k}_ade20k.py': k for k in ('b1', 'b2', 'b3')}
PACS = ['pola_swin_t_pacs_in1k.py', 'mask_rcnn_pola_swin_t_pacs.py']
# PolaPP under the PolaFormer (Pola-Swin) ADE20K protocol: build test only
UPERNET = ['upernet_polapp_b3_ade20k.py']
SNIPPETS = [f'_base_/models/polapp_{k}_fpn.py' for k in ARCH]

IN1K = [f'polapp_{k}_in1k.py' for k in ARCH]

ALL = sorted(DET) + sorted(SEG) + IN1K + PACS + UPERNET

# A tiny PolaPP with layer scale (so ``gamma_*`` exist), for the optimiser
# and training tests.
POLAPP_TINY = dict(PVT_TINY, layer_scale_init=(1., 1., 1e-6, 1e-6))


# ------------------------------------------------------------ loading, fast

def _metainfo_index(package_path: str) -> Dict[str, dict]:
    """mmengine's lookup table of a package's named configs (what
    ``mmengine.config.utils._get_cfg_metainfo`` rebuilds from ~400 metafiles
    on every ``mmdet::`` base, ~1 s each time), built once per package."""
    from mmengine.fileio import load
    index = load(osp.join(package_path, '.mim', 'model-index.yml'))
    table: Dict[str, dict] = {}
    for meta in index['Import']:
        for model in load(osp.join(package_path, '.mim',
                                   meta)).get('Models', []):
            if 'Config' in model:
                table.setdefault(model['Config'].partition('/')[-1], model)
    return table


@pytest.fixture(autouse=True, scope='module')
def fast_external_bases():
    """Same answers as mmengine's ``_get_cfg_metainfo``, parsed once."""
    from mmengine.config import utils
    original = utils._get_cfg_metainfo
    cached = functools.lru_cache(maxsize=None)(_metainfo_index)

    def lookup(package_path: str, cfg_path: str) -> dict:
        table = cached(package_path)
        if cfg_path not in table:
            raise ValueError(f'{cfg_path} is not a named config')
        return table[cfg_path]

    utils._get_cfg_metainfo = lookup
    yield
    utils._get_cfg_metainfo = original


@functools.lru_cache(maxsize=None)
def _load_once(name: str) -> Config:
    return Config.fromfile(osp.join(CONFIGS, name))


def _load(name: str) -> Config:
    """``configs/<name>``, read once per module; a private copy."""
    return copy.deepcopy(_load_once(name))


def _pretrained(arch: str) -> str:
    return f'checkpoints/polapp_{arch}_in1k.pth'


def test_the_polapp_matrix_is_complete():
    present = {osp.relpath(p, CONFIGS)
               for p in glob.glob(osp.join(CONFIGS, '**', '*.py'),
                                  recursive=True)}
    wanted = set(ALL) | set(SNIPPETS)
    assert wanted <= present, sorted(wanted - present)
    # and nothing named polapp that the tests here do not check
    extra = {p for p in present if 'polapp' in osp.basename(p)
             and not p.startswith('_base_/')} - set(ALL)
    assert not extra, sorted(extra)


@pytest.mark.parametrize('snippet', SNIPPETS)
def test_snippet(snippet):
    arch = snippet.split('_')[-2]
    channels, dpr = ARCH[arch]
    cfg = _load(snippet)
    assert cfg.custom_imports == dict(imports=['pola_mm'],
                                      allow_failed_imports=False)
    assert cfg.pola_channels == channels
    assert cfg.pola_neck == dict(in_channels=channels)
    bb = cfg.pola_backbone
    assert (bb._delete_, bb.type, bb.arch, bb.drop_path_rate) == (
        True, 'PolaPP', arch, dpr)
    assert tuple(bb.out_indices) == (0, 1, 2, 3)
    assert (bb.frozen_stages, bb.norm_eval, bb.with_cp) == (-1, True, False)
    assert bb.init_cfg == dict(type='Pretrained',
                               checkpoint=_pretrained(arch))


def test_snippet_resolves_from_the_package(tmp_path, monkeypatch):
    """``pola_mm::_base_/models/polapp_*_fpn.py`` next to an upstream base
    in a user's config outside the repository (as the README shows)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / 'my_retinanet.py').write_text(
        "_base_ = ['mmdet::retinanet/retinanet_r50_fpn_1x_coco.py',\n"
        "          'pola_mm::_base_/models/polapp_b2_fpn.py']\n"
        "model = dict(backbone=_base_.pola_backbone,\n"
        "             neck=dict(in_channels=_base_.pola_channels))\n")
    cfg = Config.fromfile('my_retinanet.py')
    assert (cfg.model.backbone.type, cfg.model.backbone.arch) == ('PolaPP',
                                                                  'b2')
    assert 'depth' not in cfg.model.backbone  # ResNet's settings are gone
    assert cfg.model.neck.in_channels == ARCH['b2'][0]
    assert osp.join('.mim', 'configs', '_base_', 'models',
                    'polapp_b2_fpn.py') in cfg.text


# ------------------------------------------------------------------ recipes

def _check_schedule(cfg: Config, sched: str) -> None:
    warm, steps = cfg.param_scheduler
    assert (warm.type, warm.by_epoch, warm.begin, warm.end,
            warm.start_factor) == ('LinearLR', False, 0, 500, 0.001)
    epochs, milestones = (12, [8, 11]) if sched == '1x' else (36, [27, 33])
    assert cfg.train_cfg.type == 'EpochBasedTrainLoop'
    assert cfg.train_cfg.max_epochs == epochs
    assert (steps.type, steps.by_epoch, steps.milestones, steps.end,
            steps.gamma) == ('MultiStepLR', True, milestones, epochs, 0.1)


@pytest.mark.parametrize('name', sorted(DET))
def test_detection_recipe(name):
    arch, det, sched = DET[name]
    channels, dpr = ARCH[arch]
    cfg = _load(name)
    assert cfg.custom_imports.imports == ['pola_mm']
    assert cfg.default_scope == 'mmdet'
    bb = cfg.model.backbone
    assert (bb.type, bb.arch, bb.drop_path_rate) == ('PolaPP', arch, dpr)
    assert '_delete_' not in bb and 'depth' not in bb  # ResNet is gone
    # the authors' detection backbone never applies its norm_eval: the stem
    # and downsampling BatchNorms train
    assert bb.norm_eval is False and bb.frozen_stages == -1
    assert bb.init_cfg == dict(type='Pretrained',
                               checkpoint=_pretrained(arch))
    ow = cfg.optim_wrapper
    # fp16 = dict(): mmcv 1.x Fp16OptimizerHook, static loss scale 512
    assert (ow.type, ow.loss_scale) == ('AmpOptimWrapper', 512.)
    assert ow.get('clip_grad') is None
    opt = ow.optimizer
    assert (opt.type, opt.lr, tuple(opt.betas)) == ('AdamW', 1e-4,
                                                    (0.9, 0.999))
    assert cfg.train_dataloader.batch_size == 2
    assert cfg.auto_scale_lr == dict(enable=False, base_batch_size=16)
    _check_schedule(cfg, sched)
    pipeline = cfg.train_dataloader.dataset.pipeline
    types = [t.type for t in pipeline]
    if sched == '1x':  # the authors' coco_instance / coco_detection
        assert types == ['LoadImageFromFile', 'LoadAnnotations', 'Resize',
                         'RandomFlip', 'PackDetInputs']
        assert (tuple(pipeline[2].scale), pipeline[2].keep_ratio) == (
            (1333, 800), True)
        assert pipeline[3].prob == 0.5
    else:  # their 3x AutoAugment: multi-scale, or resize + crop + resize
        assert types == ['LoadImageFromFile', 'LoadAnnotations', 'RandomFlip',
                         'RandomChoice', 'PackDetInputs']
        ms, crop = pipeline[3].transforms
        scales = [(s, 1333) for s in range(480, 801, 32)]
        assert [tuple(x) for x in ms[0].scales] == scales
        assert [t.type for t in crop] == [
            'RandomChoiceResize', 'RandomCrop', 'RandomChoiceResize']
        assert [tuple(x) for x in crop[0].scales] == [
            (400, 1333), (500, 1333), (600, 1333)]
        assert (crop[1].crop_type, tuple(crop[1].crop_size),
                crop[1].allow_negative_crop) == ('absolute_range',
                                                 (384, 600), True)
        assert [tuple(x) for x in crop[2].scales] == scales
    test = cfg.test_dataloader.dataset.pipeline
    assert test[1].type == 'Resize' and tuple(test[1].scale) == (1333, 800)
    if det == 'cascade':  # their PolaPP_cas_rcnn.py box heads
        assert cfg.model.type == 'CascadeRCNN'
        heads = cfg.model.roi_head.bbox_head
        assert len(heads) == 3
        for head, stds in zip(heads, ([0.1, 0.1, 0.2, 0.2],
                                      [0.05, 0.05, 0.1, 0.1],
                                      [0.033, 0.033, 0.067, 0.067])):
            assert head.type == 'Shared4Conv1FCBBoxHead'
            assert (head.conv_out_channels, head.fc_out_channels,
                    head.reg_class_agnostic, head.reg_decoded_bbox) == (
                        256, 1024, False, True)
            assert head.norm_cfg == dict(type='SyncBN', requires_grad=True)
            assert head.loss_bbox == dict(type='GIoULoss', loss_weight=10.0)
            assert list(head.bbox_coder.target_stds) == stds
        assert cfg.model.roi_head.stage_loss_weights == [1, 0.5, 0.25]
        assert cfg.model.roi_head.mask_head.num_convs == 4
        assert opt.weight_decay == 0.05
        assert tuple(bb.out_indices) == (0, 1, 2, 3)
        assert cfg.model.neck.in_channels == channels
    elif det == 'mask_rcnn':
        assert cfg.model.type == 'MaskRCNN'
        assert pipeline[1].with_mask is True
        assert cfg.val_evaluator.metric == ['bbox', 'segm']
        assert opt.weight_decay == 0.05
        # the authors' keys less absolute_pos_embed and
        # relative_position_bias_table, which match no PolaPP parameter
        assert ow.paramwise_cfg == dict(
            custom_keys={'norm': dict(decay_mult=0.)})
        assert tuple(bb.out_indices) == (0, 1, 2, 3)
        assert cfg.model.neck.in_channels == channels
        assert cfg.model.roi_head.bbox_head.type == 'Shared2FCBBoxHead'
    else:
        assert cfg.model.type == 'RetinaNet'
        assert cfg.val_evaluator.metric == 'bbox'
        assert opt.weight_decay == 1e-4 and 'paramwise_cfg' not in ow
        # the authors' FPN skips stage 1 (start_level 1 over 4 outputs);
        # here stage 1 is not returned: the same inputs, no unused
        # parameter
        assert tuple(bb.out_indices) == (1, 2, 3)
        neck = cfg.model.neck
        assert (neck.in_channels, neck.start_level, neck.add_extra_convs,
                neck.num_outs) == (channels[1:], 0, 'on_input', 5)


@pytest.mark.parametrize('name', sorted(SEG))
def test_segmentation_recipe(name):
    arch = SEG[name]
    channels, dpr = ARCH[arch]
    cfg = _load(name)
    assert cfg.custom_imports.imports == ['pola_mm']
    assert cfg.default_scope == 'mmseg'
    assert cfg.model.type == 'EncoderDecoder'
    bb = cfg.model.backbone
    assert (bb.type, bb.arch, bb.drop_path_rate) == ('PolaPP', arch, dpr)
    assert '_delete_' not in bb
    assert bb.norm_eval is True  # the authors' segmentation backbone
    assert tuple(bb.out_indices) == (1, 2, 3)
    assert bb.init_cfg == dict(type='Pretrained',
                               checkpoint=_pretrained(arch))
    head = cfg.model.decode_head
    assert head.type == 'LightHamHead'
    assert (head.in_channels, head.in_index) == (channels[1:], [0, 1, 2])
    assert (head.channels, head.ham_channels, head.dropout_ratio,
            head.num_classes, head.align_corners) == (512, 512, 0.1, 150,
                                                      False)
    assert head.ham_kwargs == dict(MD_S=1, MD_R=16, train_steps=6,
                                   eval_steps=7, inv_t=100, rand_init=True)
    assert head.norm_cfg == dict(type='GN', num_groups=32,
                                 requires_grad=True)
    assert head.loss_decode == dict(type='CrossEntropyLoss',
                                    use_sigmoid=False, loss_weight=1.0)
    assert 'auxiliary_head' not in cfg.model
    assert cfg.model.test_cfg == dict(mode='whole')
    ow = cfg.optim_wrapper
    assert ow.type == 'OptimWrapper'  # no fp16 in the authors' configs
    opt = ow.optimizer
    assert (opt.type, opt.lr, opt.weight_decay, tuple(opt.betas)) == (
        'AdamW', 6e-5, 0.01, (0.9, 0.999))
    assert ow.paramwise_cfg == dict(custom_keys={
        'norm': dict(decay_mult=0.), 'head': dict(lr_mult=10.)})
    warm, poly = cfg.param_scheduler
    assert (warm.type, warm.begin, warm.end, warm.start_factor,
            warm.by_epoch) == ('LinearLR', 0, 1500, 1e-6, False)
    assert (poly.type, poly.power, poly.eta_min, poly.begin, poly.end,
            poly.by_epoch) == ('PolyLR', 1.0, 0.0, 0, 160000, False)
    assert cfg.train_cfg.max_iters == 160000
    assert cfg.train_cfg.val_interval == 8000
    assert cfg.default_hooks.checkpoint.interval == 8000
    assert cfg.train_dataloader.batch_size == 8
    assert cfg.auto_scale_lr == dict(enable=False, base_batch_size=64)
    assert cfg.model.data_preprocessor.size == (512, 512)
    train = [t.type for t in cfg.train_dataloader.dataset.pipeline]
    assert train == ['LoadImageFromFile', 'LoadAnnotations', 'RandomResize',
                     'RandomCrop', 'RandomFlip', 'PhotoMetricDistortion',
                     'PackSegInputs']
    for loader in (cfg.val_dataloader, cfg.test_dataloader):
        test = loader.dataset.pipeline
        assert [t.type for t in test] == [
            'LoadImageFromFile', 'Resize', 'ResizeToMultiple',
            'LoadAnnotations', 'PackSegInputs']
        assert tuple(test[1].scale) == (2048, 512) and test[1].keep_ratio
        assert test[2].size_divisor == 32


# cfgs/pola_b*.yaml over config.py: name -> (arch, drop path (the model
# definition), BATCH_SIZE per GPU, EPOCHS, COOLDOWN_EPOCHS, WARMUP_EPOCHS,
# BASE_LR, WARMUP_LR, MIN_LR, WEIGHT_DECAY, CLIP_GRAD)
IN1K_RECIPE = {
    'polapp_b0_in1k.py': ('b0', 0.1, 256, 300, 0, 20, 5e-4, 5e-7, 1e-7, 0.05,
                          5.0),
    'polapp_b1_in1k.py': ('b1', 0.1, 256, 300, 0, 20, 5e-4, 5e-7, 1e-7, 0.05,
                          5.0),
    'polapp_b2_in1k.py': ('b2', 0.1, 256, 300, 0, 20, 5e-4, 5e-7, 1e-7, 0.05,
                          5.0),
    'polapp_b3_in1k.py': ('b3', 0.15, 128, 300, 0, 20, 5e-4, 5e-7, 1e-7,
                          0.05, 5.0),
    'polapp_b4_in1k.py': ('b4', 0.4, 128, 300, 10, 5, 5e-4, 1e-7, 1e-5, 0.05,
                          1.0),
    'polapp_b5_in1k.py': ('b5', 0.55, 64, 300, 5, 1, 2e-5, 5e-7, 5e-6, 1e-8,
                          None),
}


@pytest.mark.parametrize('name', IN1K)
def test_in1k_recipe(name):
    """lr, warm-up start and minimum lr are ``X * batch / 512`` (8 GPUs,
    pretrain.sh); warm-up and cosine per iteration from 0, cosine over EPOCHS,
    then the cool-down at the minimum; EMA decay 0.99982 (pretrain.sh) of
    parameters and buffers; everything else PolaFormer's recipe."""
    (arch, dpr, per_gpu, epochs, cooldown, warmup, base_lr, warmup_lr,
     min_lr, wd, clip) = IN1K_RECIPE[name]
    cfg = _load(name)
    assert cfg.default_scope == 'mmpretrain'
    bb = cfg.model.backbone
    assert (bb.type, bb.arch, bb.drop_path_rate, tuple(bb.out_indices)) == (
        'PolaPP', arch, dpr, (3, ))
    # the authors' classifier: raw last stage, 1x1 conv to 2048 (b5: 2560),
    # BatchNorm, Swish, pooling, linear head
    assert bb.with_extra_norms is False
    projection = 2560 if arch == 'b5' else 2048
    assert cfg.model.neck == dict(type='PolaPPClsNeck',
                                  in_channels=ARCH[arch][0][3],
                                  out_channels=projection)
    assert (cfg.model.head.type, cfg.model.head.in_channels,
            cfg.model.head.num_classes) == ('LinearClsHead', projection, 1000)
    total = 8 * per_gpu
    assert cfg.train_dataloader.batch_size == per_gpu
    assert cfg.auto_scale_lr == dict(base_batch_size=total, enable=False)
    ow = cfg.optim_wrapper
    assert ow.get('type', 'OptimWrapper') == 'OptimWrapper'  # no --amp
    assert (ow.optimizer.type, ow.optimizer.eps,
            tuple(ow.optimizer.betas)) == ('AdamW', 1e-8, (0.9, 0.999))
    assert ow.optimizer.lr == pytest.approx(base_lr * total / 512)
    assert ow.optimizer.weight_decay == wd
    assert ow.get('clip_grad') == (None if clip is None else
                                   dict(max_norm=clip))
    # the authors' optimizer.py: no decay iff 1-D or a bias (their skip
    # lists name no PolaPP parameter)
    assert ow.paramwise_cfg == dict(norm_decay_mult=0.0, bias_decay_mult=0.0,
                                    flat_decay_mult=0.0)
    warm, cosine = cfg.param_scheduler
    assert (warm.type, warm.begin, warm.end, warm.by_epoch,
            warm.convert_to_iter_based) == ('LinearLR', 0, warmup, True, True)
    assert warm.start_factor == pytest.approx(warmup_lr / base_lr)
    assert (cosine.type, cosine.begin, cosine.end,
            cosine.convert_to_iter_based) == ('CosineAnnealingLR', 0, epochs,
                                              True)
    assert cosine.eta_min_ratio == pytest.approx(min_lr / base_lr)
    assert cfg.train_cfg.max_epochs == epochs + cooldown
    ema, = cfg.custom_hooks
    assert (ema.type, ema.update_buffers) == ('EMAHook', True)
    assert ema.momentum == pytest.approx(1 - 0.99982)
    # data, augmentation, loss, evaluation: PolaFormer's (identical files)
    ref = _load('pola_swin_t_in1k.py')
    for key in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        got, want = cfg[key].to_dict(), ref[key].to_dict()
        got.pop('batch_size'), want.pop('batch_size')
        assert got == want, key
    assert cfg.model.head.loss == ref.model.head.loss
    assert cfg.model.train_cfg == ref.model.train_cfg


def test_pacs_examples_change_only_the_feature_map():
    for name, base in (('pola_swin_t_pacs_in1k.py', 'pola_swin_t_in1k.py'),
                       ('mask_rcnn_pola_swin_t_pacs.py',
                        'mask_rcnn_pola_swin_t.py')):
        cfg, ref = _load(name).to_dict(), _load(base).to_dict()
        bb, ref_bb = cfg['model'].pop('backbone'), ref['model'].pop(
            'backbone')
        assert bb.pop('feature_map') == 'pacs'
        if name.startswith('mask_rcnn'):
            # the PaCS variant's own ImageNet weights
            assert bb.pop('init_cfg') == dict(
                type='Pretrained',
                checkpoint='checkpoints/pola_swin_t_pacs_in1k.pth')
            ref_bb.pop('init_cfg')
        assert bb == ref_bb
        cfg.pop('filename', None), ref.pop('filename', None)
        assert cfg == ref


# ------------------------------------------------------------------- builds

def _build(cfg: Config):
    from mmengine.registry import init_default_scope
    init_default_scope(cfg.default_scope)
    scope = __import__(f'{cfg.default_scope}.registry', fromlist=['MODELS'])
    return scope.MODELS.build(cfg.model)


@pytest.mark.parametrize('name', ALL)
def test_config_builds_its_model(name):
    """The full-size model, built on the meta device (shapes, no memory):
    the backbone the config names, with the authors' parameter count."""
    pytest.importorskip('mmdet.models')
    pytest.importorskip('mmseg.models')
    pytest.importorskip('mmpretrain.models')
    cfg = _load(name)
    with torch.device('meta'):
        model = _build(cfg)
    bb_cfg = cfg.model.backbone
    assert type(model.backbone).__name__ == bb_cfg.type
    if bb_cfg.type != 'PolaPP':  # the PaCS examples: PaCS in every
        from pola_mm.models.layers import PolarityAttention  # polarity stage
        attns = [m for m in model.backbone.modules()
                 if isinstance(m, PolarityAttention)]
        assert attns and all(a.feature_map == 'pacs' for a in attns)
        names = {n.rsplit('.', 1)[-1] for n, _ in
                 model.backbone.named_parameters()}
        assert {'s1', 's2'} <= names and 'power' not in names
        return
    count = sum(p.numel() for p in model.backbone.parameters())
    arch = bb_cfg.arch
    channels = ARCH[arch][0]
    # the authors' count, less the output norms of stages not returned or
    # not built (a LayerNorm: 2 x channels)
    normed = bb_cfg.out_indices if bb_cfg.get('with_extra_norms',
                                              True) else ()
    expected = AUTHORS_BACKBONE_PARAMS[arch] - sum(
        2 * channels[i] for i in range(4) if i not in normed)
    assert count == expected
    if cfg.model.type == 'ImageClassifier':  # the authors' whole classifier
        total = sum(p.numel() for p in model.parameters())
        assert total == AUTHORS_CLASSIFIER_PARAMS[arch]
    keys = cfg.optim_wrapper.get('paramwise_cfg', {}).get('custom_keys', {})
    names = [n for n, _ in model.named_parameters()]
    for key in keys:  # every paramwise key matches a parameter
        assert any(key in n for n in names), f'{key}: no parameter'


# --------------------------------------------------------- optimiser groups

def _shrink(cfg: Config) -> Config:
    """Tiny PolaPP (with layer scale) and heads sized for it."""
    e2e_data.shrink_backbone(cfg)
    cfg.model.backbone.arch = dict(POLAPP_TINY)
    channels = e2e_data.backbone_channels(cfg)
    used = [channels[i] for i in cfg.model.backbone.out_indices]
    if cfg.model.get('neck', {}).get('type') == 'PolaPPClsNeck':
        cfg.model.neck.update(in_channels=used[-1], out_channels=64)
        cfg.model.head.in_channels = 64
    elif 'in_channels' in cfg.model.get('neck', {}):  # FPN, not pooling
        cfg.model.neck.in_channels = used
    if cfg.model.get('decode_head') is not None:
        cfg.model.decode_head.in_channels = used
    return cfg


def _groups(cfg: Config) -> Dict[str, tuple]:
    """``{name: (lr, weight decay)}`` of the optimiser the Runner builds
    (the plain wrapper: AmpOptimWrapper needs a GPU, and the wrapper type
    does not change the groups)."""
    from mmengine.optim import build_optim_wrapper
    model = _build(_shrink(cfg))
    wrapper = dict(cfg.optim_wrapper, type='OptimWrapper')
    wrapper.pop('loss_scale', None)
    optimizer = build_optim_wrapper(model, wrapper).optimizer
    by_id = {}
    for group in optimizer.param_groups:
        for p in group['params']:
            by_id[id(p)] = (group['lr'], group['weight_decay'])
    return {n: by_id[id(p)] for n, p in model.named_parameters()}


@pytest.mark.parametrize('name', [
    'mask_rcnn_polapp_b3.py', 'retinanet_polapp_b2.py',
    'ham_polapp_b3_ade20k.py'
])
def test_weight_decay_and_lr_groups(name):
    """What the authors' paramwise settings give, on the optimiser the
    Runner builds: Mask R-CNN no decay on names containing ``norm`` (the
    blocks' LayerNorms, the downsampling BatchNorms, extra_norms) and decay
    on everything else, the stem BatchNorms, biases, the PaCS temperatures
    and the layer scales included; RetinaNet decay on every parameter; the
    segmentor as Mask R-CNN plus lr x10 on the decode head."""
    pytest.importorskip('mmdet.models')
    pytest.importorskip('mmseg.models')
    cfg = _load(name)
    lr, wd = cfg.optim_wrapper.optimizer.lr, cfg.optim_wrapper.optimizer.\
        weight_decay
    groups = _groups(cfg)
    for kind in ('.s1', '.s2', '.gamma_1', '.gamma_2', 'patch_embed.proj.1.',
                 'downsample.norm.', 'extra_norms.', '.bias'):
        assert any(kind in n for n in groups), kind  # the tiny model has it
    for n, (p_lr, p_wd) in groups.items():
        head = name.startswith('ham') and 'head' in n
        no_decay = not name.startswith('retinanet') and 'norm' in n \
            and not head
        assert p_lr == pytest.approx(lr * (10 if head else 1)), n
        assert p_wd == (0.0 if no_decay else wd), n
    if name.startswith('ham'):
        assert any(n.startswith('decode_head.') for n in groups)


# ----------------------------------------------------------------- training

def _train(cfg: Config) -> List[float]:
    """Train ``cfg`` with a real Runner; the loss of every iteration. Every
    backbone parameter must change (each got a gradient)."""
    from mmengine.hooks import Hook
    from mmengine.runner import Runner

    losses: List[float] = []

    class Record(Hook):
        priority = 'VERY_LOW'

        def after_train_iter(self, runner, batch_idx, data_batch=None,
                             outputs=None) -> None:
            loss = outputs['loss']
            losses.append(float(loss.detach() if torch.is_tensor(loss)
                                else loss))

    if cfg.optim_wrapper.get('type') == 'AmpOptimWrapper':  # CUDA-only here
        cfg.optim_wrapper.type = 'OptimWrapper'
        cfg.optim_wrapper.pop('loss_scale')
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        runner = Runner.from_cfg(cfg)
        runner.register_hook(Record())
        before = {n: p.detach().clone()
                  for n, p in runner.model.backbone.named_parameters()}
        runner.train()
    finally:
        torch.set_num_threads(threads)
    assert losses and all(math.isfinite(v) for v in losses), losses
    after = dict(runner.model.backbone.named_parameters())
    unchanged = [n for n, p in before.items() if torch.equal(p, after[n])]
    assert not unchanged, f'no update: {unchanged[:5]}'
    return losses


@pytest.mark.slow
def test_detection_config_trains(tmp_path):
    """mask_rcnn_polapp_b3.py (its detector, heads, losses, optimiser groups
    and schedule types) on synthetic COCO data, tiny PolaPP."""
    pytest.importorskip('mmdet.models')
    data = e2e_data.make_coco(str(tmp_path / 'coco'), num_images=4, size=64)
    cfg = e2e_data.tiny_det(_load('mask_rcnn_polapp_b3.py'), data,
                            str(tmp_path / 'work'), epochs=1, size=64)
    _shrink(cfg)
    assert cfg.model.backbone.norm_eval is False
    _train(cfg)


@pytest.mark.slow
def test_classification_config_trains(tmp_path):
    """polapp_b3_in1k.py (its EMA hook, optimiser groups, label smoothing)
    on a synthetic image folder, tiny PolaPP."""
    pytest.importorskip('mmpretrain.models')
    data = e2e_data.make_image_folder(str(tmp_path / 'imgs'), per_class=6)
    cfg = e2e_data.tiny_cls(_load('polapp_b3_in1k.py'), data,
                            str(tmp_path / 'work'), epochs=1)
    cfg.model.backbone.pop('pretrain_img_size')  # a Pola-Swin/PVT argument
    _shrink(cfg)
    assert [h.type for h in cfg.custom_hooks] == ['EMAHook']
    _train(cfg)


@pytest.mark.slow
def test_segmentation_config_trains(tmp_path):
    """ham_polapp_b3_ade20k.py (LightHamHead, lr x10 on the head) on
    synthetic ADE20K data, tiny PolaPP."""
    pytest.importorskip('mmseg.models')
    data = e2e_data.make_ade(str(tmp_path / 'ade'), num_images=4, size=64)
    cfg = e2e_data.tiny_seg(_load('ham_polapp_b3_ade20k.py'), data,
                            str(tmp_path / 'work'), iters=2, size=64)
    _shrink(cfg)
    cfg.model.decode_head.ham_channels = 32  # GroupNorm: 32 groups
    _train(cfg)
