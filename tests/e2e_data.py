"""The end-to-end tests' synthetic datasets and config overrides.

The data come from the package's one synthetic-shapes generator,
:mod:`pola_mm.demo.shapes`, in its ``'boxes'`` style (rectangles and
ellipses whose class is coded by a fixed colour, on grey noise: a tiny
model learns them in a few iterations). The wrappers here only fix the
tests' layouts, class names and seeds:

* :func:`make_coco` -- COCO-style instance set (boxes, polygon masks), the
  classes named as COCO's first three (:data:`COCO_NAMES`);
* :func:`make_ade` -- ADE20K-style set (``images/*.jpg`` and ``annotations/
  *.png`` label maps, 0 = ignore) of the same shapes;
* :func:`make_image_folder` -- a classification image folder whose classes
  differ by colour.

:func:`shrink_backbone` / :func:`tiny_*` helpers rewrite a REAL config of
``configs/`` for these sets: tiny backbone arch, no ImageNet weights, small
images, the data roots, a few iterations and a short warm-up. Everything
else (detector / segmentor, heads, losses, optimiser type, paramwise
settings, schedule types, evaluators) stays as the config has it.
"""
import os.path as osp
from typing import Dict, List

from helpers import PVT_TINY, REPO, SWIN_TINY_DEPTH1
from mmengine.config import Config, ConfigDict

from pola_mm.demo import shapes

CONFIGS = osp.join(REPO, 'configs')

# COCO-style category names of the synthetic instance set
COCO_NAMES = ('person', 'bicycle', 'car')


def make_coco(root: str, num_images: int = 8, size: int = 96,
              max_shapes: int = 2, seed: int = 0) -> Dict[str, str]:
    """Write a COCO instance set to ``root``.

    Layout: ``root/images/{i:04d}.png`` (image ids from 1) and
    ``root/annotations.json`` (train and val use the same file: the tests
    check the model fits the data).

    Returns:
        dict(data_root, ann_file, img_prefix) for config overrides.
    """
    ann_file = shapes.write_coco(
        osp.join(root, 'images'), osp.join(root, 'annotations.json'),
        num_images, size, seed, style='boxes', classes=COCO_NAMES,
        mask_format='polygon', file_name='{index:04d}.png',
        max_shapes=max_shapes)
    return dict(data_root=root, ann_file=ann_file, img_prefix='images/')


def make_ade(root: str, num_images: int = 8, size: int = 64,
             max_shapes: int = 3, seed: int = 0) -> Dict[str, str]:
    """Write an ADE20K-style set to ``root``.

    ``images/{training,validation}/*.jpg`` and ``annotations/{training,
    validation}/*.png`` label maps with 0 = ignore ("other" in ADE20K), 1..3
    = shape classes (``reduce_zero_label`` maps them to 0..2). The background
    is labelled 4 so every pixel is supervised. Validation holds the same
    images as training.
    """
    shapes.make_shapes_ade(root, num_images, size, seed, style='boxes',
                           background=4, max_shapes=max_shapes)
    return dict(data_root=root)


def make_image_folder(root: str, per_class: int = 8, size: int = 32,
                      seed: int = 0) -> Dict[str, str]:
    """Write ``root/{train,val}/class_{k}/*.png``: 3 classes by colour."""
    shapes.make_colour_folder(root, per_class, size, seed)
    return dict(data_root=root)


# ---------------------------------------------------------------- overrides

def load(name: str) -> Config:
    """``Config.fromfile`` of ``configs/<name>``."""
    return Config.fromfile(osp.join(CONFIGS, name))


def shrink_backbone(cfg: Config, **extra) -> None:
    """Tiny arch of the same backbone type, no pretrained weights."""
    bb = cfg.model.backbone
    bb.arch = dict(SWIN_TINY_DEPTH1) if 'Swin' in bb.type else dict(PVT_TINY)
    bb.init_cfg = None
    bb.drop_path_rate = 0.0
    bb.update(extra)


def backbone_channels(cfg: Config) -> List[int]:
    """Output channels of the (shrunk) backbone, stage by stage."""
    arch = cfg.model.backbone.arch
    if isinstance(arch['embed_dims'], int):
        return [arch['embed_dims'] * 2**i for i in range(4)]
    return list(arch['embed_dims'])


def short_schedule(cfg: Config, warmup: int = 3) -> None:
    """Keep the scheduler types, make the linear warm-up ``warmup`` iters."""
    for sched in cfg.param_scheduler:
        if sched.type == 'LinearLR':
            sched.end = warmup
        elif sched.type == 'PolyLR' and sched.get('begin', 0) > 0:
            sched.begin = warmup


def no_workers(loader: dict) -> None:
    loader.num_workers = 0
    loader.persistent_workers = False


def shrink_widths(node, width: int = 32, fc_width: int = 64) -> None:
    """Neck / head widths 256 -> ``width`` and fc 1024 -> ``fc_width``,
    80 COCO classes -> ours, fewer RoIs, cheap RoIAlign sampling."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ('in_channels', 'out_channels', 'feat_channels',
                       'conv_out_channels') and value == 256:
                node[key] = width
            elif key == 'fc_out_channels' and value == 1024:
                node[key] = fc_width
            elif key == 'num_classes' and value == 80:
                node[key] = len(COCO_NAMES)  # the heads predict our classes
            elif key == 'sampling_ratio' and value == 0:
                node[key] = 2  # RoIAlign: fixed, cheap sampling
            elif key == 'num' and node.get('type') == 'RandomSampler':
                node[key] = min(value, 64)  # RoIs per image for the heads
            else:
                shrink_widths(value, width, fc_width)
    elif isinstance(node, (list, tuple)):
        for item in node:
            shrink_widths(item, width, fc_width)


def tiny_det(cfg: Config, data: Dict[str, str], work_dir: str,
             epochs: int = 6, size: int = 96, lr: float = 5e-4) -> Config:
    """Rewrite an mmdet COCO config for :func:`make_coco` data."""
    shrink_backbone(cfg)
    shrink_widths(cfg.model)
    cfg.model.neck.in_channels = backbone_channels(cfg)
    cfg.work_dir = work_dir
    for loader in (cfg.train_dataloader, cfg.val_dataloader,
                   cfg.test_dataloader):
        no_workers(loader)
        ds = loader.dataset
        ds.data_root = data['data_root']
        ds.ann_file = data['ann_file']
        ds.data_prefix = dict(img=data['img_prefix'])
        ds.metainfo = dict(classes=COCO_NAMES)
        # the Swin recipe's multi-scale + random-crop choice (480-800 short
        # side) becomes one resize to ``size``, as the single-scale configs
        ds.pipeline = [
            ConfigDict(type='Resize', scale=(size, size), keep_ratio=True)
            if t.type == 'RandomChoice' else t for t in ds.pipeline]
        for t in ds.pipeline:
            if t.type == 'Resize':
                t.scale = (size, size)
            elif t.type == 'RandomFlip':
                t.prob = 0.0
        if 'filter_cfg' in ds:
            ds.filter_cfg = dict(filter_empty_gt=True, min_size=4)
    cfg.train_dataloader.batch_size = 2
    cfg.train_dataloader.pop('batch_sampler', None)
    for ev in (cfg.val_evaluator, cfg.test_evaluator):
        ev.ann_file = data['ann_file']
    cfg.train_cfg.max_epochs = epochs
    cfg.train_cfg.val_interval = epochs + 1  # the tests call runner.test()
    short_schedule(cfg)
    cfg.optim_wrapper.optimizer.lr = lr
    _quiet(cfg)
    return cfg


def tiny_seg(cfg: Config, data: Dict[str, str], work_dir: str,
             iters: int = 30, size: int = 64, lr: float = 1e-3) -> Config:
    """Rewrite an mmseg ADE20K config for :func:`make_ade` data."""
    shrink_backbone(cfg)
    ch = backbone_channels(cfg)
    if cfg.model.get('neck') is not None:
        cfg.model.neck.in_channels = ch
        cfg.model.neck.out_channels = 32
        cfg.model.decode_head.in_channels = [32] * 4
        cfg.model.decode_head.channels = 32
    else:
        cfg.model.decode_head.in_channels = ch
        cfg.model.decode_head.channels = 32
    if cfg.model.get('auxiliary_head') is not None:
        cfg.model.auxiliary_head.in_channels = ch[2]
        cfg.model.auxiliary_head.channels = 16
    cfg.model.data_preprocessor.size = (size, size)
    cfg.crop_size = (size, size)
    cfg.work_dir = work_dir
    for loader in (cfg.train_dataloader, cfg.val_dataloader,
                   cfg.test_dataloader):
        no_workers(loader)
        ds = loader.dataset
        ds.data_root = data['data_root']
        for t in ds.pipeline:
            if t.type in ('RandomResize', 'Resize'):
                t.scale = (size, size)
                if t.type == 'RandomResize':
                    t.ratio_range = (1.0, 1.0)
            elif t.type == 'RandomCrop':
                t.crop_size = (size, size)
            elif t.type == 'RandomFlip':
                t.prob = 0.0
        # photometric distortion makes a 30-iteration fit needlessly noisy
        ds.pipeline = [t for t in ds.pipeline
                       if t.type != 'PhotoMetricDistortion']
    cfg.train_dataloader.batch_size = 2
    cfg.train_cfg.max_iters = iters
    cfg.train_cfg.val_interval = iters
    cfg.default_hooks.checkpoint.interval = iters
    short_schedule(cfg)
    cfg.optim_wrapper.optimizer.lr = lr
    _quiet(cfg)
    return cfg


def _quiet(cfg: Config) -> None:
    cfg.default_hooks.logger.interval = 1
    cfg.default_hooks.pop('visualization', None)
    cfg.log_level = 'WARNING'
    cfg.env_cfg.dist_cfg = dict(backend='gloo')
    cfg.randomness = dict(seed=0)


def tiny_cls(cfg: Config, data: Dict[str, str], work_dir: str,
             epochs: int = 8, size: int = 32, lr: float = 1e-3) -> Config:
    """Rewrite an mmpretrain ImageNet config for :func:`make_image_folder`.

    Label smoothing and the random resized crop / flip stay; RandAugment
    (its invert / solarize / colour operations relabel colour classes),
    random erasing and Mixup / CutMix (mixed targets) go, as they would keep
    a 24-iteration loss curve too noisy to tell whether it falls; crops are
    ``size``, 3 classes, linear lr scaling off.
    """
    shrink_backbone(cfg, pretrain_img_size=size)
    cfg.model.head.in_channels = backbone_channels(cfg)[-1]
    cfg.model.head.num_classes = 3
    cfg.model.train_cfg = None
    cfg.data_preprocessor.num_classes = 3
    if 'data_preprocessor' in cfg.model:
        cfg.model.data_preprocessor.num_classes = 3
    cfg.work_dir = work_dir
    for loader, split in ((cfg.train_dataloader, 'train'),
                          (cfg.val_dataloader, 'val'),
                          (cfg.test_dataloader, 'val')):
        no_workers(loader)
        ds = loader.dataset
        ds.type = 'CustomDataset'
        ds.data_root = data['data_root']
        ds.data_prefix = split
        ds.pop('split', None)
        ds.pipeline = [t for t in ds.pipeline
                       if t.type not in ('RandAugment', 'RandomErasing')]
        for t in ds.pipeline:
            if t.type == 'RandomResizedCrop':
                t.scale = size
            elif t.type == 'ResizeEdge':
                t.scale = size
            elif t.type == 'Resize':  # the authors' square test resize
                t.scale = (size, size)
            elif t.type == 'CenterCrop':
                t.crop_size = size
        loader.batch_size = 8
    for ev in (cfg.val_evaluator, cfg.test_evaluator):
        ev.topk = (1, )
    cfg.train_cfg.max_epochs = epochs
    cfg.train_cfg.val_interval = epochs + 1
    for sched in cfg.param_scheduler:  # 1-epoch warm-up, then cosine
        if sched.type == 'LinearLR':
            sched.end = 1
        else:
            sched.begin = 1
    cfg.auto_scale_lr.enable = False
    cfg.optim_wrapper.optimizer.lr = lr
    _quiet(cfg)
    return cfg
