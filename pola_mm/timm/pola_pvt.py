"""Pola-PVT as timm models: ``pola_pvt_{tiny,small,medium,large}`` and the
short names ``pola_pvt_{t,s,m,l}``; archs from
:attr:`PolaPVT.arch_zoo <pola_mm.models.PolaPVT>`, drop path with them
(the authors' ImageNet values)."""
from typing import Any, Dict, List

from timm.models import generate_default_cfgs, register_model

from ..models import PolaPVT
from .base import (NO_WEIGHTS, PolaClassifier, authors_cfg, build_pola_model,
                   pretrained_cfg)

__all__ = ['PolaPVTClassifier']


class PolaPVTClassifier(PolaClassifier):
    """Pola-PVT classifier (:class:`~.base.PolaClassifier` over
    :class:`~pola_mm.models.PolaPVT`; the published classifier has no final
    norm). Stage ``i`` owns its patch embedding, position table and blocks
    (the authors' 1-based names), so the step to the next stage goes with
    the next stage when pruning."""

    backbone_cls = PolaPVT
    first_conv = 'backbone.patch_embed1.proj'
    stage_module = 'backbone.block{n}'
    stage_parts = ('patch_embed{n}', 'pos_embed{n}', 'pos_drop{n}',
                   'block{n}')
    groups = dict(stem=r'^backbone\.(?:patch_embed1|pos_embed1)',
                  blocks=[(r'^backbone\.(?:patch_embed|pos_embed|block)'
                           r'(\d+)', None)])

    def _reductions(self, args: Dict[str, Any]) -> List[int]:
        out, stride = [], 1
        for patch in self.backbone_arg(args, 'patch_sizes'):
            stride *= patch
            out.append(stride)
        return out


_PVT = dict(first_conv=PolaPVTClassifier.first_conv)

default_cfgs = generate_default_cfgs({
    'pola_pvt_tiny.in1k': authors_cfg(78.8, **_PVT),
    'pola_pvt_small.in1k': authors_cfg(81.9, **_PVT),
    'pola_pvt_medium': pretrained_cfg(notes=NO_WEIGHTS, **_PVT),
    'pola_pvt_large': pretrained_cfg(notes=NO_WEIGHTS, **_PVT),
})


def _create_pola_pvt(variant: str, pretrained: bool = False,
                     **kwargs: Any) -> PolaPVTClassifier:
    return build_pola_model(PolaPVTClassifier, variant, pretrained, **kwargs)


@register_model
def pola_pvt_tiny(pretrained: bool = False,
                  **kwargs: Any) -> PolaPVTClassifier:
    """Pola-PVT-T (arch ``'tiny'``: drop path 0.1)."""
    model_args = dict(arch='tiny')
    return _create_pola_pvt('pola_pvt_tiny', pretrained,
                            **dict(model_args, **kwargs))


@register_model
def pola_pvt_small(pretrained: bool = False,
                   **kwargs: Any) -> PolaPVTClassifier:
    """Pola-PVT-S (arch ``'small'``: drop path 0.1)."""
    model_args = dict(arch='small')
    return _create_pola_pvt('pola_pvt_small', pretrained,
                            **dict(model_args, **kwargs))


@register_model
def pola_pvt_medium(pretrained: bool = False,
                    **kwargs: Any) -> PolaPVTClassifier:
    """Pola-PVT-M (arch ``'medium'``: drop path 0.3)."""
    model_args = dict(arch='medium')
    return _create_pola_pvt('pola_pvt_medium', pretrained,
                            **dict(model_args, **kwargs))


@register_model
def pola_pvt_large(pretrained: bool = False,
                   **kwargs: Any) -> PolaPVTClassifier:
    """Pola-PVT-L (arch ``'large'``: drop path 0.3)."""
    model_args = dict(arch='large')
    return _create_pola_pvt('pola_pvt_large', pretrained,
                            **dict(model_args, **kwargs))


@register_model
def pola_pvt_t(pretrained: bool = False, **kwargs: Any) -> PolaPVTClassifier:
    """Short name of :func:`pola_pvt_tiny`."""
    return pola_pvt_tiny(pretrained, **kwargs)


@register_model
def pola_pvt_s(pretrained: bool = False, **kwargs: Any) -> PolaPVTClassifier:
    """Short name of :func:`pola_pvt_small`."""
    return pola_pvt_small(pretrained, **kwargs)


@register_model
def pola_pvt_m(pretrained: bool = False, **kwargs: Any) -> PolaPVTClassifier:
    """Short name of :func:`pola_pvt_medium`."""
    return pola_pvt_medium(pretrained, **kwargs)


@register_model
def pola_pvt_l(pretrained: bool = False, **kwargs: Any) -> PolaPVTClassifier:
    """Short name of :func:`pola_pvt_large`."""
    return pola_pvt_large(pretrained, **kwargs)
