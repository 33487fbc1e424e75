"""What a config reads from disk, checked before a Runner is built.

Without ``data/coco`` (or ``data/ade``, ``data/imagenet``, or the ImageNet
weights under ``checkpoints/``), ``tools/train.py`` and ``tools/test.py``
used to end in a traceback from deep inside pycocotools, mmengine or the
backbone's weight loading. :func:`first_missing` finds the first local path
a config needs that does not exist and returns one line naming it, the
layout the dataset's class expects, where to get the data, and which
``--cfg-options`` key (or ``$POLA_PRETRAINED``) points the config
elsewhere. The tools raise it as a one-line error (exit 2).

Checked: each dataloader's ``data_root``, ``ann_file`` and ``data_prefix``
directories (through dataset wrappers), the evaluators' ``ann_file``,
``load_from`` (test: the checkpoint is checked by the tool) and the
backbone's ``init_cfg`` pretrained checkpoint. Remote paths (``://``) are
not checked.
"""
import os.path as osp
from typing import Any, Iterator, List, Optional, Tuple

from mmengine.config import Config

from ..models.checkpoint import where_to_get_weights

__all__ = ['DATASET_LAYOUTS', 'missing_paths', 'first_missing']

#: Per dataset class: the layout under ``data_root`` and where to get it.
DATASET_LAYOUTS = {
    'CocoDataset': (
        'COCO 2017 layout: DATA_ROOT/annotations/instances_{train,val}'
        '2017.json, DATA_ROOT/train2017/*.jpg, DATA_ROOT/val2017/*.jpg; '
        'get it from https://cocodataset.org/#download (2017 train/val '
        'images and annotations)'),
    'ADE20KDataset': (
        'ADE20K layout: DATA_ROOT/images/{training,validation}/*.jpg, '
        'DATA_ROOT/annotations/{training,validation}/*.png (ADEChallenge'
        'Data2016.zip unpacked); get it from '
        'http://sceneparsing.csail.mit.edu'),
    'ImageNet': (
        'ImageNet-1k layout: DATA_ROOT/train/<wnid>/*.JPEG, DATA_ROOT/val/'
        '<wnid>/*.JPEG (or meta/train.txt, meta/val.txt lists); get it from '
        'https://image-net.org (ILSVRC2012)'),
}


def _datasets(cfg: Any, where: str) -> Iterator[Tuple[str, Any]]:
    """``(config key, dataset cfg)`` of a dataset config and the datasets
    inside its wrappers (``dataset`` / ``datasets``)."""
    if not isinstance(cfg, dict):
        return
    if 'dataset' in cfg and isinstance(cfg['dataset'], dict):
        yield from _datasets(cfg['dataset'], where + '.dataset')
        return
    if isinstance(cfg.get('datasets'), (list, tuple)):
        for i, d in enumerate(cfg['datasets']):
            yield from _datasets(d, f'{where}.datasets.{i}')
        return
    yield where, cfg


def _local(path: Any) -> bool:
    return isinstance(path, str) and bool(path) and '://' not in path


def _join(root: Optional[str], path: str) -> str:
    if root and not osp.isabs(path):
        return osp.join(root, path)
    return path


def missing_paths(cfg: Config, mode: str = 'train') -> List[str]:
    """One line per missing local path the config needs.

    Args:
        cfg: the Runner config (after ``--cfg-options``).
        mode: ``'train'`` (training and, if the config validates, validation
            data, evaluators, pretrained weights, ``load_from``) or
            ``'test'`` (test data and evaluator).

    Returns:
        The messages, first the one a run would hit first.
    """
    loaders = ['train_dataloader', 'val_dataloader'] if mode == 'train' \
        else ['test_dataloader']
    evaluators = ['val_evaluator'] if mode == 'train' else ['test_evaluator']
    if mode == 'train' and not cfg.get('val_cfg'):
        loaders, evaluators = ['train_dataloader'], []
    out: List[str] = []
    for name in loaders:
        loader = cfg.get(name)
        if not isinstance(loader, dict):
            continue
        for key, ds in _datasets(loader.get('dataset'), name + '.dataset'):
            out.extend(_dataset_missing(key, ds))
    for name in evaluators:
        for i, ev in enumerate(_as_list(cfg.get(name))):
            ann = ev.get('ann_file') if isinstance(ev, dict) else None
            if _local(ann) and not osp.isfile(ann):
                key = name if isinstance(cfg.get(name), dict) \
                    else f'{name}.{i}'
                out.append(
                    f'annotation file of {ev.get("type", "the evaluator")} '
                    f'not found: {ann} (point it elsewhere with '
                    f'--cfg-options {key}.ann_file=FILE)')
    if mode == 'train':
        out.extend(_pretrained_missing(cfg))
        load_from = cfg.get('load_from')
        if _local(load_from) and not osp.isfile(load_from):
            out.append(f'load_from checkpoint not found: {load_from} (fix '
                       'or drop it with --cfg-options load_from=None)')
    return _unique(out)


def _as_list(value: Any) -> list:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _unique(items: List[str]) -> List[str]:
    seen, out = set(), []
    for item in items:
        if item not in seen:
            seen.add(item)
            out.append(item)
    return out


def _layout(ds: dict) -> str:
    layout = DATASET_LAYOUTS.get(str(ds.get('type', '')).split('.')[-1])
    return f'; {layout}' if layout else ''


def _dataset_missing(key: str, ds: dict) -> List[str]:
    root = ds.get('data_root')
    kind = ds.get('type', 'dataset')
    where = f'--cfg-options {key}.data_root=DIR'
    if _local(root) and not osp.isdir(root):
        return [f'{kind} data_root not found: {root} (expected by {key}; '
                f'point it elsewhere with {where}){_layout(ds)}']
    out = []
    ann = ds.get('ann_file')
    if _local(ann):
        path = _join(root, ann)
        if _local(path) and not osp.isfile(path):
            out.append(f'{kind} annotation file not found: {path} (expected '
                       f'by {key}.ann_file; or {where}){_layout(ds)}')
    prefix = ds.get('data_prefix')
    if isinstance(prefix, dict):
        for name, sub in prefix.items():
            if not _local(sub):
                continue
            path = _join(root, sub)
            if _local(path) and not osp.isdir(path):
                out.append(
                    f'{kind} {name} directory not found: {path} (expected by '
                    f'{key}.data_prefix.{name}; or {where}){_layout(ds)}')
    return out


def _pretrained_missing(cfg: Config) -> List[str]:
    model = cfg.get('model')
    if not isinstance(model, dict):
        return []
    out = []
    for part in ('backbone', None):
        owner = model.get(part) if part else model
        if not isinstance(owner, dict):
            continue
        for init in _as_list(owner.get('init_cfg')):
            if not isinstance(init, dict) or init.get('type') != 'Pretrained':
                continue
            ckpt = init.get('checkpoint')
            if _local(ckpt) and not osp.isfile(ckpt):
                key = f'model.{part}.init_cfg' if part else 'model.init_cfg'
                out.append(f'pretrained checkpoint not found: {ckpt}. '
                           f'{where_to_get_weights(key)}')
    return out


def first_missing(cfg: Config, mode: str = 'train') -> Optional[str]:
    """The first of :func:`missing_paths` (``None`` if all exist)."""
    missing = missing_paths(cfg, mode)
    return missing[0] if missing else None
