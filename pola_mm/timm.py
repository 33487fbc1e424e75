"""Pola-Swin, Pola-PVT and PolaPP (PolaFormer++) as timm models.

``import pola_mm.timm`` registers, in timm's model registry:

- ``pola_swin_tiny``, ``pola_swin_small``, ``pola_swin_base`` (224) and
  ``pola_swin_base_384`` (384, polarity window 96, the authors' fine-tune
  setting), aliases ``pola_swin_t``, ``pola_swin_s``, ``pola_swin_b``;
- ``pola_pvt_tiny``, ``pola_pvt_small``, ``pola_pvt_medium``,
  ``pola_pvt_large``, aliases ``pola_pvt_t``, ``pola_pvt_s``, ``pola_pvt_m``,
  ``pola_pvt_l``;
- ``polapp_b1`` ... ``polapp_b5`` (and every other ``b*`` arch of
  :class:`~pola_mm.models.PolaPP`), the authors' PolaFormer++ ImageNet
  classifiers.

Each model holds pola_mm's backbone (the same code the OpenMMLab configs
build: :class:`~pola_mm.models.PolaSwinTransformer`,
:class:`~pola_mm.models.PolaPVT`, :class:`~pola_mm.models.PolaPP`) as
``backbone`` and timm's ``ClassifierHead`` as ``head`` (PolaPP also the
authors' ``proj``/``norm``/Swish as ``neck``,
:class:`~pola_mm.models.PolaPPClsNeck`). The state dict is mmpretrain's
classifier layout (``backbone.*``, ``neck.*``, ``head.fc.*``), so a
checkpoint converted for the in1k configs loads as it is, and
:func:`checkpoint_filter_fn` converts the authors' files (recognised by their
sentinel key, through :func:`~pola_mm.models.convert_official_checkpoint`).

The stage loop (stem, stages, output norms) is written here over the
backbone's own modules, as timm writes ``forward_intermediates``: every
computation stays in the backbone's modules. Stage ``i``'s intermediate is
its raw output; with ``norm=True`` the model's output norm of that stage is
applied where it has one (a classifier: only the last stage's, the authors'
final norm ``norm3`` of Pola-Swin; a ``features_only`` model: the output norm
of every returned stage, so it returns exactly what the mm backbone returns).

torch.fx: the modules whose forward branches on sizes (patch embedding,
patch merging, the blocks) are registered with timm's
``register_notrace_module`` and the position-table resize with
``register_notrace_function``, so timm's and torchvision's feature extractors
trace the models with the blocks as leaves.
"""
import contextlib
import functools
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

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
from timm.models import (build_model_with_cfg, register_model,
                         register_notrace_function, register_notrace_module)
from timm.models._features import FeatureGetterNet, feature_take_indices
from timm.models._registry import generate_default_cfgs
from torch import Tensor

from .models import PolaPP, PolaPPClsNeck, PolaPVT, PolaSwinTransformer
from .models.backbones.base import PreNormBlock, check_input, resolve_arch
from .models.layers import PolaPPBlock, to_map, to_tokens
from .models.checkpoint import (adapt_pos_tables, backbone_state_dict,
                                convert_official_checkpoint,
                                extract_state_dict, load_checkpoint_file)
from .models.layers import PatchEmbed, PatchMerging
from .models.layers.position import resize_pos_table
from .type_aliases import Size2

__all__ = ['PolaClassifier', 'PolaSwin', 'PolaPVTClassifier',
           'PolaPPClassifier', 'checkpoint_filter_fn']

#: Where the authors publish their PolaFormer ImageNet-1k files.
AUTHORS_WEIGHTS = 'https://huggingface.co/ZachMeng/PolaFormer/tree/main'
#: The Hugging Face repository of those files (named by the authors' README).
AUTHORS_HF_HUB_ID = 'ZachMeng/PolaFormer'
#: Where the authors publish their PolaFormer++ (PolaPP) ImageNet-1k files
#: (Baidu Pan, extraction code ``atba``, per their README).
POLAPP_WEIGHTS = 'https://pan.baidu.com/s/1tjG-Qq2zFwN_HZswAzxarQ?pwd=atba'

# torch.fx: leaves of the trace (their forwards branch on sizes or dispatch
# at run time) and a function called as a whole. Registered once, globally
# (timm's registry), for every tracer that asks timm for them.
for _leaf in (PatchEmbed, PatchMerging, PreNormBlock, PolaPPBlock):
    register_notrace_module(_leaf)
register_notrace_function(resize_pos_table)
register_notrace_function(check_input)


@contextlib.contextmanager
def _default_device(device: Optional[Union[str, torch.device]]
                    ) -> Iterator[None]:
    """Build under ``torch.device(device)`` (timm's ``device=`` factory
    argument); nothing changes for ``None``."""
    if device is None:
        yield
    else:
        with torch.device(device):
            yield


class PolaClassifier(nn.Module):
    """An ImageNet classifier over a Pola backbone, with timm's interface.

    ``forward_features`` gives the last map ``(B, num_features, H/32,
    W/32)`` (Pola-Swin: after the final norm ``norm3``; PolaPP: after the
    authors' ``proj``/``norm``/Swish), ``forward_head`` pools it
    (``global_pool``) and applies ``head.fc``; with the authors' weights this
    is the published classifier.

    Args:
        arch: the backbone's ``arch`` (a name or a dict).
        num_classes: classes of ``head.fc``; 0 for none.
        global_pool: timm pooling type (``'avg'``, ``'max'``, ``''``, ...).
        in_chans: input channels.
        img_size: pre-training image size (the grids of the learned tables).
        drop_rate: dropout before ``head.fc``.
        drop_path_rate: stochastic depth of the backbone.
        out_indices: ``None`` for the classifier (all stages, the output norm
            of the last one); a ``features_only`` model passes the stages it
            returns (stages up to the last of them are built, each with its
            output norm, as the mm backbone).
        device: where to create parameters and buffers (timm's factory
            argument).
        dtype: their floating-point type.
        **backbone_kwargs: any other argument of the backbone (``alpha``,
            ``attn_layout``, ``window_size``, ``with_cp``, ...); an unknown
            one raises ``TypeError``.
    """

    backbone_cls: type  # set by each family

    def __init__(self,
                 arch: Union[str, dict],
                 num_classes: int = 1000,
                 global_pool: str = 'avg',
                 in_chans: int = 3,
                 img_size: Union[int, Sequence[int]] = 224,
                 drop_rate: float = 0.,
                 drop_path_rate: Optional[float] = 0.1,
                 out_indices: Optional[Sequence[int]] = None,
                 device: Optional[Union[str, torch.device]] = None,
                 dtype: Optional[torch.dtype] = None,
                 **backbone_kwargs: Any) -> None:
        super().__init__()
        num_stages = len(self.arch_of(arch)['depths'])
        self.features_mode = out_indices is not None
        if out_indices is None:  # the classifier: the last stage's norm
            out_indices = (num_stages - 1, )
        self.num_classes = num_classes
        self.global_pool = global_pool
        self.in_chans = in_chans
        self.drop_rate = drop_rate
        self.output_fmt = 'NCHW'
        with _default_device(device):
            self.backbone = self._build_backbone(
                arch, in_chans=in_chans, img_size=img_size,
                drop_path_rate=drop_path_rate,
                out_indices=tuple(out_indices), **backbone_kwargs)
            self.num_stages = self.backbone.num_stages
            self._build_extra()
            self.grad_checkpointing = bool(
                backbone_kwargs.get('with_cp', False))
            reductions = self._reductions(backbone_kwargs)
            self.feature_info = [
                dict(num_chs=self.backbone.num_features[i],
                     reduction=reductions[i], module=self._stage_module(i))
                for i in range(self.num_stages)
            ]
            self.num_features = self.head_hidden_size = self._final_chs()
            self.head = ClassifierHead(self.num_features, num_classes,
                                       pool_type=global_pool,
                                       drop_rate=drop_rate)
            self.backbone.init_weights()
            self._init_extra()
            self._init_head()
        if dtype is not None:
            self.to(dtype)

    @classmethod
    def arch_of(cls, arch: Union[str, dict]) -> dict:
        """The backbone's resolved ``arch`` dict (``depths``, ...)."""
        bb = cls.backbone_cls
        return resolve_arch(arch, bb.arch_zoo, bb._arch_keys, bb)

    # -- family specifics ------------------------------------------------
    def _build_backbone(self, arch: Union[str, dict], in_chans: int,
                        img_size: Union[int, Sequence[int]],
                        drop_path_rate: Optional[float],
                        out_indices: Tuple[int, ...],
                        **kwargs: Any) -> nn.Module:
        return self.backbone_cls(
            arch=arch, in_channels=in_chans, pretrain_img_size=img_size,
            drop_path_rate=drop_path_rate, out_indices=out_indices, **kwargs)

    def _build_extra(self) -> None:
        """Modules between the last stage and the head (PolaPP's neck)."""

    def _init_extra(self) -> None:
        """Init of :meth:`_build_extra`'s modules."""

    def _reductions(self, backbone_kwargs: Dict[str, Any]) -> List[int]:
        """Stride of each stage's output."""
        raise NotImplementedError

    def _stage_module(self, i: int) -> str:
        """Name of stage ``i``'s module (timm's ``feature_info``)."""
        raise NotImplementedError

    def first_conv_name(self) -> str:
        """Name of the first convolution (the patch embedding)."""
        raise NotImplementedError

    def _final_chs(self) -> int:
        """Channels of :meth:`forward_features`' output."""
        return self.backbone.num_features[self.backbone.num_built - 1]

    def _stem(self, x: Tensor) -> Tuple[Tensor, Size2]:
        """``(B, Cin, H, W)`` -> what stage 0 takes, and its grid."""
        raise NotImplementedError

    def _stage(self, i: int, x: Tensor, hw: Size2
               ) -> Tuple[Tensor, Size2, Tensor, Size2]:
        """Stage ``i``: its raw output tokens ``(B, H_i * W_i, C_i)`` with
        their grid, and the input of stage ``i + 1`` with its grid."""
        raise NotImplementedError

    def _stages(self, x: Tensor, hw: Size2) -> Tuple[Tensor, Size2]:
        """Every built stage on :meth:`_stem`'s output: the last stage's raw
        output tokens and grid. (A family whose :meth:`_stage` indexes a
        ``ModuleList`` by ``i``, which TorchScript cannot compile, loops
        over the list instead.)"""
        out, out_hw = x, hw
        for i in range(self.backbone.num_built):
            out, out_hw, x, hw = self._stage(i, x, hw)
        return out, out_hw

    def _out_norm(self, i: int, tokens: Tensor) -> Tensor:
        """The output norm of stage ``i`` on its raw tokens, where the
        model has one (else ``tokens``)."""
        return tokens

    def _final(self, tokens: Tensor, hw: Size2) -> Tensor:
        """The last stage's raw tokens -> :meth:`forward_features`' map
        (through the output norm of the last stage where there is one)."""
        tokens = self._out_norm(self.backbone.num_built - 1, tokens)
        return self._neck(to_map(tokens, hw))

    def _neck(self, x: Tensor) -> Tensor:
        """The last stage's map -> :meth:`forward_features`' output."""
        return x.contiguous()

    def _prune_after(self, last: int) -> None:
        """Remove the stages after ``last`` (and ``last``'s downsampling,
        whose output nothing uses any more)."""
        raise NotImplementedError

    def _prune_norms(self) -> None:
        """Remove the output norms (and whatever follows the last stage)."""

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
            if isinstance(m, (PreNormBlock, PolaPPBlock)):
                m.with_cp = enable

    @torch.jit.ignore
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
            ``[(B, C_i, ceil(H / r_i), ceil(W / r_i))]`` for the stages
            asked for (``r_i`` the stage's reduction; NHWC permuted),
            preceded by :meth:`forward_features`' output unless
            ``intermediates_only``.
        """
        if output_fmt not in ('NCHW', 'NHWC'):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NHWC', got "
                             f'{output_fmt!r}')
        take, max_index = self._take(indices)
        check_input(x, self.in_chans, type(self).__name__)
        return self._intermediates(x, take, max_index, norm, stop_early,
                                   output_fmt, intermediates_only)

    def _intermediates(self, x: Tensor, take: List[int], max_index: int,
                       norm: bool, stop_early: bool, output_fmt: str,
                       intermediates_only: bool
                       ) -> Union[List[Tensor], Tuple[Tensor, List[Tensor]]]:
        """:meth:`forward_intermediates` after its checks."""
        last = self.backbone.num_built - 1
        stop = max_index if (stop_early or intermediates_only) else last
        inter: List[Tensor] = []
        x, hw = self._stem(x)
        out, out_hw = x, hw
        for i in range(stop + 1):
            out, out_hw, x, hw = self._stage(i, x, hw)
            if i in take:
                t = self._out_norm(i, out) if norm else out
                t = to_map(t, out_hw)
                if output_fmt == 'NHWC':
                    t = t.permute(0, 2, 3, 1)
                inter.append(t.contiguous())
        if intermediates_only:
            return inter
        if stop < last:
            return to_map(out, out_hw).contiguous(), inter
        return self._final(out, out_hw), inter

    def prune_intermediate_layers(self,
                                  indices: Union[int, Sequence[int]] = 1,
                                  prune_norm: bool = False,
                                  prune_head: bool = True) -> List[int]:
        """Keep what ``indices`` need (timm's feature extraction): stages
        after the last index are removed (with that stage's downsampling);
        ``prune_norm`` removes the output norms (and PolaPP's neck);
        ``prune_head`` the head (no classes, no pooling). Returns the
        absolute indices."""
        take, max_index = self._take(indices)
        if max_index < self.backbone.num_built - 1:
            self._prune_after(max_index)
        if prune_norm:
            self._prune_norms()
        self.num_features = self.head_hidden_size = self._final_chs()
        if prune_head:
            self.reset_classifier(0, '')
        elif self.head.in_features != self.num_features:
            self.reset_classifier(self.num_classes)
        return take

    def forward_features(self, x: Tensor) -> Tensor:
        """``(B, in_chans, H, W)`` -> the last map
        ``(B, num_features, ceil(H / 32), ceil(W / 32))``."""
        if torch.jit.is_scripting():
            check_input(x, self.in_chans, 'the model')
        else:
            check_input(x, self.in_chans, type(self).__name__)
        x, hw = self._stem(x)
        out, out_hw = self._stages(x, hw)
        return self._final(out, out_hw)

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

        Raises:
            FileNotFoundError: ``checkpoint_path`` is no file, e.g. the
                Hugging Face repository id timm passes when no ``file`` was
                given (the authors' file names there are not confirmed):
                the message says where to download and how to pass the file.
        """
        import os.path as osp
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

    def _stem(self, x: Tensor) -> Tuple[Tensor, Size2]:
        x, hw = self.backbone.patch_embed(x)
        return self.backbone.drop_after_pos(x), hw

    def _stage(self, i: int, x: Tensor, hw: Size2
               ) -> Tuple[Tensor, Size2, Tensor, Size2]:
        return self.backbone.layers[i](x, hw)

    def _stages(self, x: Tensor, hw: Size2) -> Tuple[Tensor, Size2]:
        out, out_hw = x, hw
        for layer in self.backbone.layers:
            out, out_hw, x, hw = layer(x, hw)
        return out, out_hw

    def _out_norm(self, i: int, tokens: Tensor) -> Tensor:
        return self.backbone.out_norm(i, tokens)

    def _prune_after(self, last: int) -> None:
        bb = self.backbone
        bb.layers = bb.layers[:last + 1]
        bb.layers[last].downsample = None
        for i in range(last + 1, bb.num_stages):
            if hasattr(bb, f'norm{i}'):
                delattr(bb, f'norm{i}')
        bb.num_built = last + 1
        bb.window_sizes = bb.window_sizes[:last + 1]
        bb.out_indices = tuple(i for i in bb.out_indices if i <= last)

    def _prune_norms(self) -> None:
        bb = self.backbone
        for i in range(bb.num_stages):
            if hasattr(bb, f'norm{i}'):
                delattr(bb, f'norm{i}')


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

    def _stem(self, x: Tensor) -> Tuple[Tensor, Size2]:
        return x, (0, 0)  # each PVT stage has its own patch embedding

    def _stage(self, i: int, x: Tensor, hw: Size2
               ) -> Tuple[Tensor, Size2, Tensor, Size2]:
        x, hw = self.backbone.stage(i, x)
        return x, hw, to_map(x, hw), hw

    def _prune_after(self, last: int) -> None:
        bb = self.backbone
        for i in range(last + 1, bb.num_built):
            for name in ('patch_embed', 'pos_embed', 'pos_drop', 'block'):
                delattr(bb, f'{name}{i + 1}')
        bb.num_built = last + 1
        bb.ref_grids = bb.ref_grids[:last + 1]
        bb.out_indices = tuple(i for i in bb.out_indices if i <= last)


class PolaPPClassifier(PolaClassifier):
    """The authors' PolaFormer++ ImageNet classifier (their ``POLA_b*``) for
    timm: :class:`~pola_mm.models.PolaPP` without output norms
    (``with_extra_norms=False``), then ``neck`` (the authors' ``proj`` 1x1
    conv to ``projection`` channels, ``norm`` BatchNorm, Swish:
    :class:`~pola_mm.models.PolaPPClsNeck`'s modules) as the end of
    :meth:`forward_features`, then average pooling and ``head.fc`` (their
    1x1-conv head). A ``features_only`` model has no neck and the output
    norms ``extra_norms`` of its stages (the mm backbone's outputs).

    Args:
        projection: the authors' ``projection`` (2048; 2560 for b5).
        img_size: accepted for timm's interface; PolaPP has no learned tables
            tied to an input size.
        (the rest as :class:`PolaClassifier`; ``drop_path_rate=None`` is the
        arch's, the authors' value.)
    """

    backbone_cls = PolaPP

    def __init__(self, arch: Union[str, dict], projection: int = 2048,
                 **kwargs: Any) -> None:
        self.projection = projection
        super().__init__(arch, **kwargs)

    def _build_backbone(self, arch: Union[str, dict], in_chans: int,
                        img_size: Union[int, Sequence[int]],
                        drop_path_rate: Optional[float],
                        out_indices: Tuple[int, ...],
                        **kwargs: Any) -> nn.Module:
        return PolaPP(arch=arch, in_channels=in_chans,
                      drop_path_rate=drop_path_rate, out_indices=out_indices,
                      with_extra_norms=self.features_mode, **kwargs)

    def _build_extra(self) -> None:
        self.neck = None if self.features_mode else PolaPPClsNeck(
            self.backbone.num_features[-1], self.projection)

    def _init_extra(self) -> None:
        if self.neck is not None:
            self.neck.init_weights()

    def _final_chs(self) -> int:
        if self.neck is not None:
            return self.neck.out_channels
        return super()._final_chs()

    def _reductions(self, backbone_kwargs: Dict[str, Any]) -> List[int]:
        return [2**(i + 2) for i in range(self.num_stages)]

    def _stage_module(self, i: int) -> str:
        return f'backbone.layers.{i}'

    def first_conv_name(self) -> str:
        return 'backbone.patch_embed.proj.0'

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> Dict[str, Any]:
        return dict(stem=r'^backbone\.patch_embed',
                    blocks=[(r'^backbone\.layers\.(\d+)', None),
                            (r'^backbone\.extra_norms\.(\d+)', None),
                            (r'^neck', (99999, ))])

    def _stem(self, x: Tensor) -> Tuple[Tensor, Size2]:
        x = self.backbone.patch_embed(x)
        return to_tokens(x), (x.shape[2], x.shape[3])

    def _stage(self, i: int, x: Tensor, hw: Size2
               ) -> Tuple[Tensor, Size2, Tensor, Size2]:
        return self.backbone.layers[i].forward_and_downsample(x, hw)

    def _stages(self, x: Tensor, hw: Size2) -> Tuple[Tensor, Size2]:
        out, out_hw = x, hw
        for layer in self.backbone.layers:
            out, out_hw, x, hw = layer.forward_and_downsample(x, hw)
        return out, out_hw

    def _out_norm(self, i: int, tokens: Tensor) -> Tensor:
        for key, norm in self.backbone.extra_norms.items():
            if key == str(i):
                tokens = norm(tokens)
        return tokens

    def _neck(self, x: Tensor) -> Tensor:
        if self.neck is None:
            return x.contiguous()
        return self.neck.act(self.neck.norm(self.neck.proj(x)))

    def _prune_after(self, last: int) -> None:
        bb = self.backbone
        bb.layers = bb.layers[:last + 1]
        bb.layers[last].downsample = None
        for key in [k for k in bb.extra_norms if int(k) > last]:
            del bb.extra_norms[key]
        bb.num_built = last + 1
        bb.out_indices = tuple(i for i in bb.out_indices if i <= last)
        self.neck = None

    def _prune_norms(self) -> None:
        bb = self.backbone
        for key in list(bb.extra_norms):
            del bb.extra_norms[key]
        self.neck = None


# ---------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------
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
# Pretrained configs and registration
# ---------------------------------------------------------------------------
POLA_PAPER = ('PolaFormer: Polarity-aware Linear Attention for Vision '
              'Transformers')
POLAPP_PAPER = ('PolaFormer++: Polarity-aware Linear Attention with '
                'Channel-wise Spikiness')


def _cfg(**kwargs: Any) -> Dict[str, Any]:
    """The authors' evaluation (their ``data/build.py``): resize to a
    256x256 square (``crop_mode='squash'``), centre crop 224 (``crop_pct``
    0.875), bicubic, ImageNet mean/std."""
    cfg = dict(
        url='', num_classes=1000, input_size=(3, 224, 224),
        pool_size=(7, 7), crop_pct=0.875, crop_mode='squash',
        interpolation='bicubic', fixed_input_size=False,
        mean=IMAGENET_DEFAULT_MEAN, std=IMAGENET_DEFAULT_STD,
        classifier='head.fc', custom_load=True, license='mit',
        paper_ids='arXiv:2501.15061', paper_name=POLA_PAPER)
    cfg.update(kwargs)
    return cfg


def _authors(top1: float, **kwargs: Any) -> Dict[str, Any]:
    """A tag with the authors' published PolaFormer ImageNet-1k weights:
    their Hugging Face repository (``hf_hub_id``, so the tag is in
    ``timm.list_pretrained``); the file itself is passed by the user."""
    return _cfg(
        hf_hub_id=AUTHORS_HF_HUB_ID, origin_url=AUTHORS_WEIGHTS,
        notes=(f"the authors' ImageNet-1k classifier (their top-1 {top1}); "
               'download it from origin_url and pass '
               'pretrained_cfg_overlay=dict(file=PATH)', ),
        **kwargs)


def _polapp(top1: Optional[float], **kwargs: Any) -> Dict[str, Any]:
    """A PolaPP tag: the authors' PolaFormer++ ImageNet-1k classifier, whose
    files are on Baidu Pan only (``origin_url``)."""
    note = (f"the authors' ImageNet-1k classifier (their top-1 {top1}); "
            if top1 is not None else "the authors' classifier; ")
    return _cfg(
        first_conv='backbone.patch_embed.proj.0', license=None,
        paper_ids=None, paper_name=POLAPP_PAPER, origin_url=POLAPP_WEIGHTS,
        notes=(note + 'download it from origin_url (extraction code atba) '
               'and pass pretrained_cfg_overlay=dict(file=PATH); the '
               "authors' repository has no license file", ),
        **kwargs)


_SWIN = dict(first_conv='backbone.patch_embed.proj')
_PVT = dict(first_conv='backbone.patch_embed1.proj')
_NO_WEIGHTS = ('the authors publish no weights for this model', )

#: The authors' PolaFormer++ top-1 (README) per PolaPP arch.
POLAPP_TOP1 = {'b0': 76.9, 'b1': 79.1, 'b2': 82.8, 'b3': 84.3, 'b4': 85.4,
               'b5': 85.6}
#: The authors' ``projection`` of each PolaPP classifier (models/pola.py).
POLAPP_PROJECTION = {'b5': 2560}
#: PolaPP archs registered: every ``b<digit>`` of the backbone's zoo.
POLAPP_ARCHS = sorted(a for a in PolaPP.arch_zoo
                      if len(a) == 2 and a[0] == 'b' and a[1].isdigit())

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
    **{f'polapp_{a}.in1k': _polapp(POLAPP_TOP1.get(a))
       for a in POLAPP_ARCHS},
})


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


def _check_weight_source(variant: str, pretrained_cfg: Any,
                         overlay: Optional[Dict[str, Any]]) -> None:
    """Before building a ``pretrained=True`` model: raise a
    ``FileNotFoundError`` naming where to get the weights unless a file, URL
    or state dict is configured (pola_mm never fetches the authors' files
    from a hub)."""
    from timm.models._builder import resolve_pretrained_cfg
    cfg = resolve_pretrained_cfg(variant, pretrained_cfg=pretrained_cfg,
                                 pretrained_cfg_overlay=overlay).to_dict()
    if not (cfg.get('file') or cfg.get('url') or cfg.get('state_dict')):
        raise FileNotFoundError(no_weights_message(
            cfg.get('architecture') or variant, cfg))


def _create(cls: type, variant: str, pretrained: bool,
            **kwargs: Any) -> nn.Module:
    """Build ``variant`` with timm's builder. With ``features_only`` the
    backbone is built with outputs (and output norms) at ``out_indices``
    (default all stages), then wrapped by timm's ``FeatureGetterNet`` with
    ``norm=True``, so the features are the mm backbone's outputs."""
    # the stages' output norms applied, as the mm backbone
    feature_cfg: Dict[str, Any] = dict(feature_cls='getter', norm=True)
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
    model_cls: Any = cls
    overlay = kwargs.get('pretrained_cfg_overlay') or {}
    if overlay.get('file') or overlay.get('url'):
        # timm resets custom_load for a user-given file; keep pola_mm's
        # loader (it reads the authors' training files safely)
        kwargs['pretrained_cfg_overlay'] = dict(overlay)
        kwargs['pretrained_cfg_overlay'].setdefault('custom_load', True)
    if pretrained:
        _check_weight_source(variant, kwargs.get('pretrained_cfg'),
                             kwargs.get('pretrained_cfg_overlay'))
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
    **{f'polapp_{a}': (PolaPPClassifier, a, dict(
        drop_path_rate=None, projection=POLAPP_PROJECTION.get(a, 2048)))
       for a in POLAPP_ARCHS},
}

#: short name -> timm name.
ALIASES: Dict[str, str] = {
    'pola_swin_t': 'pola_swin_tiny', 'pola_swin_s': 'pola_swin_small',
    'pola_swin_b': 'pola_swin_base', 'pola_pvt_t': 'pola_pvt_tiny',
    'pola_pvt_s': 'pola_pvt_small', 'pola_pvt_m': 'pola_pvt_medium',
    'pola_pvt_l': 'pola_pvt_large',
}

_FAMILY_NAMES = {PolaSwin: 'Pola-Swin', PolaPVTClassifier: 'Pola-PVT',
                 PolaPPClassifier: 'PolaFormer++ PolaPP'}


def _entrypoint(name: str, variant: str) -> Any:
    cls, arch, defaults = MODEL_ARGS[variant]

    def create(pretrained: bool = False, **kwargs: Any) -> nn.Module:
        args = dict(defaults, arch=arch)
        args.update(kwargs)
        return _create(cls, variant, pretrained, **args)

    create.__name__ = create.__qualname__ = name
    create.__module__ = __name__
    create.__doc__ = (f'{_FAMILY_NAMES[cls]} {arch} ({variant}) as a timm '
                      'model.')
    return create


for _name in list(MODEL_ARGS) + list(ALIASES):
    globals()[_name] = register_model(
        _entrypoint(_name, ALIASES.get(_name, _name)))
