"""Pola-PVT: Pyramid Vision Transformer, polarity-aware linear attention."""
from functools import partial
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
from mmengine.model.weight_init import trunc_normal_
from torch import Tensor

from ...ops.position import resize_pos_table
from ...registry import register_model
from ...type_aliases import Size2
from ..layers import (PatchEmbed, PolarityAttention, SpatialReductionAttention,
                      to_map)
from ..layers.bricks import build_attention
from .base import (PolaBackbone, PreNormBlock, arch_drop_path,
                   check_out_indices, freeze, linspace, pair, resolve_arch)

# torch.fx: the table resize (it branches on the grid) is one node of a
# traced graph; PolaPVT.embed, which calls it, is traced through
torch.fx.wrap('resize_pos_table')


class PolaPVTStage(nn.ModuleList):
    """The blocks of one stage (the authors' ``block{i}`` list, so its keys
    are theirs: ``block1.0.attn...``); :meth:`forward` runs them. The
    stage's entry (``patch_embed{i}``, ``pos_embed{i}``) is the backbone's
    (:meth:`PolaPVT.embed`)."""

    def forward(self, x: Tensor, hw: Size2) -> Tensor:
        """Tokens ``(B, H * W, C)`` on ``hw`` -> the blocks' output, same
        shape."""
        for block in self:
            x = block(x, hw)
        return x


class PolaPVTBlock(PreNormBlock):
    """PVT block: ``x + attn(norm1(x))``, ``x + mlp(norm2(x))``.

    ``'L'``: polarity attention over all tokens of the stage (``qg``, ``kv``
    projections, ``positional_encoding`` on the stage's 224 grid (divided
    by ``la_sr_ratio``), resized bilinearly at other sizes).
    ``'S'``: PVT's spatial-reduction softmax attention.
    """

    def __init__(self,
                 embed_dims: int,
                 num_heads: int,
                 ref_hw: Size2,
                 mlp_ratio: float,
                 attn_type: str = 'L',
                 sr_ratio: int = 1,
                 qkv_bias: bool = True,
                 alpha: float = 4,
                 kernel_size: int = 5,
                 drop_rate: float = 0.,
                 attn_drop_rate: float = 0.,
                 drop_path_rate: float = 0.,
                 act_cfg: Optional[dict] = None,
                 norm_cfg: Optional[dict] = None,
                 with_cp: bool = False,
                 feature_map: str = 'power',
                 la_sr_ratio: int = 1,
                 init_cfg: Optional[dict] = None) -> None:
        act_cfg = dict(type='GELU') if act_cfg is None else act_cfg
        norm_cfg = dict(type='LN', eps=1e-6) if norm_cfg is None else norm_cfg
        # the norm after ``sr`` of 'S' is the authors' nn.LayerNorm(dim)
        # (default eps), not the blocks' eps 1e-6
        attn = build_attention(attn_type, {
            'L': partial(PolarityAttention, embed_dims, num_heads,
                         (ref_hw[0] // la_sr_ratio, ref_hw[1] // la_sr_ratio),
                         fused_qkvg=False, qkv_bias=qkv_bias, alpha=alpha,
                         kernel_size=kernel_size, attn_drop=attn_drop_rate,
                         proj_drop=drop_rate, feature_map=feature_map,
                         sr_ratio=la_sr_ratio, interpolate_mode='bilinear'),
            'S': partial(SpatialReductionAttention, embed_dims, num_heads,
                         sr_ratio, qkv_bias=qkv_bias,
                         attn_drop=attn_drop_rate, proj_drop=drop_rate,
                         norm_cfg=dict(type='LN'))})
        super().__init__(embed_dims, attn, mlp_ratio, drop_rate,
                         drop_path_rate, act_cfg, norm_cfg, with_cp,
                         init_cfg=init_cfg)


@register_model
class PolaPVT(PolaBackbone):
    """Pola-PVT backbone (PolaFormer, ICLR 2025) for any input size.

    Stage ``i`` (1-based, the authors' names): ``patch_embed{i}`` (a strided
    conv that drops the bottom/right remainder, as the authors'; a side
    shorter than one patch is padded to one patch, so tiny inputs still
    work), plus the learned ``pos_embed{i}`` (resized bilinearly from its
    224 grid, as the authors' ``_get_pos_embed``, when the stage grid
    differs), dropout, the blocks
    ``block{i}``, then the tokens are laid out as NCHW for the next stage.
    At 224 this is exactly the published model. There are no output norms:
    the published classifier does not apply the final ``norm`` (the
    converter drops it).

    Args:
        arch: ``'tiny'``/``'small'``/``'medium'``/``'large'`` (``'t'``/``'s'``/
            ``'m'``/``'l'``) or a dict with ``embed_dims``, ``depths``,
            ``num_heads``, ``mlp_ratios`` (one entry per stage) and
            optionally ``drop_path_rate``.
        pretrain_img_size: pre-training image size (grid of the tables).
        in_channels: input channels.
        patch_sizes: patch size per stage.
        attn_layout: ``'L'`` polarity / ``'S'`` spatial-reduction softmax.
        sr_ratios: spatial reduction of ``'S'`` stages.
        qkv_bias, alpha, kernel_size: attention options.
        drop_rate, attn_drop_rate: dropout rates.
        drop_path_rate: stochastic depth, linearly spaced over all blocks;
            None: the arch's (the authors' ImageNet value: 0.1 for T and S,
            0.3 for M and L; 0.1 for an arch dict without one).
        out_indices: stages returned (0-based); only stages up to
            ``max(out_indices)`` are built.
        frozen_stages: mmdet's meaning: -1 nothing; 0 ``patch_embed1`` and
            ``pos_embed1``; ``k`` also stages 1..k (their patch embedding,
            ``pos_embed`` and blocks). Frozen parts stay in eval mode.
        with_cp: gradient checkpointing per block.
        norm_cfg: norm of the blocks (LayerNorm eps 1e-6); the patch
            embeddings use LayerNorm with the default eps.
        act_cfg: MLP activation.
        feature_map: of the polarity stages, ``'power'`` (PolaFormer) or
            ``'pacs'`` (PolaFormer++'s PaCS, see
            :class:`~pola_mm.models.layers.PolarityAttention`).
        la_sr_ratios: the authors' spatial reduction of keys and values
            inside the polarity attention, one per stage (their
            ``la_sr_ratios``, e.g. ``(8, 4, 2, 1)``; ``(1, 1, 1, 1)`` in
            every published model).
        init_cfg: ``dict(type='Pretrained', checkpoint=PATH[, prefix=...])``.

    Output: tuple of ``(B, embed_dims[i], H_i, W_i)`` with strides 4, 8, 16,
    32 (for the default patch sizes): ``H_1 = floor(H / 4)``, ``H_{i+1} =
    floor(H_i / 2)`` (at least 1), likewise ``W``.
    """
    # drop_path_rate: the authors' ImageNet value (their configs)
    _common = dict(embed_dims=(64, 128, 320, 512), num_heads=(1, 2, 5, 8),
                   mlp_ratios=(8, 8, 4, 4))
    arch_zoo: Dict[str, dict] = {
        **dict.fromkeys(['t', 'tiny'], dict(_common, depths=(2, 2, 2, 2),
                                            drop_path_rate=0.1)),
        **dict.fromkeys(['s', 'small'], dict(_common, depths=(3, 4, 6, 3),
                                             drop_path_rate=0.1)),
        **dict.fromkeys(['m', 'medium'], dict(_common, depths=(3, 4, 18, 3),
                                              drop_path_rate=0.3)),
        **dict.fromkeys(['l', 'large'], dict(_common, depths=(3, 8, 27, 3),
                                             drop_path_rate=0.3)),
    }
    _arch_keys = ('embed_dims', 'depths', 'num_heads', 'mlp_ratios')
    family = 'Pola-PVT'

    def __init__(self,
                 arch: Union[str, dict] = 'tiny',
                 pretrain_img_size: Union[int, Sequence[int]] = 224,
                 in_channels: int = 3,
                 patch_sizes: Sequence[int] = (4, 2, 2, 2),
                 attn_layout: str = 'LLLL',
                 sr_ratios: Sequence[int] = (8, 4, 2, 1),
                 qkv_bias: bool = True,
                 alpha: float = 4,
                 kernel_size: int = 5,
                 drop_rate: float = 0.,
                 attn_drop_rate: float = 0.,
                 drop_path_rate: Optional[float] = None,
                 out_indices: Sequence[int] = (0, 1, 2, 3),
                 frozen_stages: int = -1,
                 with_cp: bool = False,
                 norm_cfg: Optional[dict] = None,
                 act_cfg: Optional[dict] = None,
                 feature_map: str = 'power',
                 la_sr_ratios: Sequence[int] = (1, 1, 1, 1),
                 init_cfg: Optional[dict] = None) -> None:
        norm_cfg = dict(type='LN', eps=1e-6) if norm_cfg is None else norm_cfg
        act_cfg = dict(type='GELU') if act_cfg is None else act_cfg
        super().__init__(init_cfg=init_cfg)
        self.in_channels = in_channels
        if isinstance(la_sr_ratios, str):  # the authors' '8421'
            la_sr_ratios = tuple(int(c) for c in la_sr_ratios)
        arch = resolve_arch(arch, self.arch_zoo, self._arch_keys, type(self))
        embed_dims = tuple(int(c) for c in arch['embed_dims'])
        depths = tuple(int(d) for d in arch['depths'])
        num_heads = tuple(int(h) for h in arch['num_heads'])
        mlp_ratios = tuple(float(r) for r in arch['mlp_ratios'])
        num_stages = len(depths)
        for name, seq in (('embed_dims', embed_dims), ('num_heads', num_heads),
                          ('mlp_ratios', mlp_ratios), ('attn_layout',
                                                       attn_layout),
                          ('patch_sizes', patch_sizes), ('sr_ratios',
                                                         sr_ratios),
                          ('la_sr_ratios', la_sr_ratios)):
            if len(seq) != num_stages:
                raise ValueError(f'{name} {seq!r} needs {num_stages} entries '
                                 f'(one per stage, as depths {depths})')
        self.arch = dict(embed_dims=embed_dims, depths=depths,
                         num_heads=num_heads, mlp_ratios=mlp_ratios)
        self.out_indices = check_out_indices(out_indices, num_stages)
        self.frozen_stages = frozen_stages
        self.num_stages = num_stages
        self.num_built = max(self.out_indices) + 1
        self.num_features = list(embed_dims)
        img_hw = pair(pretrain_img_size)
        self.drop_path_rate = arch_drop_path(arch, drop_path_rate)
        dpr = linspace(self.drop_path_rate, sum(depths))
        self.ref_grids = []
        stride = 1
        # Parameters first so the state dict follows the authors' order.
        for i in range(self.num_built):
            stride *= patch_sizes[i]
            ref = (img_hw[0] // stride, img_hw[1] // stride)
            self.ref_grids.append(ref)
            self.register_parameter(
                f'pos_embed{i + 1}',
                nn.Parameter(torch.zeros(1, ref[0] * ref[1], embed_dims[i])))
        for i in range(self.num_built):
            self.add_module(f'patch_embed{i + 1}', PatchEmbed(
                in_channels if i == 0 else embed_dims[i - 1], embed_dims[i],
                patch_sizes[i], norm_cfg=dict(type='LN'), pad_input=False))
            self.add_module(f'pos_drop{i + 1}', nn.Dropout(drop_rate))
            start = sum(depths[:i])
            self.add_module(f'block{i + 1}', PolaPVTStage([
                PolaPVTBlock(
                    embed_dims[i], num_heads[i], self.ref_grids[i],
                    mlp_ratios[i], attn_type=attn_layout[i],
                    sr_ratio=sr_ratios[i], qkv_bias=qkv_bias, alpha=alpha,
                    kernel_size=kernel_size, drop_rate=drop_rate,
                    attn_drop_rate=attn_drop_rate,
                    drop_path_rate=dpr[start + j], act_cfg=act_cfg,
                    norm_cfg=norm_cfg, with_cp=with_cp,
                    feature_map=feature_map,
                    la_sr_ratio=int(la_sr_ratios[i]))
                for j in range(depths[i])
            ]))
        self._freeze_stages()

    # ------------------------------------------------------------------
    def _init_extra(self) -> None:
        for i in range(self.num_built):
            trunc_normal_(getattr(self, f'pos_embed{i + 1}'), std=.02)

    def _expected_unexpected(self, key: str) -> bool:
        head = key.split('.')[0]
        for name in ('patch_embed', 'pos_embed', 'block'):
            if head.startswith(name) and head[len(name):].isdigit():
                return int(head[len(name):]) > self.num_built
        return head == 'norm'  # the authors' unused final norm

    def _freeze_stages(self) -> None:
        if self.frozen_stages >= 0:
            freeze(self.patch_embed1)
            self.pos_embed1.requires_grad = False
        for i in range(1, min(self.frozen_stages, self.num_built) + 1):
            freeze(getattr(self, f'patch_embed{i}'))
            getattr(self, f'pos_embed{i}').requires_grad = False
            freeze(getattr(self, f'block{i}'))

    def embed(self, i: int, x: Tensor) -> Tuple[Tensor, Size2]:
        """Stage ``i``'s entry (0-based): patch embedding
        ``patch_embed{i+1}`` of the map ``x`` ``(B, Cin, H, W)`` (any
        strides), plus the position table ``pos_embed{i+1}`` (resized to
        the grid), dropout: tokens ``(B, H' * W', C)`` and ``(H', W')``."""
        x, hw = getattr(self, f'patch_embed{i + 1}')(x)
        pos = resize_pos_table(getattr(self, f'pos_embed{i + 1}'),
                               self.ref_grids[i], hw, 'bilinear')
        return getattr(self, f'pos_drop{i + 1}')(x + pos), hw

    def stem(self, x: Tensor) -> Tuple[Tensor, Size2]:
        """Stage 0's entry (:meth:`embed`) of the image."""
        return self.embed(0, x)

    @property
    def stages(self) -> List[PolaPVTStage]:
        """``block1``, ``block2``, ...: the built stages
        (:class:`PolaPVTStage`)."""
        return [getattr(self, f'block{i + 1}') for i in range(self.num_built)]

    def downsample(self, i: int, x: Tensor, hw: Size2) -> Tuple[Tensor, Size2]:
        """Stage ``i + 1``'s entry (:meth:`embed`) of stage ``i``'s output
        laid out as NCHW."""
        return self.embed(i + 1, to_map(x, hw))
