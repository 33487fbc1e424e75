"""Pola-Swin: Swin Transformer with polarity-aware linear attention."""
from functools import partial
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch.nn as nn
from mmengine.model import BaseModule
from torch import Tensor

from ...registry import register_model
from ...type_aliases import Size2
from ..layers import PatchEmbed, PatchMerging, PolarityAttention, WindowMSA
from ..layers.bricks import build_attention, build_norm_layer
from .base import (PolaBackbone, PreNormBlock, arch_drop_path,
                   check_out_indices, freeze, linspace, pair, resolve_arch)


class PolaSwinBlock(PreNormBlock):
    """One Swin block with polarity (``'L'``) or softmax (``'S'``) attention.

    ``'L'`` (polarity): attention over the whole stage map at every input
    size (no windows, no shift, no padding), as the authors configure it:
    their polarity window covers the stage map at the size they train at
    (56 at 224, 96 for their 384 fine-tune). ``positional_encoding`` has the
    grid ``window_size`` and is bicubic-resized to the map when the map
    differs.

    ``'S'`` (softmax): Swin's shifted windows over the stage map
    (:class:`~pola_mm.models.layers.WindowMSA`: padded as mmdet's
    ``SwinTransformer``).

    Args:
        embed_dims: channels.
        num_heads: heads.
        window_size: ``(wh, ww)``: the grid of the polarity
            ``positional_encoding`` (``'L'``) or the softmax window
            (``'S'``).
        shift: whether an ``'S'`` block shifts (odd blocks); ignored by
            ``'L'`` blocks, which attend to the whole map.
        attn_type: ``'L'`` or ``'S'``.
        mlp_ratio, qkv_bias, alpha, kernel_size, drop_rate, attn_drop_rate,
        drop_path_rate, act_cfg, norm_cfg: as in :class:`PolaSwinTransformer`.
        with_cp: gradient checkpointing of the whole block.
    """

    def __init__(self,
                 embed_dims: int,
                 num_heads: int,
                 window_size: Size2,
                 shift: bool = False,
                 attn_type: str = 'L',
                 mlp_ratio: float = 4.,
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
                 init_cfg: Optional[dict] = None) -> None:
        act_cfg = dict(type='GELU') if act_cfg is None else act_cfg
        norm_cfg = dict(type='LN') if norm_cfg is None else norm_cfg
        window_size = pair(window_size)
        attn = build_attention(attn_type, {
            'L': partial(PolarityAttention, embed_dims, num_heads,
                         window_size, fused_qkvg=True, qkv_bias=qkv_bias,
                         alpha=alpha, kernel_size=kernel_size,
                         attn_drop=attn_drop_rate, proj_drop=drop_rate,
                         feature_map=feature_map),
            'S': partial(WindowMSA, embed_dims, num_heads, window_size,
                         shift=shift, qkv_bias=qkv_bias,
                         attn_drop=attn_drop_rate, proj_drop=drop_rate)})
        super().__init__(embed_dims, attn, mlp_ratio, drop_rate,
                         drop_path_rate, act_cfg, norm_cfg, with_cp,
                         init_cfg=init_cfg)
        self.attn_type = attn_type
        self.window_size = window_size


class PolaSwinStage(BaseModule):
    """Blocks of one stage (``blocks``) and the optional patch merging at its
    end (``downsample``), the authors' ``BasicLayer``; block ``j`` has the
    attention ``attn_types[j]`` and the window ``window_sizes[j]``.
    :meth:`forward` runs the blocks; the backbone applies ``downsample``
    between stages (as mmpretrain's Swin)."""

    def __init__(self,
                 embed_dims: int,
                 depth: int,
                 num_heads: int,
                 window_sizes: Sequence[Size2],
                 attn_types: str,
                 drop_paths: Sequence[float],
                 downsample: bool,
                 norm_cfg: dict,
                 block_cfg: dict,
                 init_cfg: Optional[dict] = None) -> None:
        super().__init__(init_cfg=init_cfg)
        self.blocks = nn.ModuleList([
            PolaSwinBlock(embed_dims, num_heads, window_sizes[j],
                          shift=j % 2 == 1, attn_type=attn_types[j],
                          drop_path_rate=drop_paths[j], norm_cfg=norm_cfg,
                          **block_cfg) for j in range(depth)
        ])
        self.downsample = (PatchMerging(embed_dims, norm_cfg=norm_cfg)
                           if downsample else None)

    def forward(self, x: Tensor, hw: Size2) -> Tensor:
        """Tokens ``(B, H * W, C)`` on ``hw`` -> the blocks' output, same
        shape."""
        for block in self.blocks:
            x = block(x, hw)
        return x


def block_layout(attn_layout: str, depths: Sequence[int]) -> List[str]:
    """Per stage, the attention of each block, from the authors' layout.

    ``attn_layout`` has one letter per stage, ``'L'`` (polarity), ``'S'``
    (softmax) or ``'M'`` (mixed), then, when a stage is mixed, the number
    ``n`` of its leading polarity blocks (the authors' ``BasicLayer``: the
    first ``n`` blocks ``'L'``, the rest ``'S'``); e.g. ``'LLMS4'``.

    Args:
        attn_layout: the layout string.
        depths: blocks per stage.

    Returns:
        One string per stage, one letter (``'L'``/``'S'``) per block; e.g.
        ``['LL', 'LL', 'LLLLSS', 'SS']`` for ``'LLMS4'`` and depths
        ``(2, 2, 6, 2)``.
    """
    num = len(depths)
    stages, suffix = attn_layout[:num], attn_layout[num:]
    usage = (f"one letter per stage ('L' polarity, 'S' softmax, 'M' mixed) "
             f"for {num} stages, then the number of leading polarity blocks "
             f"of the mixed stages, e.g. 'LLMS4'")
    if (len(stages) != num or set(stages) - set('LSM')
            or ('M' in stages) != bool(suffix)
            or (suffix and not suffix.isdigit())):
        raise ValueError(f'attn_layout {attn_layout!r}: expected {usage}')
    n = int(suffix) if suffix else 0
    return [c * d if c != 'M' else 'L' * min(n, d) + 'S' * max(0, d - n)
            for c, d in zip(stages, depths)]


@register_model
class PolaSwinTransformer(PolaBackbone):
    """Pola-Swin backbone (PolaFormer, ICLR 2025) for any input size.

    Exactly the published model at 224 (fed a converted or authors'
    checkpoint). Polarity (``'L'``) stages attend to their whole stage map
    at every input size; softmax (``'S'``) stages use shifted windows,
    padded to the map (see :class:`PolaSwinBlock`).

    Table grids: the polarity window of stage ``i`` is fixed at build time
    as ``min(window_size, pretrain_img_size / (patch_size * 2**i))`` (the
    authors' rule: 56x56 in stage 0 and 28x28 in stage 1 of T/S/B at 224,
    96x96 and 48x48 for their 384 fine-tune with ``window_size=96``); it is
    the grid of that stage's ``positional_encoding``, which is
    bicubic-resized to the stage map whenever the map differs. Softmax
    stages use windows of ``softmax_window_size`` (7, or 12 when
    ``window_size > 56``) with the same ``min`` rule.

    Args:
        arch: ``'tiny'``/``'small'``/``'base'`` (``'t'``/``'s'``/``'b'``) or a
            dict with ``embed_dims``, ``depths``, ``num_heads`` and
            optionally ``drop_path_rate``.
        pretrain_img_size: image size of pre-training (int or pair).
        patch_size: patch size of the patch embedding.
        in_channels: input channels.
        window_size: the authors' polarity window: sets the grid of the
            polarity ``positional_encoding`` (polarity stages are global).
        softmax_window_size: window of ``'S'`` stages.
        attn_layout: one letter per stage, ``'L'`` polarity, ``'S'`` softmax,
            ``'M'`` mixed (the authors' ``'M<n>'``: the first ``n`` blocks
            of the stage polarity, the rest softmax, ``n`` written once at
            the end, e.g. ``'LLMS4'``; see :func:`block_layout`).
        mlp_ratio: MLP hidden ratio.
        qkv_bias: bias in the input projections.
        alpha: exponent range of the learned power.
        kernel_size: depth-wise conv kernel on v.
        drop_rate, attn_drop_rate: dropout rates.
        drop_path_rate: stochastic depth, linearly spaced over all blocks;
            None: the arch's (the authors' ImageNet value: 0.2, 0.3, 0.5 for
            T, S, B; 0.1 for an arch dict without one).
        out_indices: stages whose (normalised) outputs are returned; only
            stages up to ``max(out_indices)`` are built.
        frozen_stages: mmdet's meaning: -1 nothing; 0 the patch embedding;
            ``k`` also stages 1..k (``layers[0..k-1]``, including their patch
            merging) and their output norms. Frozen parts stay in eval mode.
        with_cp: gradient checkpointing per block.
        norm_cfg, act_cfg: norm and activation configs.
        feature_map: of the polarity stages, ``'power'`` (PolaFormer) or
            ``'pacs'`` (PolaFormer++'s PaCS, see
            :class:`~pola_mm.models.layers.PolarityAttention`; parameters
            ``s1``, ``s2`` instead of ``power``).
        init_cfg: ``dict(type='Pretrained', checkpoint=PATH[, prefix=...])``
            accepts an authors' checkpoint, a converted one, or a backbone
            state dict.

    Output: tuple of ``(B, embed_dims * 2**i, ceil(H / (4 * 2**i)),
    ceil(W / (4 * 2**i)))`` maps for ``i`` in ``out_indices``.
    """
    # drop_path_rate: the authors' ImageNet value (their cfgs/*.yaml)
    arch_zoo: Dict[str, dict] = {
        **dict.fromkeys(['t', 'tiny'], dict(
            embed_dims=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24),
            drop_path_rate=0.2)),
        **dict.fromkeys(['s', 'small'], dict(
            embed_dims=96, depths=(2, 2, 18, 2), num_heads=(3, 6, 12, 24),
            drop_path_rate=0.3)),
        **dict.fromkeys(['b', 'base'], dict(
            embed_dims=128, depths=(2, 2, 18, 2), num_heads=(4, 8, 16, 32),
            drop_path_rate=0.5)),
    }
    _arch_keys = ('embed_dims', 'depths', 'num_heads')
    family = 'Pola-Swin'

    def __init__(self,
                 arch: Union[str, dict] = 'tiny',
                 pretrain_img_size: Union[int, Sequence[int]] = 224,
                 patch_size: int = 4,
                 in_channels: int = 3,
                 window_size: int = 56,
                 softmax_window_size: Optional[int] = None,
                 attn_layout: str = 'LLSS',
                 mlp_ratio: float = 4.,
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
                 init_cfg: Optional[dict] = None) -> None:
        norm_cfg = dict(type='LN') if norm_cfg is None else norm_cfg
        act_cfg = dict(type='GELU') if act_cfg is None else act_cfg
        super().__init__(init_cfg=init_cfg)
        self.in_channels = in_channels
        arch = resolve_arch(arch, self.arch_zoo, self._arch_keys, type(self))
        embed_dims = int(arch['embed_dims'])
        depths = tuple(int(d) for d in arch['depths'])
        num_heads = tuple(int(h) for h in arch['num_heads'])
        num_stages = len(depths)
        if len(num_heads) != num_stages:
            raise ValueError(
                f'depths {depths} and num_heads {num_heads} must have one '
                'entry per stage')
        blocks = block_layout(attn_layout, depths)
        out_indices = check_out_indices(out_indices, num_stages)
        if softmax_window_size is None:
            softmax_window_size = 12 if window_size > 56 else 7
        self.arch = dict(embed_dims=embed_dims, depths=depths,
                         num_heads=num_heads)
        self.out_indices = out_indices
        self.frozen_stages = frozen_stages
        self.num_stages = num_stages
        self.num_built = max(out_indices) + 1
        self.attn_layout = attn_layout
        self.num_features = [embed_dims * 2**i for i in range(num_stages)]

        self.patch_embed = PatchEmbed(in_channels, embed_dims, patch_size,
                                      norm_cfg=norm_cfg)
        self.drop_after_pos = nn.Dropout(drop_rate)
        img_hw = pair(pretrain_img_size)
        self.drop_path_rate = arch_drop_path(arch, drop_path_rate)
        dpr = linspace(self.drop_path_rate, sum(depths))
        block_cfg = dict(mlp_ratio=mlp_ratio, qkv_bias=qkv_bias, alpha=alpha,
                         kernel_size=kernel_size, drop_rate=drop_rate,
                         attn_drop_rate=attn_drop_rate, act_cfg=act_cfg,
                         with_cp=with_cp, feature_map=feature_map)
        self.window_sizes: List[List[Size2]] = []
        self.layers = nn.ModuleList()
        for i in range(self.num_built):
            res = [s // (patch_size * 2**i) for s in img_hw]
            # The authors' rule: a window larger than the stage's map at the
            # pre-training size shrinks to the map (and is fixed thereafter).
            wins = []
            for kind in blocks[i]:
                base = window_size if kind == 'L' else softmax_window_size
                wins.append((min(base, res[0]), min(base, res[1])))
            self.window_sizes.append(wins)
            start = sum(depths[:i])
            self.layers.append(PolaSwinStage(
                self.num_features[i], depths[i], num_heads[i], wins,
                blocks[i], dpr[start:start + depths[i]],
                downsample=i + 1 < self.num_built, norm_cfg=norm_cfg,
                block_cfg=block_cfg))
        for i in out_indices:
            self.add_module(
                f'norm{i}',
                build_norm_layer(norm_cfg, self.num_features[i])[1])
        self._freeze_stages()

    # ------------------------------------------------------------------
    def _expected_missing(self, key: str) -> bool:
        # New output norms of the dense interface (the classifier has norm3).
        return key.split('.')[0] in ('norm0', 'norm1', 'norm2')

    def _expected_unexpected(self, key: str) -> bool:
        parts = key.split('.')
        if parts[0] == 'layers' and len(parts) > 2 and parts[1].isdigit():
            i = int(parts[1])
            return i >= self.num_built or (i == self.num_built - 1 and
                                           parts[2] == 'downsample')
        if parts[0].startswith('norm') and parts[0][4:].isdigit():
            return int(parts[0][4:]) not in self.out_indices
        return False

    def _freeze_stages(self) -> None:
        if self.frozen_stages >= 0:
            freeze(self.patch_embed)
        for i in range(1, self.frozen_stages + 1):
            if i - 1 < self.num_built:
                freeze(self.layers[i - 1])
            if (i - 1) in self.out_indices:
                freeze(getattr(self, f'norm{i - 1}'))

    def stem(self, x: Tensor) -> Tuple[Tensor, Size2]:
        """Patch embedding and dropout: image -> stage 0 tokens, grid."""
        x, hw = self.patch_embed(x)
        return self.drop_after_pos(x), hw

    @property
    def stages(self) -> nn.ModuleList:
        """``layers``: the stages (:class:`PolaSwinStage`)."""
        return self.layers

    def downsample(self, i: int, x: Tensor, hw: Size2) -> Tuple[Tensor, Size2]:
        """The patch merging of ``layers[i]``."""
        return self.layers[i].downsample(x, hw)

    def out_norm(self, i: int, x: Tensor) -> Tensor:
        """``norm{i}`` where stage ``i`` is an output (the classifier's
        final norm is ``norm3``)."""
        return getattr(self, f'norm{i}')(x) if i in self.out_indices else x
