"""Global softmax attention with 2-D rotary encoding: the softmax blocks of
PolaFormer++ (the authors' ``VanillaSelfAttention``)."""
from typing import Optional

import torch.nn as nn
from mmengine.model import BaseModule
from torch import Tensor

from ...ops import softmax_attention
from ...ops.rotary import rotary_tables, theta_shift
from ...type_aliases import Size2
from .bricks import linear_chunks
from .token_map import to_map, to_tokens

__all__ = ['RotarySelfAttention']


class RotarySelfAttention(BaseModule):
    """Global softmax attention with rotary q, k (the authors'
    ``VanillaSelfAttention``): ``qkvo`` Linear(C, 4C) -> q, k, v, o;
    ``softmax(d^-0.5 R(q) R(k)^T) v + lepe(v)``, then ``proj(x * o)``;
    ``lepe`` a depth-wise 5x5 conv of v; ``R`` the rotary encoding of width
    ``d`` (:func:`~pola_mm.ops.rotary_tables`). ``d`` must
    be divisible by 4.

    The softmax product is the op :func:`~pola_mm.ops.softmax_attention`.

    Args:
        embed_dims: channels ``C``.
        num_heads: heads ``h``.
        kernel_size: kernel of ``lepe``.
    """

    def __init__(self, embed_dims: int, num_heads: int,
                 kernel_size: int = 5,
                 init_cfg: Optional[dict] = None) -> None:
        super().__init__(init_cfg=init_cfg)
        if embed_dims % num_heads or (embed_dims // num_heads) % 4:
            raise ValueError(
                f'embed_dims {embed_dims} / num_heads {num_heads} must give '
                'a head width divisible by 4 (rotary encoding)')
        self.embed_dims = embed_dims
        self.num_heads = num_heads
        self.head_dims = embed_dims // num_heads
        self.qkvo = nn.Linear(embed_dims, embed_dims * 4)
        self.lepe = nn.Conv2d(embed_dims, embed_dims, kernel_size,
                              padding=kernel_size // 2, groups=embed_dims)
        self.proj = nn.Linear(embed_dims, embed_dims)

    def extra_repr(self) -> str:
        return f'embed_dims={self.embed_dims}, num_heads={self.num_heads}'

    def forward(self, x: Tensor, hw: Size2) -> Tensor:
        """``(B, N, C)`` tokens on the grid ``hw`` -> ``(B, N, C)``."""
        B, N, C = x.shape
        h, d = self.num_heads, self.head_dims
        q, k, v, o = linear_chunks(self.qkvo, x, 4)
        lepe = to_tokens(self.lepe(to_map(v, hw)))
        sin, cos = rotary_tables(hw, d, device=x.device, dtype=x.dtype)
        q = theta_shift(q.reshape(B, N, h, d).transpose(1, 2), sin, cos)
        k = theta_shift(k.reshape(B, N, h, d).transpose(1, 2), sin, cos)
        v = v.reshape(B, N, h, d).transpose(1, 2)
        out = softmax_attention(q, k, v, d**-0.5)
        out = out.transpose(1, 2).reshape(B, N, C) + lepe
        return self.proj(out * o)
