"""The block and stage of PolaFormer++ (PolaPP): a positional conv, then
pre-norm attention (PaCS linear or rotary softmax) and a conv FFN, each with
optional layer scale and stochastic depth (the authors' ``Block`` and
``BasicLayer``)."""
from functools import partial
from typing import List, Optional

import torch
import torch.nn as nn
import torch.utils.checkpoint as cp
from mmengine.model import BaseModule
from torch import Tensor

from ...type_aliases import Size2
from .bricks import DropPath, build_attention
from .conv_embed import ConvDownsample
from .conv_ffn import ConvFFN
from .linear_attention import PaCSAttention
from .rotary_attention import RotarySelfAttention
from .token_map import to_map, to_tokens

__all__ = ['TokenLayerNorm', 'PolaPPBlock', 'PolaPPStage', 'layer_scale']

class TokenLayerNorm(nn.Module):
    """LayerNorm over channels of tokens ``(B, N, C)``; the authors'
    ``LayerNorm2d`` (eps 1e-6), whose parameters sit in ``.norm``."""

    def __init__(self, embed_dims: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(embed_dims, eps=eps)

    def forward(self, x: Tensor) -> Tensor:
        """``(B, N, C)`` -> ``(B, N, C)``."""
        return self.norm(x)


def layer_scale(x: Tensor, gamma: Optional[Tensor]) -> Tensor:
    """Tokens ``x`` ``(B, N, C)`` times a layer scale ``gamma``
    ``(1, C, 1, 1)`` (the authors' map-shaped parameter); ``x`` as it is
    when ``gamma`` is None."""
    return x if gamma is None else x * gamma.flatten(1).unsqueeze(1)


class PolaPPBlock(BaseModule):
    """``x + pos(x)`` (depth-wise 3x3 conv), then
    ``x + drop_path(gamma_1 * attn(norm1(x)))``,
    ``x + drop_path(gamma_2 * ffn(norm2(x)))``; ``gamma_*``
    ``(1, C, 1, 1)`` only with layer scale.

    Args:
        embed_dims: channels ``C``.
        num_heads: heads of the attention.
        attn_type: ``'L'`` PaCS linear attention (:class:`PaCSAttention`),
            ``'S'`` rotary softmax (:class:`RotarySelfAttention`).
        mlp_ratio: hidden width of the FFN over ``C``.
        drop_path_rate: stochastic depth (:class:`~.bricks.DropPath`).
        layer_scale_init: initial ``gamma`` (None: no layer scale).
        with_cp: gradient checkpointing (non-reentrant).
    """

    def __init__(self, embed_dims: int, num_heads: int, attn_type: str,
                 mlp_ratio: float, drop_path_rate: float = 0.,
                 layer_scale_init: Optional[float] = None,
                 with_cp: bool = False,
                 init_cfg: Optional[dict] = None) -> None:
        super().__init__(init_cfg=init_cfg)
        self.with_cp = with_cp
        self.layer_scale = layer_scale_init is not None
        self.norm1 = TokenLayerNorm(embed_dims)
        self.attn = build_attention(attn_type, {
            'L': partial(PaCSAttention, embed_dims, num_heads),
            'S': partial(RotarySelfAttention, embed_dims, num_heads)})
        self.drop_path = (DropPath(drop_path_rate)
                          if drop_path_rate > 0 else nn.Identity())
        self.norm2 = TokenLayerNorm(embed_dims)
        self.ffn = ConvFFN(embed_dims, int(mlp_ratio * embed_dims))
        self.pos = nn.Conv2d(embed_dims, embed_dims, 3, 1, 1,
                             groups=embed_dims)
        self.gamma_1: Optional[nn.Parameter] = None
        self.gamma_2: Optional[nn.Parameter] = None
        if self.layer_scale:
            self.gamma_1 = nn.Parameter(
                torch.full((1, embed_dims, 1, 1), float(layer_scale_init)))
            self.gamma_2 = nn.Parameter(
                torch.full((1, embed_dims, 1, 1), float(layer_scale_init)))

    def forward(self, x: Tensor, hw: Size2) -> Tensor:
        """``(B, H * W, C)`` on grid ``hw`` -> ``(B, H * W, C)``."""

        def block(x: Tensor) -> Tensor:
            x = x + to_tokens(self.pos(to_map(x, hw)))
            x = x + self.drop_path(layer_scale(self.attn(self.norm1(x), hw),
                                               self.gamma_1))
            return x + self.drop_path(layer_scale(self.ffn(self.norm2(x), hw),
                                                  self.gamma_2))

        if self.with_cp and x.requires_grad:
            return cp.checkpoint(block, x, use_reentrant=False)
        return block(x)


class PolaPPStage(BaseModule):
    """The blocks of one stage (:meth:`forward`) and, unless last, the
    downsampling (:class:`~.conv_embed.ConvDownsample`, applied by the
    backbone to the stage's map between stages). The authors'
    ``BasicLayer``.

    Args:
        embed_dims, num_heads, attn_type, mlp_ratio, layer_scale_init,
            with_cp: of every block (:class:`PolaPPBlock`).
        depth: number of blocks.
        drop_path_rates: one per block.
        out_dims: channels after the downsampling; None for no downsampling.
    """

    def __init__(self, embed_dims: int, depth: int, num_heads: int,
                 attn_type: str, mlp_ratio: float,
                 drop_path_rates: List[float],
                 layer_scale_init: Optional[float],
                 out_dims: Optional[int], with_cp: bool = False,
                 init_cfg: Optional[dict] = None) -> None:
        super().__init__(init_cfg=init_cfg)
        self.blocks = nn.ModuleList([
            PolaPPBlock(embed_dims, num_heads, attn_type, mlp_ratio,
                        drop_path_rates[j], layer_scale_init, with_cp)
            for j in range(depth)
        ])
        self.downsample = (ConvDownsample(embed_dims, out_dims)
                           if out_dims is not None else None)

    def forward(self, x: Tensor, hw: Size2) -> Tensor:
        """Tokens ``(B, H * W, C)`` on ``hw`` -> the blocks' output, same
        shape."""
        for block in self.blocks:
            x = block(x, hw)
        return x
