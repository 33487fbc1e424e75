"""Whole models from configs: build the model of an mmdet / mmseg /
mmpretrain config, count one forward on a synthetic input as the upstream
``get_flops.py`` tools do (:func:`model_complexity`), and print the
counts (:func:`format_report`, what ``tools/analysis/get_flops.py``
shows). mmdet and mmseg are imported only when a config of theirs is
counted.
"""
import contextlib
from typing import Any, Sequence, Tuple

import torch
import torch.nn as nn

from ...models.from_config import build_config_model
from .counter import FlopReport, count_flops
from .rois import published_rois

__all__ = ['model_complexity', 'format_report']


def _scope_of(cfg: Any) -> str:
    return cfg.get('default_scope') or 'mmengine'


def _fake_sample(scope: str, shape: Tuple[int, int]) -> Any:
    meta = dict(img_shape=shape, ori_shape=shape, pad_shape=shape,
                batch_input_shape=shape, scale_factor=(1.0, 1.0),
                flip=False, flip_direction=None)
    if scope == 'mmdet':
        from mmdet.structures import DetDataSample
        return DetDataSample(metainfo=meta)
    if scope == 'mmseg':
        from mmseg.structures import SegDataSample
        return SegDataSample(metainfo=meta)
    return None


def model_complexity(cfg: Any, shape: Tuple[int, int], batch: int = 1,
                     compute: bool = True
                     ) -> Tuple[nn.Module, FlopReport, str]:
    """Build the model of an mmdet / mmseg / mmpretrain config and count one
    forward on a synthetic ``(batch, 3, H, W)`` input (no dataset, no
    weights loaded, eval mode).

    What runs is what mmdet's, mmseg's and mmpretrain's ``get_flops.py``
    run: a classifier's ``mode='tensor'`` forward (backbone, neck, head
    logits); a detector's ``_forward`` with a synthetic data sample,
    without post-processing; a two-stage detector's RoI heads on the
    RoIs of its test pass, as the published numbers count them
    (:func:`~.rois.published_rois`: every box head stage on the RPN's 1000
    proposals, every mask head the test pass runs on the 100 detections);
    a segmentor's ``_forward`` (backbone, neck, decode head; the auxiliary
    head, unused at test time, is not run). The input is used as given, no
    padding by the data preprocessor.

    Args:
        cfg: an :class:`mmengine.config.Config` with ``model`` and
            ``default_scope``.
        shape: ``(H, W)``.
        batch: images in the synthetic batch.
        compute: False: shapes only for the products and convolutions
            (:func:`~.counter.count_flops`), the same count.

    Returns:
        the model, its :class:`~.counter.FlopReport`, and the kind of
        forward run (``'classifier'``, ``'detector'``, ``'segmentor'`` or
        ``'backbone'``).
    """
    H, W = int(shape[0]), int(shape[1])
    if H <= 0 or W <= 0 or batch <= 0:
        raise ValueError(f'shape {shape} and batch {batch} must be positive '
                         '(e.g. --shape 224 224)')
    scope = _scope_of(cfg)
    if cfg.get('model') is None:
        raise ValueError('the config has no `model` to count')
    model = build_config_model(cfg)
    model.eval()
    x = torch.randn(batch, 3, H, W)
    from mmengine.model import BaseModel
    if isinstance(model, BaseModel) and scope in ('mmdet', 'mmseg'):
        kind = 'detector' if scope == 'mmdet' else 'segmentor'
        samples = [_fake_sample(scope, (H, W)) for _ in range(batch)]

        def forward():
            return model._forward(x, samples)
    elif isinstance(model, BaseModel):
        kind = 'classifier' if scope == 'mmpretrain' else 'model'

        def forward():
            return model(x, mode='tensor')
    else:
        kind = 'backbone'

        def forward():
            return model(x)

    rois = published_rois(model) if kind == 'detector' else \
        contextlib.nullcontext({})
    with torch.no_grad(), rois as used:
        report = count_flops(model, forward, compute=compute)
    report.rois = dict(used)
    return model, report, kind


def _fmt(n: float, unit: str) -> str:
    return f'{n / 1e9:.2f} G' if unit == 'G' else f'{n / 1e6:.2f} M'


def format_report(report: FlopReport, kind: str, shape: Tuple[int, int],
                  parts: Sequence[str] = ('backbone', 'neck', 'rpn_head',
                                          'roi_head', 'decode_head', 'head',
                                          'bbox_head')) -> str:
    """A short table: whole model and its top-level parts, FLOPs (G, 1
    multiply-add = 1 FLOP) and parameters (M)."""
    H, W = shape
    lines = [f'input: 1 x 3 x {H} x {W} ({kind}; 1 FLOP = 1 multiply-add)',
             f'{"module":<14} {"FLOPs":>11} {"params":>10}']
    rows = [('model', '')] + [(p, p) for p in parts
                              if p in report.params]
    for label, name in rows:
        flops = _fmt(report.by_module.get(name, 0), 'G')
        params = _fmt(report.params.get(name, 0), 'M')
        lines.append(f'{label:<14} {flops:>11} {params:>10}')
    if report.rois:
        lines.append('RoI heads: each box head stage on '
                     f'{report.rois.get("proposals", "its")} proposals, each '
                     f'mask head on {report.rois.get("detections", "its")} '
                     'detections per image (the test pass at most; '
                     'docs/flops.md)')
    for op, label in (('polarity_attention', 'polarity attention'),
                      ('pacs_attention', 'PaCS attention')):
        if report.by_op.get(op):
            lines.append(f'of which {label} (formula): '
                         f'{_fmt(report.by_op[op], "G")} (its depth-wise '
                         'conv on v counted as a conv)')
    return '\n'.join(lines)
