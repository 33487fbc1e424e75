"""PolaPP: the hierarchical backbone of PolaFormer++ (b0-b5).

Built from :mod:`pola_mm.models.layers` like the other backbones: the stem
and downsampling (:mod:`~pola_mm.models.layers.conv_embed`), blocks and
stages (:mod:`~pola_mm.models.layers.polapp_block`) with PaCS
(:mod:`~pola_mm.models.layers.linear_attention`) or rotary softmax attention
(:mod:`~pola_mm.models.layers.rotary_attention`), the conv FFN
(:mod:`~pola_mm.models.layers.conv_ffn`) and the shared drop path
(:class:`~pola_mm.models.layers.bricks.DropPath`).

Parameter names are the authors' (``patch_embed.proj.*``,
``layers.i.blocks.j.{pos,norm1,attn,norm2,ffn,gamma_1,gamma_2}``,
``layers.i.downsample.{reduction,norm}``, ``extra_norms.i``), so their
checkpoints load as they are.
"""
from typing import Dict, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
from mmengine.model.weight_init import trunc_normal_
from torch import Tensor
from torch.nn.modules.batchnorm import _BatchNorm

from ...registry import register_model
from ...type_aliases import Size2
from ..layers.conv_embed import ConvStem
from ..layers.polapp_block import PolaPPStage, TokenLayerNorm
from ..layers.token_map import to_map, to_tokens
from .base import (PolaBackbone, arch_drop_path, check_out_indices, freeze,
                   linspace, resolve_arch)


@register_model
class PolaPP(PolaBackbone):
    """PolaPP backbone (PolaFormer++), b0-b5, for any input size.

    A convolutional stem (stride 4), four stages of blocks (stages 1-2 PaCS
    polarity linear attention, stages 3-4 softmax attention, both global
    over the stage map with 2-D rotary encoding), stride-2 conv + BN
    downsampling between stages; each returned stage output is normalised by
    ``extra_norms[i]`` (LayerNorm, eps 1e-6; not with
    ``with_extra_norms=False``, the authors' classifier). There are no
    learned tables tied to an input size, so every size runs the published
    computation.

    Output sizes: every stride-2 conv (kernel 3, padding 1) maps a side
    ``s`` to ``ceil(s / 2)``, so stage ``i`` gives
    ``ceil(ceil(H / 2) / 2) ... = ceil(H / 2**(i + 2))`` (e.g. 160x248 ->
    40x62, 20x31, 10x16, 5x8; odd sides round up, as with padding).

    Args:
        arch: ``'b0'``..``'b5'`` or a dict with ``embed_dims``, ``depths``,
            ``num_heads`` (one entry per stage) and optionally
            ``mlp_ratios`` (default 3.5 each), ``layer_scale_init`` (a value
            per stage, None for no layer scale; default none),
            ``attn_layout`` (default ``'LLSS'``) and ``drop_path_rate``
            (default 0.1).
        in_channels: input channels.
        drop_path_rate: stochastic depth over all blocks; None: the arch's
            (the authors' value for b0-b5).
        out_indices: stages returned; only stages up to ``max(out_indices)``
            (and the output norms of ``out_indices``) are built, so every
            parameter gets a gradient.
        frozen_stages: mmdet's meaning: -1 nothing; 0 the stem
            (``patch_embed``); ``k`` also stages 1..k (``layers[0..k-1]``
            with their downsampling) and their ``extra_norms``. Frozen parts
            stay in eval mode.
        norm_eval: keep every BatchNorm (stem and downsampling) in eval mode
            during training (running statistics and affine parameters used
            as loaded; mmdet's convention for small detection batches).
        with_cp: gradient checkpointing per block.
        with_extra_norms: normalise each returned stage by ``extra_norms[i]``
            (the authors' detection / segmentation backbone). False returns
            the stages' raw outputs and builds no ``extra_norms``: the
            authors' ImageNet classifier, which feeds the last stage as it
            is to its head (:class:`~pola_mm.models.necks.PolaPPClsNeck`).
        init_cfg: ``dict(type='Pretrained', checkpoint=PATH[, prefix=...])``:
            the authors' backbone, ImageNet classifier or detector file, an
            mmpretrain/mmdet/mmseg checkpoint or a backbone state dict; a
            checkpoint of another arch raises before any weight is copied.
            A classifier file has no ``extra_norms``: they start fresh.

    Output: tuple of ``(B, embed_dims[i], ceil(H / 2**(i+2)),
    ceil(W / 2**(i+2)))`` maps for ``i`` in ``out_indices``.
    """
    arch_zoo: Dict[str, dict] = {
        'b0': dict(embed_dims=(32, 64, 128, 384), depths=(2, 2, 2, 2),
                   num_heads=(1, 2, 4, 12), layer_scale_init=(1, 1, 1, 1),
                   drop_path_rate=0.1),
        'b1': dict(embed_dims=(32, 64, 192, 384), depths=(2, 2, 4, 2),
                   num_heads=(1, 2, 6, 12), layer_scale_init=(1, 1, 1, 1),
                   drop_path_rate=0.1),
        'b2': dict(embed_dims=(64, 128, 256, 512), depths=(2, 2, 6, 2),
                   num_heads=(1, 2, 4, 8), layer_scale_init=(1, 1, 1, 1),
                   drop_path_rate=0.1),
        'b3': dict(embed_dims=(64, 128, 320, 512), depths=(3, 5, 9, 3),
                   num_heads=(1, 2, 5, 8), layer_scale_init=(1, 1, 1, 1),
                   drop_path_rate=0.15),
        'b4': dict(embed_dims=(96, 192, 384, 512), depths=(4, 6, 12, 6),
                   num_heads=(1, 2, 6, 8),
                   layer_scale_init=(1, 1, 1e-6, 1e-6), drop_path_rate=0.4),
        'b5': dict(embed_dims=(96, 192, 448, 640), depths=(4, 7, 19, 8),
                   num_heads=(1, 2, 7, 10),
                   layer_scale_init=(1e-6, 1e-6, 1e-6, 1e-6),
                   drop_path_rate=0.55),
    }
    _arch_keys = ('embed_dims', 'depths', 'num_heads')
    family = 'PolaPP'

    def __init__(self,
                 arch: Union[str, dict] = 'b2',
                 in_channels: int = 3,
                 drop_path_rate: Optional[float] = None,
                 out_indices: Sequence[int] = (0, 1, 2, 3),
                 frozen_stages: int = -1,
                 norm_eval: bool = False,
                 with_cp: bool = False,
                 with_extra_norms: bool = True,
                 init_cfg: Optional[dict] = None) -> None:
        super().__init__(init_cfg=init_cfg)
        self.in_channels = in_channels
        self.with_extra_norms = with_extra_norms
        arch = resolve_arch(arch, self.arch_zoo, self._arch_keys, type(self))
        dims = tuple(int(c) for c in arch['embed_dims'])
        depths = tuple(int(d) for d in arch['depths'])
        heads = tuple(int(h) for h in arch['num_heads'])
        n = len(depths)
        mlp_ratios = tuple(arch.get('mlp_ratios', (3.5, ) * n))
        ls_init = tuple(arch.get('layer_scale_init', (None, ) * n))
        layout = str(arch.get('attn_layout', 'LLSS'))
        if not all(len(t) == n for t in (dims, heads, mlp_ratios, ls_init,
                                         layout)):
            raise ValueError(
                f'PolaPP arch: embed_dims {dims}, depths {depths}, num_heads '
                f'{heads}, mlp_ratios {mlp_ratios}, layer_scale_init '
                f'{ls_init} and attn_layout {layout!r} need one entry per '
                'stage')
        self.out_indices = check_out_indices(out_indices, n)
        self.frozen_stages = frozen_stages
        self.norm_eval = norm_eval
        self.num_stages = n
        self.num_built = max(self.out_indices) + 1
        self.num_features = list(dims)
        self.arch = dict(embed_dims=dims, depths=depths, num_heads=heads,
                         mlp_ratios=mlp_ratios, layer_scale_init=ls_init,
                         attn_layout=layout)
        self.drop_path_rate = arch_drop_path(arch, drop_path_rate)

        self.patch_embed = ConvStem(in_channels, dims[0])
        dpr = linspace(self.drop_path_rate, sum(depths))
        self.layers = nn.ModuleList()
        for i in range(self.num_built):
            start = sum(depths[:i])
            self.layers.append(PolaPPStage(
                dims[i], depths[i], heads[i], layout[i], mlp_ratios[i],
                dpr[start:start + depths[i]], ls_init[i],
                dims[i + 1] if i + 1 < self.num_built else None, with_cp))
        # indexed like the authors' ModuleList, built for out_indices only
        self.extra_norms = nn.ModuleDict(
            {str(i): TokenLayerNorm(dims[i])
             for i in (self.out_indices if with_extra_norms else ())})
        self._freeze_stages()

    # ------------------------------------------------------------------
    def _init_layer(self, m: nn.Module) -> None:
        """The authors' init: trunc-normal (std .02) conv weights with zero
        biases; Linear and LayerNorm layers PyTorch's default
        (``reset_parameters``). ``gamma`` keeps its layer-scale value."""
        if isinstance(m, nn.Conv2d):
            trunc_normal_(m.weight, std=.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, (nn.Linear, nn.LayerNorm)):
            m.reset_parameters()

    def _expected_missing(self, key: str) -> bool:
        # An ImageNet classifier file (the authors' or pola_mm's) has no
        # output norms: they start fresh, as in the authors' downstream code.
        return key.split('.')[0] == 'extra_norms'

    def _expected_unexpected(self, key: str) -> bool:
        parts = key.split('.')
        if parts[0] == 'layers' and len(parts) > 2 and parts[1].isdigit():
            i = int(parts[1])
            if parts[2] in ('RoPE', 'RoPE_linear'):  # recomputed tables
                return True
            return i >= self.num_built or (i == self.num_built - 1 and
                                           parts[2] == 'downsample')
        if parts[0] == 'extra_norms' and len(parts) > 1 and \
                parts[1].isdigit():
            return parts[1] not in self.extra_norms
        return False

    def _freeze_stages(self) -> None:
        if self.frozen_stages >= 0:
            freeze(self.patch_embed)
        for i in range(1, self.frozen_stages + 1):
            if i - 1 < self.num_built:
                freeze(self.layers[i - 1])
            if str(i - 1) in self.extra_norms:
                freeze(self.extra_norms[str(i - 1)])

    def train(self, mode: bool = True) -> 'PolaPP':
        """Set the mode; frozen stages, and with ``norm_eval`` every
        BatchNorm, stay in eval mode."""
        super().train(mode)
        if mode and self.norm_eval:
            for m in self.modules():
                if isinstance(m, _BatchNorm):
                    m.eval()
        return self

    def _check_batchnorm_input(self, x: Tensor) -> None:
        """In training, the smallest BatchNorm map (after the last built
        downsampling, else the stem) must hold more than one value per
        channel; raise a clear error instead of BatchNorm's. Skipped while
        torch.fx traces (its shapes are symbols then)."""
        if (not self.training or self.norm_eval
                or isinstance(x, torch.fx.Proxy) or x.shape[0] > 1):
            return
        s = 2**(self.num_built + 1) if self.num_built > 1 else 4
        if -(-x.shape[2] // s) * -(-x.shape[3] // s) == 1:
            raise ValueError(
                f'PolaPP: a training batch of one {x.shape[2]}x{x.shape[3]} '
                f'image gives a 1x1 map to a BatchNorm (stride {s}), which '
                'cannot train on one value per channel; use a batch of 2 or '
                f'more, images larger than {s}x{s} pixels on one side, '
                'norm_eval=True, or eval mode')

    def stem(self, x: Tensor) -> Tuple[Tensor, Size2]:
        """The conv stem: image -> stage 0 tokens and grid."""
        self._check_batchnorm_input(x)
        x = self.patch_embed(x)
        return to_tokens(x), (x.shape[2], x.shape[3])

    @property
    def stages(self) -> nn.ModuleList:
        """``layers``: the stages (:class:`PolaPPStage`)."""
        return self.layers

    def downsample(self, i: int, x: Tensor, hw: Size2) -> Tuple[Tensor, Size2]:
        """The downsampling of ``layers[i]``, on the stage's map."""
        x = self.layers[i].downsample(to_map(x, hw))
        return to_tokens(x), (x.shape[2], x.shape[3])

    def out_norm(self, i: int, x: Tensor) -> Tensor:
        """``extra_norms[i]`` with ``with_extra_norms``."""
        key = str(i)
        return self.extra_norms[key](x) if key in self.extra_norms else x
