"""PVT's spatial-reduction softmax attention (``'S'`` stages of PolaPVT)."""
from typing import Optional

import torch.nn as nn
from mmengine.model import BaseModule
from torch import Tensor

from ...ops import softmax_attention
from ...type_aliases import Size2
from .bricks import build_norm_layer
from .embed import pad_for_stride
from .token_map import to_map, to_tokens


class SpatialReductionAttention(BaseModule):
    """Softmax attention whose keys/values come from a strided conv (``sr``)
    of the map when ``sr_ratio > 1`` (PVT v1 names ``q``, ``kv``, ``sr``,
    ``norm``, ``proj``).

    Args:
        embed_dims: channels ``C``.
        num_heads: heads.
        sr_ratio: spatial reduction of keys/values.
        qkv_bias: bias of ``q`` and ``kv``.
        attn_drop: dropout on attention weights.
        proj_drop: dropout after ``proj``.
        norm_cfg: norm after ``sr``.
    """

    def __init__(self,
                 embed_dims: int,
                 num_heads: int,
                 sr_ratio: int = 1,
                 qkv_bias: bool = True,
                 attn_drop: float = 0.,
                 proj_drop: float = 0.,
                 norm_cfg: Optional[dict] = None,
                 init_cfg: Optional[dict] = None) -> None:
        norm_cfg = dict(type='LN', eps=1e-6) if norm_cfg is None else norm_cfg
        super().__init__(init_cfg=init_cfg)
        self.num_heads = num_heads
        self.scale = (embed_dims // num_heads) ** -0.5
        self.q = nn.Linear(embed_dims, embed_dims, bias=qkv_bias)
        self.kv = nn.Linear(embed_dims, embed_dims * 2, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(embed_dims, embed_dims)
        self.proj_drop = nn.Dropout(proj_drop)
        self.sr_ratio = sr_ratio
        if sr_ratio > 1:
            self.sr = nn.Conv2d(embed_dims, embed_dims, sr_ratio,
                                stride=sr_ratio)
            self.norm = build_norm_layer(norm_cfg, embed_dims)[1]

    def forward(self, x: Tensor, hw: Size2) -> Tensor:
        """``(B, N, C)`` on grid ``hw`` -> ``(B, N, C)``."""
        B, N, C = x.shape
        h = self.num_heads
        q = self.q(x).reshape(B, N, h, C // h).transpose(1, 2)
        if self.sr_ratio > 1:
            r = self.sr_ratio
            # as the authors' PVT: the bottom/right remainder is dropped (a
            # side shorter than r is padded to r)
            m = pad_for_stride(to_map(x, hw), r, pad_input=False)
            m = self.norm(to_tokens(self.sr(m)))
        else:
            m = x
        k, v = self.kv(m).reshape(B, -1, 2, h, C // h).permute(
            2, 0, 3, 1, 4).unbind(0)
        x = softmax_attention(q, k, v, self.scale, None,
                              self.attn_drop.p if self.training else 0.)
        x = x.transpose(1, 2).reshape(B, N, C)
        return self.proj_drop(self.proj(x))
