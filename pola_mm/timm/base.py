"""What the timm models of every family share: :class:`PolaClassifier`
(timm's model interface over a Pola backbone's stage contract),
:func:`checkpoint_filter_fn`, the pretrained-config helpers and
:func:`build_pola_model`, which the model functions call."""
import contextlib
import functools
import inspect
import os.path as osp
from typing import Any, Dict, List, Optional, Sequence, Tuple, Type, Union

import torch
import torch.nn as nn
from mmengine.logging import print_log
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.layers import ClassifierHead
from timm.models import (build_model_with_cfg, register_notrace_function,
                         register_notrace_module)
from timm.models._features import FeatureGetterNet, feature_take_indices
from torch import Tensor

from ..models.backbones.base import (PolaBackbone, PreNormBlock, check_input,
                                     resolve_arch)
from ..models.checkpoint import (POLAFORMER_WEIGHTS, adapt_pos_tables,
                                 backbone_state_dict,
                                 convert_official_checkpoint,
                                 extract_state_dict, load_checkpoint_file)
from ..models.layers import PatchEmbed, PatchMerging, PolaPPBlock, to_map
from ..ops.position import resize_pos_table
from ..type_aliases import Size2

__all__ = ['PolaClassifier', 'checkpoint_filter_fn', 'build_pola_model',
           'pretrained_cfg', 'authors_cfg', 'no_weights_message',
           'AUTHORS_WEIGHTS', 'AUTHORS_HF_HUB_ID']

#: Where the authors publish their PolaFormer ImageNet-1k files.
AUTHORS_WEIGHTS = POLAFORMER_WEIGHTS
#: The Hugging Face repository of those files (named by the authors' README).
AUTHORS_HF_HUB_ID = 'ZachMeng/PolaFormer'
POLA_PAPER = ('PolaFormer: Polarity-aware Linear Attention for Vision '
              'Transformers')

# torch.fx: leaves of the trace (their forwards branch on sizes or let an op
# pick its implementation) and functions called as a whole. Registered once,
# in timm's registry, for every tracer that asks timm for them.
for _leaf in (PatchEmbed, PatchMerging, PreNormBlock, PolaPPBlock):
    register_notrace_module(_leaf)
register_notrace_function(resize_pos_table)
register_notrace_function(check_input)


def _remove(root: nn.Module, path: str) -> None:
    """Remove the submodule or parameter ``path`` (dotted) of ``root``
    where it exists: an entry of a ``ModuleList`` (the last ones only) or
    ``ModuleDict`` is deleted, an attribute set to ``None``."""
    parent_name, _, name = path.rpartition('.')
    parent = root.get_submodule(parent_name) if parent_name else root
    if isinstance(parent, nn.ModuleList):
        if int(name) < len(parent):
            del parent[int(name)]
    elif isinstance(parent, nn.ModuleDict):
        if name in parent:
            del parent[name]
    elif name in parent._modules or name in parent._parameters:
        setattr(parent, name, None)


class PolaClassifier(nn.Module):
    """An ImageNet classifier over a Pola backbone, with timm's interface.

    The model runs the backbone's one stage loop
    (:meth:`~pola_mm.models.backbones.base.PolaBackbone.run_stages`, which
    the mm backbone's ``forward`` runs too); nothing of the computation is
    written here. ``forward_features`` gives the last map ``(B, num_features,
    H / 32, W / 32)`` after the last stage's output norm (Pola-Swin's final
    ``norm3``) and the optional ``neck`` (PolaPP's ``proj``/``norm``/Swish);
    ``forward_head`` pools it (``global_pool``) and applies ``head.fc``.
    With the authors' weights this is the published classifier. The state
    dict is mmpretrain's classifier layout (``backbone.*``, ``neck.*``,
    ``head.fc.*``).

    A family is a subclass that fills in the table below (class
    attributes); format strings name backbone modules of stage ``i``
    (``{i}``, 0-based) or ``{n}`` (``i + 1``, PVT's 1-based names).

    Args:
        arch: the backbone's ``arch``: a name of its ``arch_zoo`` or a dict.
        num_classes: classes of ``head.fc``; 0 for none.
        global_pool: timm pooling type (``'avg'``, ``'max'``, ``''``, ...).
        in_chans: input channels.
        img_size: pre-training image size (the grids of the learned tables;
            the backbone's ``pretrain_img_size`` where it has one).
        drop_rate: dropout before ``head.fc``.
        drop_path_rate: stochastic depth of the backbone (``None``: the
            arch's, the authors' ImageNet value in the backbone's
            ``arch_zoo``).
        out_indices: ``None`` for the classifier (every stage, the output
            norm of the last one only); a ``features_only`` model passes the
            stages it returns (stages up to the last of them are built, each
            returned one with its output norm, as the mm backbone).
        device: where to create parameters and buffers (timm's factory
            argument).
        dtype: their floating-point type.
        **backbone_kwargs: any other argument of the backbone (``alpha``,
            ``attn_layout``, ``window_size``, ``with_cp``, ...); an unknown
            one raises ``TypeError``.
    """

    # -- the family's table ------------------------------------------------
    #: The backbone; its ``arch_zoo`` defines the archs.
    backbone_cls: Type[PolaBackbone]
    #: The patch embedding's conv (timm's ``first_conv``).
    first_conv: str
    #: Stage ``i``'s module (timm's ``feature_info``).
    stage_module: str
    #: What stage ``i`` owns in the backbone (removed by pruning).
    stage_parts: Tuple[str, ...]
    #: The step after stage ``i`` that ``stage(i)`` skips once it is None
    #: (None: the step is one of the next stage's parts).
    downsample_part: Optional[str] = None
    #: Stage ``i``'s output norm (None: the family has none).
    norm_part: Optional[str] = None
    #: :meth:`group_matcher`: the stem, then one group a stage.
    groups: Dict[str, Any]
    #: Backbone arguments of the classifier (not of ``features_only``).
    classifier_args: Dict[str, Any] = {}
    #: Whether the backbone takes ``img_size`` (as ``pretrain_img_size``).
    takes_img_size: bool = True

    def __init__(self,
                 arch: Union[str, dict],
                 num_classes: int = 1000,
                 global_pool: str = 'avg',
                 in_chans: int = 3,
                 img_size: Union[int, Sequence[int]] = 224,
                 drop_rate: float = 0.,
                 drop_path_rate: Optional[float] = None,
                 out_indices: Optional[Sequence[int]] = None,
                 device: Optional[Union[str, torch.device]] = None,
                 dtype: Optional[torch.dtype] = None,
                 **backbone_kwargs: Any) -> None:
        super().__init__()
        self.features_mode = out_indices is not None
        if out_indices is None:  # the classifier: the last stage's norm
            out_indices = (len(self.arch_of(arch)['depths']) - 1, )
        args = dict(backbone_kwargs, arch=arch, in_channels=in_chans,
                    out_indices=tuple(out_indices))
        if drop_path_rate is not None:
            args['drop_path_rate'] = drop_path_rate
        if self.takes_img_size:
            args['pretrain_img_size'] = img_size
        if not self.features_mode:
            args.update(self.classifier_args)
        self.num_classes = num_classes
        self.global_pool = global_pool
        self.in_chans = in_chans
        self.drop_rate = drop_rate
        self.output_fmt = 'NCHW'
        self.grad_checkpointing = bool(backbone_kwargs.get('with_cp', False))
        with (torch.device(device) if device is not None else
              contextlib.nullcontext()):
            self.backbone = self.backbone_cls(**args)
            self.num_stages = self.backbone.num_stages
            self.neck, neck_chs = self._build_neck()
            reductions = self._reductions(args)
            self.feature_info = [
                dict(num_chs=self.backbone.num_features[i],
                     reduction=reductions[i],
                     module=self.stage_module.format(i=i, n=i + 1))
                for i in range(self.num_stages)
            ]
            self.num_features = self.head_hidden_size = (
                neck_chs or self._last_chs())
            self.head = ClassifierHead(self.num_features, num_classes,
                                       pool_type=global_pool,
                                       drop_rate=drop_rate)
            self.backbone.init_weights()
            self._init_head()
        if dtype is not None:
            self.to(dtype)

    @classmethod
    def arch_of(cls, arch: Union[str, dict]) -> dict:
        """The backbone's resolved ``arch`` dict (``depths``, ...)."""
        bb = cls.backbone_cls
        return resolve_arch(arch, bb.arch_zoo, bb._arch_keys, bb)

    @classmethod
    def backbone_arg(cls, args: Dict[str, Any], name: str) -> Any:
        """Backbone argument ``name``: as given in ``args``, else the
        backbone's default."""
        if name in args:
            return args[name]
        return inspect.signature(cls.backbone_cls).parameters[name].default

    # -- family hooks --------------------------------------------------------
    def _reductions(self, args: Dict[str, Any]) -> List[int]:
        """Stride of each stage's output, from the backbone's arguments."""
        raise NotImplementedError

    def _build_neck(self) -> Tuple[Optional[nn.Module], Optional[int]]:
        """A map-to-map module between the last stage and the pooling, and
        its output channels (PolaPP's classifier); none by default."""
        return None, None

    # -- the backbone's stage loop -------------------------------------------
    def _last_chs(self) -> int:
        return self.backbone.num_features[self.backbone.num_built - 1]

    def _final(self, tokens: Tensor, hw: Size2) -> Tensor:
        """The last stage's raw tokens -> :meth:`forward_features`' map:
        its output norm, then the neck."""
        x = to_map(self.backbone.out_norm(self.backbone.num_built - 1,
                                          tokens), hw)
        return x.contiguous() if self.neck is None else self.neck(x)

    def forward_features(self, x: Tensor) -> Tensor:
        """``(B, in_chans, H, W)`` -> the last map
        ``(B, num_features, H_last, W_last)`` (stride 32 for the default
        patch sizes)."""
        check_input(x, self.in_chans, type(self).__name__)
        out, hw, _ = self.backbone.run_stages(x, self.backbone.num_built - 1,
                                              (), norm=False)
        return self._final(out, hw)

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        """Pooled features ``(B, num_features)`` (``pre_logits``) or logits
        ``(B, num_classes)``."""
        return self.head(x, pre_logits=pre_logits)

    def forward(self, x: Tensor) -> Tensor:
        """``(B, in_chans, H, W)`` -> logits ``(B, num_classes)``."""
        return self.forward_head(self.forward_features(x))

    def _take(self, indices: Union[None, int, Sequence[int]]
              ) -> Tuple[List[int], int]:
        """Absolute stage indices and the largest; each must be built."""
        take, max_index = feature_take_indices(self.num_stages, indices)
        built = self.backbone.num_built
        if max_index >= built:
            raise ValueError(
                f'{type(self).__name__}: stage {max_index} is not built in '
                f'this model (stages 0..{built - 1}; it was built or pruned '
                f'for features up to stage {built - 1}); create the model '
                f'with features_only=True, out_indices={tuple(take)}')
        return take, max_index

    def forward_intermediates(
        self,
        x: Tensor,
        indices: Union[None, int, Sequence[int]] = None,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = 'NCHW',
        intermediates_only: bool = False,
    ) -> Union[List[Tensor], Tuple[Tensor, List[Tensor]]]:
        """Stage outputs, timm's convention.

        Args:
            x: images ``(B, in_chans, H, W)``.
            indices: stages (a list; negative counts from the end) or the
                last ``n`` (an int); ``None``: every stage.
            norm: apply the model's output norm of each returned stage where
                it has one (a classifier: the last stage's final norm; a
                ``features_only`` model: every returned stage's, as the mm
                backbone).
            stop_early: stop after the last stage asked for (the final
                output is then that stage's raw map).
            output_fmt: ``'NCHW'`` or ``'NHWC'``.
            intermediates_only: return only the list.

        Returns:
            ``[(B, C_i, H_i, W_i)]`` for the stages asked for (NHWC
            permuted), preceded by :meth:`forward_features`' output unless
            ``intermediates_only``.
        """
        if output_fmt not in ('NCHW', 'NHWC'):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NHWC', got "
                             f'{output_fmt!r}')
        take, max_index = self._take(indices)
        check_input(x, self.in_chans, type(self).__name__)
        last = self.backbone.num_built - 1
        stop = max_index if (stop_early or intermediates_only) else last
        out, hw, taken = self.backbone.run_stages(x, stop, take, norm)
        inter = []
        for tokens, tokens_hw in taken:
            t = to_map(tokens, tokens_hw)
            if output_fmt == 'NHWC':
                t = t.permute(0, 2, 3, 1)
            inter.append(t.contiguous())
        if intermediates_only:
            return inter
        if stop < last:
            return to_map(out, hw).contiguous(), inter
        return self._final(out, hw), inter

    def prune_intermediate_layers(self,
                                  indices: Union[int, Sequence[int]] = 1,
                                  prune_norm: bool = False,
                                  prune_head: bool = True) -> List[int]:
        """Keep what ``indices`` need (timm's feature extraction): the
        stages after the last index go (with that stage's step to the next
        one, and the neck); ``prune_norm`` makes the output norms identities
        and drops the neck; ``prune_head`` drops the head (no classes, no
        pooling). Returns the absolute indices."""
        take, max_index = self._take(indices)
        bb = self.backbone
        if max_index < bb.num_built - 1:
            for i in reversed(range(max_index + 1, bb.num_built)):
                for part in self.stage_parts:
                    _remove(bb, part.format(i=i, n=i + 1))
            if self.downsample_part is not None:
                _remove(bb, self.downsample_part.format(i=max_index,
                                                        n=max_index + 1))
            bb.num_built = max_index + 1
            bb.out_indices = tuple(i for i in bb.out_indices if i <= max_index)
            self.neck = None
        if prune_norm:
            parts = [self.norm_part.format(i=i, n=i + 1)
                     for i in range(bb.num_built)] if self.norm_part else []
            for part in parts:
                parent, _, name = part.rpartition('.')
                holder = bb.get_submodule(parent) if parent else bb
                if name in holder._modules:  # (a built output norm)
                    holder.add_module(name, nn.Identity())
            self.neck = None
        if self.neck is None:
            self.num_features = self.head_hidden_size = self._last_chs()
        if prune_head:
            self.reset_classifier(0, '')
        elif self.head.in_features != self.num_features:
            self.reset_classifier(self.num_classes)
        return take

    # -- timm's interface ----------------------------------------------------
    def no_weight_decay(self) -> set:
        """Parameters the authors train without weight decay beyond timm's
        1-D rule: Pola-Swin's relative position bias tables."""
        return {n for n, _ in self.named_parameters()
                if n.endswith('relative_position_bias_table')}

    def group_matcher(self, coarse: bool = False) -> Dict[str, Any]:
        """Parameter groups for layer-wise lr decay: the stem, then one
        group a stage (the family's :attr:`groups`)."""
        return dict(self.groups)

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Gradient checkpointing of every block (``with_cp`` of the
        backbone's blocks, non-reentrant)."""
        self.grad_checkpointing = enable
        for m in self.backbone.modules():
            if isinstance(m, (PreNormBlock, PolaPPBlock)):
                m.with_cp = enable

    def get_classifier(self) -> nn.Module:
        """The final linear layer (``nn.Identity`` without classes)."""
        return self.head.fc

    def reset_classifier(self, num_classes: int,
                         global_pool: Optional[str] = None) -> None:
        """New ``head`` for ``num_classes`` (0: none) over the current
        ``num_features``, optionally with a new pooling type (``None`` keeps
        the current one); created on the model's device and dtype, in its
        training mode."""
        self.num_classes = num_classes
        if global_pool is not None:
            self.global_pool = global_pool
        ref = next(self.backbone.parameters())
        self.head = ClassifierHead(self.num_features, num_classes,
                                   pool_type=self.global_pool,
                                   drop_rate=self.drop_rate,
                                   device=ref.device, dtype=ref.dtype)
        self.head.train(self.training)
        self._init_head()

    def _init_head(self) -> None:
        fc = self.head.fc
        if isinstance(fc, nn.Linear):
            nn.init.trunc_normal_(fc.weight, std=.02)
            nn.init.zeros_(fc.bias)

    # -- pretrained weights --------------------------------------------------
    def load_pretrained(self, checkpoint_path: str) -> None:
        """Load a checkpoint file (timm calls this for ``pretrained=True``
        with these models' ``custom_load``).

        Reads the file with pola_mm's safe loader (the authors' full training
        files load without yacs and without running pickled code), converts
        it with :func:`checkpoint_filter_fn`, and loads it strictly. A head
        of another class count, or none, is left as initialised (logged);
        the patch embedding of a 3-channel file is adapted to ``in_chans``
        as timm does.

        Raises:
            FileNotFoundError: ``checkpoint_path`` is no file, e.g. the
                Hugging Face repository id timm passes when no ``file`` was
                given (the authors' file names there are not confirmed):
                the message says where to download and how to pass the file.
        """
        if not isinstance(checkpoint_path, str) or \
                not osp.isfile(checkpoint_path):
            cfg = dict(getattr(self, 'pretrained_cfg', None) or {})
            raise FileNotFoundError(
                f'no file at {checkpoint_path!r}; ' + no_weights_message(
                    cfg.get('architecture') or type(self).__name__, cfg))
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
        conv = self.first_conv + '.weight'
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


def checkpoint_filter_fn(state_dict: Dict[str, Any],
                         model: PolaClassifier) -> Dict[str, Tensor]:
    """Any Pola checkpoint -> ``model``'s state dict layout.

    Accepts the authors' files (``{'model': ...}`` or the state dict,
    recognised by the sentinel ``patch_embed.proj.weight`` /
    ``patch_embed1.proj.weight`` / ``patch_embed.proj.0.weight``, converted
    exactly as :func:`~pola_mm.models.convert_official_checkpoint` and the
    converter do), mmpretrain classifiers (``backbone.*``, ``neck.*``,
    ``head.fc.*``), detector or segmentor checkpoints and plain backbone
    state dicts. Safe to run twice: its output passes through unchanged.

    What the model builds but the file lacks by design (Pola-Swin's output
    norms ``norm0..2``, PolaPP's ``extra_norms`` of a features model) keeps
    the model's initial values; stages the model does not build are dropped,
    and so is a classifier's neck for a model without one; learned tables of
    another pre-training size are resized (bicubic), as the mm backbones do.

    Raises:
        ValueError: the file is of another family or size (with a few of
            the mismatched keys).
    """
    sd = convert_official_checkpoint(extract_state_dict(state_dict))
    own_all = model.state_dict()
    extra = {k: v for k, v in sd.items()
             if k.startswith('head.') or (k.startswith('neck.')
                                          and k in own_all)}
    backbone = model.backbone
    bb = backbone_state_dict(sd)
    adapt_pos_tables(bb, backbone)
    own = backbone.state_dict()
    first_conv = model.first_conv[len('backbone.'):] + '.weight'
    out: Dict[str, Tensor] = {}
    problems = []
    for k, v in bb.items():
        if k in own:
            if own[k].shape != v.shape and k != first_conv:
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
    neck = [k for k in own_all if k.startswith('neck.')]
    if neck and not any(k.startswith('neck.') for k in sd):
        problems.append(f'missing {neck[0]} (a classifier file is needed '
                        'for the neck)')
    if problems:
        raise ValueError(
            f'checkpoint does not fit {type(model).__name__} '
            f'({backbone.family}, arch {backbone.arch}): {len(problems)} '
            f'problems, e.g. {"; ".join(problems[:5])}. Use a checkpoint of '
            'the same family and size.')
    out.update(extra)
    return out


# ---------------------------------------------------------------------------
# Pretrained configs and the builder
# ---------------------------------------------------------------------------
def pretrained_cfg(**kwargs: Any) -> Dict[str, Any]:
    """timm's ``_cfg``: the authors' evaluation (their ``data/build.py``):
    resize to a 256x256 square (``crop_mode='squash'``), centre crop 224
    (``crop_pct`` 0.875), bicubic, ImageNet mean/std; PolaFormer's paper
    and license unless overridden."""
    cfg = dict(
        url='', num_classes=1000, input_size=(3, 224, 224),
        pool_size=(7, 7), crop_pct=0.875, crop_mode='squash',
        interpolation='bicubic', fixed_input_size=False,
        mean=IMAGENET_DEFAULT_MEAN, std=IMAGENET_DEFAULT_STD,
        classifier='head.fc', custom_load=True, license='mit',
        paper_ids='arXiv:2501.15061', paper_name=POLA_PAPER)
    cfg.update(kwargs)
    return cfg


def authors_cfg(top1: float, **kwargs: Any) -> Dict[str, Any]:
    """A tag with the authors' published PolaFormer ImageNet-1k weights:
    their Hugging Face repository (``hf_hub_id``, so the tag is in
    ``timm.list_pretrained``); the file itself is passed by the user."""
    return pretrained_cfg(
        hf_hub_id=AUTHORS_HF_HUB_ID, origin_url=AUTHORS_WEIGHTS,
        notes=(f"the authors' ImageNet-1k classifier (their top-1 {top1}); "
               'download it from origin_url and pass '
               'pretrained_cfg_overlay=dict(file=PATH)', ),
        **kwargs)


#: ``notes`` of a model without published weights.
NO_WEIGHTS = ('the authors publish no weights for this model', )


def no_weights_message(name: str, cfg: Dict[str, Any]) -> str:
    """What to do when ``pretrained=True`` has no file to load: where the
    authors publish the weights (or that they publish none) and how to pass
    a downloaded file."""
    where = cfg.get('origin_url')
    notes = ' '.join(cfg.get('notes') or ())
    if where:
        hub = cfg.get('hf_hub_id')
        source = (f"the authors' files are at {where}" +
                  (f" (Hugging Face repository {hub!r})" if hub else '') +
                  ('; extraction code atba' if 'pwd=' in where else '') +
                  '; pola_mm does not download them (their file names are '
                  'not confirmed here)')
        todo = 'Download the ImageNet-1k file once, then pass it'
    else:
        source = notes or 'no weights are published for this model'
        todo = 'To load a file of your own, pass it'
    return (f'{name}: no weight file to load: {source}. {todo}: '
            f'timm.create_model({name!r}, pretrained=True, '
            "pretrained_cfg_overlay=dict(file='/path/to/file.pth'))")


def _check_weight_source(variant: str, cfg: Any,
                         overlay: Optional[Dict[str, Any]]) -> None:
    """Before building a ``pretrained=True`` model: raise a
    ``FileNotFoundError`` naming where to get the weights unless a file, URL
    or state dict is configured (pola_mm never fetches the authors' files
    from a hub)."""
    from timm.models._builder import resolve_pretrained_cfg
    cfg = resolve_pretrained_cfg(variant, pretrained_cfg=cfg,
                                 pretrained_cfg_overlay=overlay).to_dict()
    if not (cfg.get('file') or cfg.get('url') or cfg.get('state_dict')):
        raise FileNotFoundError(no_weights_message(
            cfg.get('architecture') or variant, cfg))


def build_pola_model(cls: Type[PolaClassifier], variant: str,
                     pretrained: bool, **kwargs: Any) -> PolaClassifier:
    """Build ``variant`` with timm's builder. With ``features_only`` the
    backbone is built with outputs (and output norms) at ``out_indices``
    (default every stage), then wrapped by timm's ``FeatureGetterNet`` with
    ``norm=True``, so the features are the mm backbone's outputs."""
    feature_cls = kwargs.get('feature_cls', 'getter')
    if kwargs.get('features_only', False) and not (
            feature_cls == 'getter' or (isinstance(feature_cls, type) and
                                        issubclass(feature_cls,
                                                   FeatureGetterNet))):
        raise ValueError(
            f'{variant}: features_only supports feature_cls="getter" (the '
            f'default: forward_intermediates), not {feature_cls!r}; to '
            'extract by FX node names use torchvision\'s '
            'create_feature_extractor(timm.create_model(...), '
            "return_nodes=[...], tracer_kwargs=dict(leaf_modules="
            'timm.layers.get_notrace_modules(), autowrap_functions='
            'timm.layers.get_notrace_functions()))')
    overlay = kwargs.get('pretrained_cfg_overlay') or {}
    if overlay.get('file') or overlay.get('url'):
        # timm resets custom_load for a user-given file; keep pola_mm's
        # loader (it reads the authors' training files safely)
        kwargs['pretrained_cfg_overlay'] = dict(dict(custom_load=True),
                                                 **overlay)
    if pretrained:
        _check_weight_source(variant, kwargs.get('pretrained_cfg'),
                             kwargs.get('pretrained_cfg_overlay'))
    # the stages' output norms applied, as the mm backbone
    feature_cfg: Dict[str, Any] = dict(feature_cls='getter', norm=True)
    model_cls: Any = cls
    if kwargs.get('features_only', False):
        depths = cls.arch_of(kwargs['arch'])['depths']
        take, _ = feature_take_indices(len(depths),
                                       kwargs.pop('out_indices', None))
        feature_cfg['out_indices'] = tuple(take)
        model_cls = functools.partial(cls, out_indices=tuple(take))
    return build_model_with_cfg(
        model_cls, variant, pretrained,
        pretrained_filter_fn=checkpoint_filter_fn, feature_cfg=feature_cfg,
        **kwargs)
