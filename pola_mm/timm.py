"""Pola-Swin and Pola-PVT as timm models.

``import pola_mm.timm`` registers, in timm's model registry:

- ``pola_swin_tiny``, ``pola_swin_small``, ``pola_swin_base`` (224) and
  ``pola_swin_base_384`` (384, polarity window 96, the authors' fine-tune
  setting), aliases ``pola_swin_t``, ``pola_swin_s``, ``pola_swin_b``;
- ``pola_pvt_tiny``, ``pola_pvt_small``, ``pola_pvt_medium``,
  ``pola_pvt_large``, aliases ``pola_pvt_t``, ``pola_pvt_s``, ``pola_pvt_m``,
  ``pola_pvt_l``.

Each is a :class:`PolaClassifier`: pola_mm's backbone
(:class:`~pola_mm.models.PolaSwinTransformer` /
:class:`~pola_mm.models.PolaPVT`, the same code the OpenMMLab configs
build) as ``backbone`` and timm's ``ClassifierHead`` as ``head``. Its state
dict is mmpretrain's classifier layout (``backbone.*``, ``head.fc.*``), so a
checkpoint converted for the in1k configs loads as it is, and
:func:`checkpoint_filter_fn` converts the authors' files (recognised by their
sentinel key, through :func:`~pola_mm.models.convert_official_checkpoint`).

Stage outputs are the backbone's outputs (Pola-Swin: each stage through its
output norm ``norm{i}``), at the stages given by ``out_indices``: the last
stage for a classifier (its ``norm3`` is the authors' final norm), all four
for ``features_only=True`` (or the ``out_indices`` passed). So
``timm.create_model('pola_swin_tiny', features_only=True)`` returns exactly
what ``PolaSwinTransformer(arch='tiny')`` returns for the same weights.
"""
import functools
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
from mmengine.logging import print_log

try:
    import timm  # noqa: F401
except ImportError as err:
    raise ImportError('pola_mm.timm needs timm (1.0 or newer): '
                      'pip install timm') from err
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.layers import ClassifierHead
from timm.models import build_model_with_cfg, register_model
from timm.models._features import feature_take_indices
from timm.models._registry import generate_default_cfgs
from torch import Tensor

from .models import PolaPVT, PolaSwinTransformer
from .models.backbones.base import PreNormBlock, resolve_arch
from .models.checkpoint import (adapt_pos_tables, backbone_state_dict,
                                convert_official_checkpoint,
                                extract_state_dict, load_checkpoint_file)

__all__ = ['PolaClassifier', 'PolaSwin', 'PolaPVTClassifier',
           'checkpoint_filter_fn']

#: Where the authors publish their ImageNet-1k files.
AUTHORS_WEIGHTS = 'https://huggingface.co/ZachMeng/PolaFormer/tree/main'


class PolaClassifier(nn.Module):
    """An ImageNet classifier over a Pola backbone, with timm's interface.

    ``forward_features`` gives the last output map ``(B, C, H/32, W/32)``
    (Pola-Swin: after ``norm3``), ``forward_head`` pools it (``global_pool``)
    and applies ``head.fc``; with the authors' weights this is the published
    classifier (final norm, mean over tokens, linear head).

    Args:
        arch: the backbone's ``arch`` (a name or a dict).
        num_classes: classes of ``head.fc``; 0 for none.
        global_pool: timm pooling type (``'avg'``, ``'max'``, ``''``, ...).
        in_chans: input channels.
        img_size: pre-training image size (the grids of the learned tables).
        drop_rate: dropout before ``head.fc``.
        drop_path_rate: stochastic depth of the backbone.
        out_indices: stages with outputs (their output norms, for Pola-Swin,
            are built); default the last stage. Only stages up to
            ``max(out_indices)`` are built.
        **backbone_kwargs: any other argument of the backbone (``alpha``,
            ``attn_layout``, ``window_size``, ``with_cp``, ...).
    """

    backbone_cls: type  # set by each family

    def __init__(self,
                 arch: Union[str, dict],
                 num_classes: int = 1000,
                 global_pool: str = 'avg',
                 in_chans: int = 3,
                 img_size: Union[int, Sequence[int]] = 224,
                 drop_rate: float = 0.,
                 drop_path_rate: float = 0.1,
                 out_indices: Optional[Sequence[int]] = None,
                 **backbone_kwargs: Any) -> None:
        super().__init__()
        if out_indices is None:  # the last stage
            cls = self.backbone_cls
            depths = resolve_arch(arch, cls.arch_zoo, cls._arch_keys,
                                  cls)['depths']
            out_indices = (len(depths) - 1, )
        self.backbone = self.backbone_cls(
            arch=arch, in_channels=in_chans, pretrain_img_size=img_size,
            drop_path_rate=drop_path_rate, out_indices=tuple(out_indices),
            **backbone_kwargs)
        self.num_stages = self.backbone.num_stages
        self.num_classes = num_classes
        self.global_pool = global_pool
        self.in_chans = in_chans
        self.drop_rate = drop_rate
        self.grad_checkpointing = bool(backbone_kwargs.get('with_cp', False))
        self.output_fmt = 'NCHW'
        reductions = self._reductions(backbone_kwargs)
        self.feature_info = [
            dict(num_chs=self.backbone.num_features[i],
                 reduction=reductions[i], module=self._stage_module(i))
            for i in range(self.num_stages)
        ]
        last = max(self.backbone.out_indices)
        self.num_features = self.head_hidden_size = \
            self.backbone.num_features[last]
        self.head = ClassifierHead(self.num_features, num_classes,
                                   pool_type=global_pool, drop_rate=drop_rate)
        self.backbone.init_weights()
        self._init_head()

    # -- family specifics ------------------------------------------------
    def _reductions(self, backbone_kwargs: Dict[str, Any]) -> List[int]:
        """Stride of each stage's output."""
        raise NotImplementedError

    def _stage_module(self, i: int) -> str:
        """Name of stage ``i``'s module (timm's ``feature_info``)."""
        raise NotImplementedError

    def _init_head(self) -> None:
        fc = self.head.fc
        if isinstance(fc, nn.Linear):
            nn.init.trunc_normal_(fc.weight, std=.02)
            nn.init.zeros_(fc.bias)

    # -- timm's interface -------------------------------------------------
    @torch.jit.ignore
    def no_weight_decay(self) -> set:
        """Parameters the authors train without weight decay beyond timm's
        1-D rule: Pola-Swin's relative position bias tables."""
        return {n for n, _ in self.named_parameters()
                if n.endswith('relative_position_bias_table')}

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> Dict[str, Any]:
        """Parameter groups for layer-wise lr decay: the stem, then one group
        a stage."""
        raise NotImplementedError

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Gradient checkpointing of every block (``with_cp`` of the
        backbone's blocks, non-reentrant)."""
        self.grad_checkpointing = enable
        for m in self.backbone.modules():
            if isinstance(m, PreNormBlock):
                m.with_cp = enable

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        """The final linear layer (``nn.Identity`` without classes)."""
        return self.head.fc

    def reset_classifier(self, num_classes: int,
                         global_pool: Optional[str] = None) -> None:
        """New ``head.fc`` for ``num_classes`` (0: none), optionally a new
        pooling type."""
        self.num_classes = num_classes
        if global_pool is not None:
            self.global_pool = global_pool
        self.head.reset(num_classes, pool_type=global_pool)
        self._init_head()

    def _check_indices(self, indices: Union[None, int, Sequence[int]]
                       ) -> List[int]:
        """Absolute stage indices; every one must have an output."""
        if indices is None:
            return list(self.backbone.out_indices)
        take, _ = feature_take_indices(self.num_stages, indices)
        missing = [i for i in take if i not in self.backbone.out_indices]
        if missing:
            name = self.pretrained_cfg.get('architecture', 'MODEL') \
                if hasattr(self, 'pretrained_cfg') else 'MODEL'
            raise ValueError(
                f'{type(self).__name__}: stages {missing} have no outputs in '
                f'this model (built with out_indices='
                f'{tuple(self.backbone.out_indices)}); create it with '
                f'timm.create_model({name!r}, features_only=True, '
                f'out_indices={tuple(take)}) or out_indices={tuple(take)}')
        return take

    def forward_intermediates(
        self,
        x: Tensor,
        indices: Union[None, int, Sequence[int]] = None,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = 'NCHW',
        intermediates_only: bool = False,
    ) -> Union[List[Tensor], Tuple[Tensor, List[Tensor]]]:
        """Stage outputs, as the backbone returns them.

        Args:
            x: images ``(B, in_chans, H, W)``.
            indices: stages (a list; negative counts from the end) or the
                last ``n`` (an int); ``None``: every stage this model
                outputs (``out_indices``). Asking for a stage without an
                output raises a ``ValueError`` naming the fix.
            norm: accepted for timm's interface; Pola-Swin's outputs are
                always through their stage norms, Pola-PVT has none.
            stop_early: accepted; the model stops at its last output stage
                anyway.
            output_fmt: ``'NCHW'`` or ``'NHWC'``.
            intermediates_only: return only the list.

        Returns:
            ``[(B, C_i, ceil(H / r_i), ceil(W / r_i))]`` for the stages
            asked for (``r_i`` the stage's reduction), preceded by the last
            output map unless ``intermediates_only``.
        """
        if output_fmt not in ('NCHW', 'NHWC'):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NHWC', got "
                             f'{output_fmt!r}')
        take = self._check_indices(indices)
        outs = dict(zip(self.backbone.out_indices, self.backbone(x)))
        inter = [outs[i] for i in take]
        if output_fmt == 'NHWC':
            inter = [t.permute(0, 2, 3, 1) for t in inter]
        if intermediates_only:
            return inter
        return outs[max(self.backbone.out_indices)], inter

    def prune_intermediate_layers(self,
                                  indices: Union[int, Sequence[int]] = 1,
                                  prune_norm: bool = False,
                                  prune_head: bool = True) -> List[int]:
        """Keep what ``indices`` need (timm's feature extraction): the head
        is removed (``prune_head``); stages past the last output are not
        built in the first place. Returns the absolute indices."""
        take = self._check_indices(indices)
        if prune_head:
            self.reset_classifier(0, '')
        return take

    def forward_features(self, x: Tensor) -> Tensor:
        """``(B, in_chans, H, W)`` -> the last output map
        ``(B, num_features, ceil(H / 32), ceil(W / 32))``."""
        return self.backbone(x)[-1]

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        """Pooled features ``(B, num_features)`` (``pre_logits``) or logits
        ``(B, num_classes)``."""
        return self.head(x, pre_logits=pre_logits)

    def forward(self, x: Tensor) -> Tensor:
        """``(B, in_chans, H, W)`` -> logits ``(B, num_classes)``."""
        return self.forward_head(self.forward_features(x))

    # -- pretrained weights ----------------------------------------------
    def load_pretrained(self, checkpoint_path: str) -> None:
        """Load a checkpoint file (timm calls this for ``pretrained=True``
        with these models' ``custom_load``).

        Reads the file with pola_mm's safe loader (the authors' full training
        files load without yacs and without running pickled code), converts
        it with :func:`checkpoint_filter_fn`, and loads it strictly. A head
        of another class count, or none, is left as initialised (logged);
        the patch embedding of a 3-channel file is adapted to ``in_chans``
        as timm does.
        """
        ckpt = load_checkpoint_file(checkpoint_path, map_location='cpu')
        try:
            sd = checkpoint_filter_fn(ckpt, self)
        except ValueError as err:
            raise ValueError(f'{checkpoint_path}: {err}') from None
        own = self.state_dict()
        notes = []
        head_keys = [k for k in sd if k.startswith('head.')]
        if any(k not in own or own[k].shape != sd[k].shape
               for k in head_keys):
            for k in head_keys:
                sd.pop(k)
            notes.append('head not loaded (another number of classes)')
        conv = self.first_conv_name() + '.weight'
        if conv in sd and sd[conv].shape != own[conv].shape:
            from timm.models._manipulate import adapt_input_conv
            sd[conv] = adapt_input_conv(self.in_chans, sd[conv])
            notes.append(f'{conv} adapted to {self.in_chans} input channels')
        missing, unexpected = self.load_state_dict(sd, strict=False)
        bad = [k for k in missing if not k.startswith('head.')] + unexpected
        if bad:
            raise ValueError(f'{type(self).__name__}: {checkpoint_path!r} '
                             f'does not fit: {bad[:5]}')
        print_log(f'{type(self).__name__}: loaded {checkpoint_path}' +
                  ('; ' + '; '.join(notes) if notes else ''),
                  logger='current')

    def first_conv_name(self) -> str:
        """Name of the first convolution (the patch embedding)."""
        raise NotImplementedError


class PolaSwin(PolaClassifier):
    """Pola-Swin classifier for timm (:class:`PolaClassifier` over
    :class:`~pola_mm.models.PolaSwinTransformer`)."""

    backbone_cls = PolaSwinTransformer

    def _reductions(self, backbone_kwargs: Dict[str, Any]) -> List[int]:
        patch = self.backbone.patch_embed.patch_size
        return [patch * 2**i for i in range(self.num_stages)]

    def _stage_module(self, i: int) -> str:
        return f'backbone.layers.{i}'

    def first_conv_name(self) -> str:
        return 'backbone.patch_embed.proj'

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> Dict[str, Any]:
        return dict(stem=r'^backbone\.patch_embed',
                    blocks=[(r'^backbone\.layers\.(\d+)', None),
                            (r'^backbone\.norm(\d+)', None)])


class PolaPVTClassifier(PolaClassifier):
    """Pola-PVT classifier for timm (:class:`PolaClassifier` over
    :class:`~pola_mm.models.PolaPVT`; the published classifier has no final
    norm)."""

    backbone_cls = PolaPVT

    def _reductions(self, backbone_kwargs: Dict[str, Any]) -> List[int]:
        patch_sizes = backbone_kwargs.get('patch_sizes', (4, 2, 2, 2))
        out, stride = [], 1
        for patch in patch_sizes:
            stride *= patch
            out.append(stride)
        return out

    def _stage_module(self, i: int) -> str:
        return f'backbone.block{i + 1}'

    def first_conv_name(self) -> str:
        return 'backbone.patch_embed1.proj'

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> Dict[str, Any]:
        return dict(stem=r'^backbone\.(?:patch_embed1|pos_embed1)',
                    blocks=[(r'^backbone\.(?:patch_embed|pos_embed|block)'
                             r'(\d+)', None)])


# ---------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------
def checkpoint_filter_fn(state_dict: Dict[str, Any],
                         model: PolaClassifier) -> Dict[str, Tensor]:
    """Any Pola checkpoint -> ``model``'s state dict layout.

    Accepts the authors' files (``{'model': ...}`` or the state dict,
    recognised by the sentinel ``patch_embed.proj.weight`` /
    ``patch_embed1.proj.weight``, converted exactly as
    :func:`~pola_mm.models.convert_official_checkpoint` and the converter
    do), mmpretrain classifiers (``backbone.*``, ``head.fc.*``), detector or
    segmentor checkpoints and plain backbone state dicts. Safe to run twice:
    its output passes through unchanged.

    What the model builds but the file lacks by design (Pola-Swin's output
    norms ``norm0..2`` of a features model) keeps the model's initial
    values; stages the model does not build are dropped; learned tables of
    another pre-training size are resized (bicubic), as the mm backbones do.

    Raises:
        ValueError: the file is of another family or size (with a few of
            the mismatched keys).
    """
    sd = convert_official_checkpoint(extract_state_dict(state_dict))
    head = {k: v for k, v in sd.items() if k.startswith('head.')}
    backbone = model.backbone
    bb = backbone_state_dict(sd)
    adapt_pos_tables(bb, backbone)
    own = backbone.state_dict()
    first_conv = model.first_conv_name()[len('backbone.'):]
    out: Dict[str, Tensor] = {}
    problems = []
    for k, v in bb.items():
        if k in own:
            if own[k].shape != v.shape and k != first_conv + '.weight':
                problems.append(f'{k}: file {tuple(v.shape)} vs model '
                                f'{tuple(own[k].shape)}')
            out['backbone.' + k] = v
        elif not backbone._expected_unexpected(k):
            problems.append(f'unexpected {k}')
    for k, v in own.items():
        if k not in bb:
            if backbone._expected_missing(k):
                out['backbone.' + k] = v
            else:
                problems.append(f'missing {k}')
    if problems:
        raise ValueError(
            f'checkpoint does not fit {type(model).__name__} '
            f'({backbone.family}, arch {backbone.arch}): {len(problems)} '
            f'problems, e.g. {"; ".join(problems[:5])}. Use a checkpoint of '
            'the same family and size.')
    out.update(head)
    return out


def _cfg(**kwargs: Any) -> Dict[str, Any]:
    cfg = dict(
        url='', num_classes=1000, input_size=(3, 224, 224),
        pool_size=(7, 7), crop_pct=0.875, interpolation='bicubic',
        fixed_input_size=False, mean=IMAGENET_DEFAULT_MEAN,
        std=IMAGENET_DEFAULT_STD, classifier='head.fc', custom_load=True,
        paper_ids='arXiv:2501.15061',
        paper_name='PolaFormer: Polarity-aware Linear Attention for Vision '
        'Transformers')
    cfg.update(kwargs)
    return cfg


def _authors(top1: float, **kwargs: Any) -> Dict[str, Any]:
    """A tag with the authors' published ImageNet-1k weights."""
    return _cfg(
        origin_url=AUTHORS_WEIGHTS,
        notes=(f"the authors' ImageNet-1k classifier (their top-1 {top1}); "
               'download it from origin_url and pass '
               'pretrained_cfg_overlay=dict(file=PATH)', ),
        **kwargs)


_SWIN = dict(first_conv='backbone.patch_embed.proj')
_PVT = dict(first_conv='backbone.patch_embed1.proj')
_NO_WEIGHTS = ('the authors publish no weights for this model', )

default_cfgs = generate_default_cfgs({
    'pola_swin_tiny.in1k': _authors(82.6, **_SWIN),
    'pola_swin_small.in1k': _authors(83.6, **_SWIN),
    'pola_swin_base.in1k': _authors(83.8, **_SWIN),
    'pola_swin_base_384': _cfg(input_size=(3, 384, 384), pool_size=(12, 12),
                               crop_pct=1.0, notes=_NO_WEIGHTS, **_SWIN),
    'pola_pvt_tiny.in1k': _authors(78.8, **_PVT),
    'pola_pvt_small.in1k': _authors(81.9, **_PVT),
    'pola_pvt_medium': _cfg(notes=_NO_WEIGHTS, **_PVT),
    'pola_pvt_large': _cfg(notes=_NO_WEIGHTS, **_PVT),
})


def _create(cls: type, variant: str, pretrained: bool,
            **kwargs: Any) -> nn.Module:
    """Build ``variant`` with timm's builder. With ``features_only`` the
    backbone is built with outputs at ``out_indices`` (default all
    stages), then wrapped by timm's ``FeatureGetterNet``."""
    feature_cfg = dict(feature_cls='getter')
    model_cls: Any = cls
    overlay = kwargs.get('pretrained_cfg_overlay') or {}
    if overlay.get('file') or overlay.get('url'):
        # timm resets custom_load for a user-given file; keep pola_mm's
        # loader (it reads the authors' training files safely)
        kwargs['pretrained_cfg_overlay'] = dict(overlay)
        kwargs['pretrained_cfg_overlay'].setdefault('custom_load', True)
    if kwargs.get('features_only', False):
        bb = cls.backbone_cls
        depths = resolve_arch(kwargs['arch'], bb.arch_zoo, bb._arch_keys,
                              bb)['depths']
        take, _ = feature_take_indices(len(depths),
                                       kwargs.pop('out_indices', None))
        feature_cfg['out_indices'] = tuple(take)
        model_cls = functools.partial(cls, out_indices=tuple(take))
    return build_model_with_cfg(
        model_cls, variant, pretrained,
        pretrained_filter_fn=checkpoint_filter_fn, feature_cfg=feature_cfg,
        **kwargs)


#: timm name -> (class, arch, default keyword arguments); drop path rates
#: as the authors' ImageNet configs.
MODEL_ARGS: Dict[str, Tuple[type, str, Dict[str, Any]]] = {
    'pola_swin_tiny': (PolaSwin, 'tiny', dict(drop_path_rate=0.2)),
    'pola_swin_small': (PolaSwin, 'small', dict(drop_path_rate=0.3)),
    'pola_swin_base': (PolaSwin, 'base', dict(drop_path_rate=0.5)),
    'pola_swin_base_384': (PolaSwin, 'base', dict(
        drop_path_rate=0.5, img_size=384, window_size=96)),
    'pola_pvt_tiny': (PolaPVTClassifier, 'tiny', dict(drop_path_rate=0.1)),
    'pola_pvt_small': (PolaPVTClassifier, 'small', dict(drop_path_rate=0.1)),
    'pola_pvt_medium': (PolaPVTClassifier, 'medium',
                        dict(drop_path_rate=0.3)),
    'pola_pvt_large': (PolaPVTClassifier, 'large', dict(drop_path_rate=0.3)),
}

#: short name -> timm name.
ALIASES: Dict[str, str] = {
    'pola_swin_t': 'pola_swin_tiny', 'pola_swin_s': 'pola_swin_small',
    'pola_swin_b': 'pola_swin_base', 'pola_pvt_t': 'pola_pvt_tiny',
    'pola_pvt_s': 'pola_pvt_small', 'pola_pvt_m': 'pola_pvt_medium',
    'pola_pvt_l': 'pola_pvt_large',
}


def _entrypoint(name: str, variant: str) -> Any:
    cls, arch, defaults = MODEL_ARGS[variant]

    def create(pretrained: bool = False, **kwargs: Any) -> nn.Module:
        args = dict(defaults, arch=arch)
        args.update(kwargs)
        return _create(cls, variant, pretrained, **args)

    create.__name__ = create.__qualname__ = name
    create.__module__ = __name__
    create.__doc__ = (f'Pola-{"Swin" if cls is PolaSwin else "PVT"} '
                      f'{arch} ({variant}) as a timm model.')
    return create


for _name in list(MODEL_ARGS) + list(ALIASES):
    globals()[_name] = register_model(
        _entrypoint(_name, ALIASES.get(_name, _name)))
