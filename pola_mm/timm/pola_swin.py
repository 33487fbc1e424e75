"""Pola-Swin as timm models: ``pola_swin_{tiny,small,base}`` (224),
``pola_swin_base_384`` (the authors' 384 fine-tune setting) and the short
names ``pola_swin_{t,s,b}``; archs from
:attr:`PolaSwinTransformer.arch_zoo <pola_mm.models.PolaSwinTransformer>`,
drop path with them (the authors' ImageNet values)."""
from typing import Any, Dict, List

from timm.models import generate_default_cfgs, register_model

from ..models import PolaSwinTransformer
from .base import (NO_WEIGHTS, PolaClassifier, authors_cfg, build_pola_model,
                   pretrained_cfg)

__all__ = ['PolaSwin']


class PolaSwin(PolaClassifier):
    """Pola-Swin classifier (:class:`~.base.PolaClassifier` over
    :class:`~pola_mm.models.PolaSwinTransformer`): the last stage's output
    norm ``norm3`` is the authors' final norm."""

    backbone_cls = PolaSwinTransformer
    first_conv = 'backbone.patch_embed.proj'
    stage_module = 'backbone.layers.{i}'
    stage_parts = ('layers.{i}', 'norm{i}')
    downsample_part = 'layers.{i}.downsample'
    norm_part = 'norm{i}'
    groups = dict(stem=r'^backbone\.patch_embed',
                  blocks=[(r'^backbone\.layers\.(\d+)', None),
                          (r'^backbone\.norm(\d+)', None)])

    def _reductions(self, args: Dict[str, Any]) -> List[int]:
        patch = self.backbone_arg(args, 'patch_size')
        return [patch * 2**i for i in range(self.num_stages)]


_SWIN = dict(first_conv=PolaSwin.first_conv)

default_cfgs = generate_default_cfgs({
    'pola_swin_tiny.in1k': authors_cfg(82.6, **_SWIN),
    'pola_swin_small.in1k': authors_cfg(83.6, **_SWIN),
    'pola_swin_base.in1k': authors_cfg(83.8, **_SWIN),
    'pola_swin_base_384': pretrained_cfg(
        input_size=(3, 384, 384), pool_size=(12, 12), crop_pct=1.0,
        notes=NO_WEIGHTS, **_SWIN),
})


def _create_pola_swin(variant: str, pretrained: bool = False,
                      **kwargs: Any) -> PolaSwin:
    return build_pola_model(PolaSwin, variant, pretrained, **kwargs)


@register_model
def pola_swin_tiny(pretrained: bool = False, **kwargs: Any) -> PolaSwin:
    """Pola-Swin-T (arch ``'tiny'``: drop path 0.2)."""
    model_args = dict(arch='tiny')
    return _create_pola_swin('pola_swin_tiny', pretrained,
                             **dict(model_args, **kwargs))


@register_model
def pola_swin_small(pretrained: bool = False, **kwargs: Any) -> PolaSwin:
    """Pola-Swin-S (arch ``'small'``: drop path 0.3)."""
    model_args = dict(arch='small')
    return _create_pola_swin('pola_swin_small', pretrained,
                             **dict(model_args, **kwargs))


@register_model
def pola_swin_base(pretrained: bool = False, **kwargs: Any) -> PolaSwin:
    """Pola-Swin-B (arch ``'base'``: drop path 0.5)."""
    model_args = dict(arch='base')
    return _create_pola_swin('pola_swin_base', pretrained,
                             **dict(model_args, **kwargs))


@register_model
def pola_swin_base_384(pretrained: bool = False, **kwargs: Any) -> PolaSwin:
    """Pola-Swin-B at 384 (arch ``'base'``): polarity window 96 (the whole
    stage-1 map), the authors' fine-tune setting; drop path 0.5 (the
    arch's)."""
    model_args = dict(arch='base', img_size=384, window_size=96)
    return _create_pola_swin('pola_swin_base_384', pretrained,
                             **dict(model_args, **kwargs))


@register_model
def pola_swin_t(pretrained: bool = False, **kwargs: Any) -> PolaSwin:
    """Short name of :func:`pola_swin_tiny`."""
    return pola_swin_tiny(pretrained, **kwargs)


@register_model
def pola_swin_s(pretrained: bool = False, **kwargs: Any) -> PolaSwin:
    """Short name of :func:`pola_swin_small`."""
    return pola_swin_small(pretrained, **kwargs)


@register_model
def pola_swin_b(pretrained: bool = False, **kwargs: Any) -> PolaSwin:
    """Short name of :func:`pola_swin_base`."""
    return pola_swin_base(pretrained, **kwargs)
