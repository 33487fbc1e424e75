"""PolaPP (PolaFormer++) as timm models: ``polapp_b0`` ... ``polapp_b5``,
the authors' ImageNet classifiers (their ``POLA_b*``); archs and drop path
from :attr:`PolaPP.arch_zoo <pola_mm.models.PolaPP>`."""
from collections import OrderedDict
from typing import Any, Dict, List, Optional, Tuple

import torch.nn as nn
from timm.models import generate_default_cfgs, register_model

from ..models import PolaPP, PolaPPClsNeck
from ..models.checkpoint import POLAPP_WEIGHTS
from .base import PolaClassifier, build_pola_model, pretrained_cfg

__all__ = ['PolaPPClassifier', 'POLAPP_WEIGHTS']

POLAPP_PAPER = ('PolaFormer++: Polarity-aware Linear Attention with '
                'Channel-wise Spikiness')


class PolaPPClassifier(PolaClassifier):
    """The authors' PolaFormer++ ImageNet classifier (``POLA_b*``):
    :class:`~pola_mm.models.PolaPP` without output norms
    (``with_extra_norms=False``), then ``neck``: the authors' ``proj`` 1x1
    conv to ``projection`` channels, ``norm`` BatchNorm and Swish
    (:class:`~pola_mm.models.PolaPPClsNeck`'s modules, before its pooling)
    as the end of :meth:`forward_features`, then average pooling and
    ``head.fc`` (their 1x1-conv head). A ``features_only`` model has no
    neck and the output norms ``extra_norms`` of its stages (the mm
    backbone's outputs).

    Args:
        projection: the authors' ``projection`` (2048; 2560 for b5).
        (the rest as :class:`~.base.PolaClassifier`; ``img_size`` is
        accepted for timm's interface: PolaPP has no learned tables tied to
        an input size; ``drop_path_rate=None`` is the arch's, the authors'.)
    """

    backbone_cls = PolaPP
    first_conv = 'backbone.patch_embed.proj.0'
    stage_module = 'backbone.layers.{i}'
    stage_parts = ('layers.{i}', 'extra_norms.{i}')
    downsample_part = 'layers.{i}.downsample'
    norm_part = 'extra_norms.{i}'
    groups = dict(stem=r'^backbone\.patch_embed',
                  blocks=[(r'^backbone\.layers\.(\d+)', None),
                          (r'^backbone\.extra_norms\.(\d+)', None),
                          (r'^neck', (99999, ))])
    classifier_args = dict(with_extra_norms=False)
    takes_img_size = False

    def __init__(self, arch: Any, projection: int = 2048,
                 **kwargs: Any) -> None:
        self.projection = projection
        super().__init__(arch, **kwargs)

    def _reductions(self, args: Dict[str, Any]) -> List[int]:
        return [2**(i + 2) for i in range(self.num_stages)]

    def _build_neck(self) -> Tuple[Optional[nn.Module], Optional[int]]:
        if self.features_mode:
            return None, None
        tail = PolaPPClsNeck(self.backbone.num_features[-1], self.projection)
        tail.init_weights()
        neck = nn.Sequential(OrderedDict(proj=tail.proj, norm=tail.norm,
                                         act=tail.act))
        return neck, self.projection


def _polapp_cfg(top1: float) -> Dict[str, Any]:
    """A PolaPP tag: the authors' PolaFormer++ ImageNet-1k classifier, whose
    files are on Baidu Pan only (``origin_url``)."""
    return pretrained_cfg(
        first_conv=PolaPPClassifier.first_conv, license=None,
        paper_ids=None, paper_name=POLAPP_PAPER, origin_url=POLAPP_WEIGHTS,
        notes=(f"the authors' ImageNet-1k classifier (their top-1 {top1}); "
               'download it from origin_url (extraction code atba) and pass '
               'pretrained_cfg_overlay=dict(file=PATH); the authors\' '
               'repository has no license file', ))


default_cfgs = generate_default_cfgs({
    'polapp_b0.in1k': _polapp_cfg(76.9),
    'polapp_b1.in1k': _polapp_cfg(79.1),
    'polapp_b2.in1k': _polapp_cfg(82.8),
    'polapp_b3.in1k': _polapp_cfg(84.3),
    'polapp_b4.in1k': _polapp_cfg(85.4),
    'polapp_b5.in1k': _polapp_cfg(85.6),
})


def _create_polapp(variant: str, pretrained: bool = False,
                   **kwargs: Any) -> PolaPPClassifier:
    return build_pola_model(PolaPPClassifier, variant, pretrained, **kwargs)


@register_model
def polapp_b0(pretrained: bool = False, **kwargs: Any) -> PolaPPClassifier:
    """PolaPP-b0 (arch ``'b0'``: drop path 0.1)."""
    model_args = dict(arch='b0')
    return _create_polapp('polapp_b0', pretrained,
                          **dict(model_args, **kwargs))


@register_model
def polapp_b1(pretrained: bool = False, **kwargs: Any) -> PolaPPClassifier:
    """PolaPP-b1 (arch ``'b1'``: drop path 0.1)."""
    model_args = dict(arch='b1')
    return _create_polapp('polapp_b1', pretrained,
                          **dict(model_args, **kwargs))


@register_model
def polapp_b2(pretrained: bool = False, **kwargs: Any) -> PolaPPClassifier:
    """PolaPP-b2 (arch ``'b2'``: drop path 0.1)."""
    model_args = dict(arch='b2')
    return _create_polapp('polapp_b2', pretrained,
                          **dict(model_args, **kwargs))


@register_model
def polapp_b3(pretrained: bool = False, **kwargs: Any) -> PolaPPClassifier:
    """PolaPP-b3 (arch ``'b3'``: drop path 0.15)."""
    model_args = dict(arch='b3')
    return _create_polapp('polapp_b3', pretrained,
                          **dict(model_args, **kwargs))


@register_model
def polapp_b4(pretrained: bool = False, **kwargs: Any) -> PolaPPClassifier:
    """PolaPP-b4 (arch ``'b4'``: drop path 0.4)."""
    model_args = dict(arch='b4')
    return _create_polapp('polapp_b4', pretrained,
                          **dict(model_args, **kwargs))


@register_model
def polapp_b5(pretrained: bool = False, **kwargs: Any) -> PolaPPClassifier:
    """PolaPP-b5 (arch ``'b5'``: drop path 0.55), projection 2560."""
    model_args = dict(arch='b5', projection=2560)
    return _create_polapp('polapp_b5', pretrained,
                          **dict(model_args, **kwargs))
