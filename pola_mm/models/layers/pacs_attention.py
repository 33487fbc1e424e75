"""PaCS polarity attention of PolaFormer++ (the authors'
``AddLinearAttention``) and the PaCS temperatures.

PaCS, the polarity-aware feature map with channel-wise spikiness, replaces
PolaFormer's learned power by ``phi(x; t) = exp(t * x) - 1`` with learned
per-channel temperatures ``t = sigmoid(s)``, one for the same-signed and one
for the opposite-signed flow; the keys take ``exp(x) - 1``. In PolaPP the
products (not the normalisers) carry a 2-D rotary encoding.

One PaCS serves both attentions that use it, PolaPP's
:class:`PaCSAttention` and ``PolarityAttention(feature_map='pacs')``: the
op :func:`~pola_mm.ops.pacs_attention` (formula and kernel) and the
temperatures ``s1``, ``s2`` (:func:`add_pacs_temperatures`,
:func:`reset_pacs_temperatures`).
"""
from typing import Optional

import torch
import torch.nn as nn
from mmengine.model import BaseModule
from torch import Tensor

from ...ops import depthwise_conv2d, gate_linear, pacs_attention
from ...type_aliases import Size2
from .attention_args import polarity_head_dims
from .bricks import linear_chunks
from .rotary import rotary_tables
from .token_map import to_map, to_tokens

__all__ = ['PaCSAttention', 'add_pacs_temperatures',
           'reset_pacs_temperatures']


def add_pacs_temperatures(module: nn.Module, num_heads: int,
                          head_dims: int) -> None:
    """Register the raw temperatures ``s1``, ``s2`` ``(1, h, 1, 2d)`` on
    ``module`` (the authors' names), initialised by
    :func:`reset_pacs_temperatures`."""
    for name in ('s1', 's2'):
        module.register_parameter(
            name, nn.Parameter(torch.empty(1, num_heads, 1, 2 * head_dims)))
    reset_pacs_temperatures(module)


def reset_pacs_temperatures(module: nn.Module) -> None:
    """The authors' init of ``module.s1``, ``module.s2``: zero (so both
    flows start at ``t = sigmoid(0) = 1/2``). The one place that
    initialises them, at construction and in the backbones'
    ``init_weights``."""
    with torch.no_grad():
        module.s1.zero_()
        module.s2.zero_()


class PaCSAttention(BaseModule):
    """PolaFormer++'s linear attention block part (the authors'
    ``AddLinearAttention``), on tokens of a stage map.

    ``qkvg`` Linear(C, 4C) -> q, k, v, g; PaCS attention
    (:func:`~pola_mm.ops.pacs_attention`) with the rotary encoding of width
    ``2d`` over the whole map; plus ``lepe``, a depth-wise 5x5 conv of v
    over all C channels; then ``proj(x * g)``. Under fp16/bf16 autocast the
    attention and ``lepe`` compute in float32 (``exp`` of fp16 overflows
    above 11).

    Args:
        embed_dims: channels ``C``.
        num_heads: heads ``h``; ``d = C / h`` must be even.
        kernel_size: kernel of ``lepe``.
    """

    def __init__(self, embed_dims: int, num_heads: int,
                 kernel_size: int = 5,
                 init_cfg: Optional[dict] = None) -> None:
        super().__init__(init_cfg=init_cfg)
        head_dims = polarity_head_dims(embed_dims, num_heads)
        self.embed_dims = embed_dims
        self.num_heads = num_heads
        self.head_dims = head_dims
        self.qkvg = nn.Linear(embed_dims, embed_dims * 4)
        self.lepe = nn.Conv2d(embed_dims, embed_dims, kernel_size,
                              padding=kernel_size // 2, groups=embed_dims)
        self.proj = nn.Linear(embed_dims, embed_dims)
        add_pacs_temperatures(self, num_heads, head_dims)

    def reset_own_parameters(self) -> None:
        """The authors' init of the temperatures (the backbones'
        ``init_weights`` calls it)."""
        reset_pacs_temperatures(self)

    def extra_repr(self) -> str:
        return f'embed_dims={self.embed_dims}, num_heads={self.num_heads}'

    def forward(self, x: Tensor, hw: Size2) -> Tensor:
        """``(B, N, C)`` tokens on the grid ``hw`` -> ``(B, N, C)``."""
        B, N, C = x.shape
        h, d = self.num_heads, self.head_dims
        # 1. project: q, k, v, g
        q, k, v, g = linear_chunks(self.qkvg, x, 4)

        # 2. PaCS attention of the heads, rotary encoding over the whole map
        def heads(t: Tensor) -> Tensor:  # (B, N, C) -> (B, h, N, d)
            return t.reshape(B, -1, h, d).transpose(1, 2)

        sin, cos = rotary_tables(hw, 2 * d, device=x.device,
                                 dtype=torch.promote_types(x.dtype,
                                                           torch.float32))
        y = pacs_attention(heads(q), heads(k), heads(v), self.s1, self.s2,
                           sin, cos).transpose(1, 2).reshape(B, N, C)

        # 3. lepe: a depth-wise conv of v over the stage map
        y = y + to_tokens(depthwise_conv2d(to_map(v, hw), self.lepe.weight,
                                           self.lepe.bias, self.lepe.padding))

        # 4. gate and output projection: proj(y * g)
        return gate_linear(y, g, self.proj)
