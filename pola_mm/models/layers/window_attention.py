"""Swin's window multi-head self-attention with relative position bias."""
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from ...type_aliases import Size2
from .module import PolaModule


def relative_position_index(window: Size2, table_window: Size2) -> Tensor:
    """Index into a ``(2Th-1) * (2Tw-1)`` relative-position table.

    For a window no larger than the table's window, this is the exact
    sub-table of the offsets that occur (no interpolation).

    Args:
        window: ``(wh, ww)`` actual window, ``wh <= Th``, ``ww <= Tw``.
        table_window: ``(Th, Tw)`` window the table was built for.

    Returns:
        ``(wh * ww, wh * ww)`` long.
    """
    wh, ww = window
    th, tw = table_window
    coords = torch.stack(torch.meshgrid([torch.arange(wh), torch.arange(ww)],
                                        indexing='ij')).flatten(1)  # (2, N)
    rel = coords[:, :, None] - coords[:, None, :]  # (2, N, N)
    return (rel[0] + th - 1) * (2 * tw - 1) + (rel[1] + tw - 1)


class WindowMSA(PolaModule):
    """Softmax window attention (Swin), authors' names ``qkv``, ``proj``,
    ``relative_position_bias_table``.

    The relative position index is not a persistent buffer (the converter
    drops the authors' copy): it is cached per window size as a
    non-persistent buffer for the table's own window and computed on the fly
    for smaller windows.

    Args:
        embed_dims: channels ``C``.
        num_heads: heads ``h``.
        window_size: the table's window ``(Th, Tw)`` (the largest window).
        qkv_bias: bias of ``qkv``.
        qk_scale: override of ``d^-0.5``.
        attn_drop: dropout on attention weights.
        proj_drop: dropout after ``proj``.
    """

    def __init__(self,
                 embed_dims: int,
                 num_heads: int,
                 window_size: Size2,
                 qkv_bias: bool = True,
                 qk_scale: Optional[float] = None,
                 attn_drop: float = 0.,
                 proj_drop: float = 0.,
                 init_cfg: Optional[dict] = None) -> None:
        super().__init__(init_cfg=init_cfg)
        self.embed_dims = embed_dims
        self.num_heads = num_heads
        self.window_size = (int(window_size[0]), int(window_size[1]))
        head_dims = embed_dims // num_heads
        self.scale = qk_scale or head_dims ** -0.5
        th, tw = self.window_size
        self.relative_position_bias_table = nn.Parameter(
            torch.zeros((2 * th - 1) * (2 * tw - 1), num_heads))
        self.register_buffer(
            'relative_position_index',
            relative_position_index(self.window_size, self.window_size),
            persistent=False)
        self.qkv = nn.Linear(embed_dims, embed_dims * 3, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(embed_dims, embed_dims)
        self.proj_drop = nn.Dropout(proj_drop)

    def relative_bias(self, window: Size2) -> Tensor:
        """``(h, N, N)`` bias for a window ``(wh, ww)`` <= the table's."""
        if (window[0] == self.window_size[0]
                and window[1] == self.window_size[1]):
            index = self.relative_position_index
        else:
            index = relative_position_index(window, self.window_size).to(
                self.relative_position_bias_table.device)
        N = window[0] * window[1]
        bias = self.relative_position_bias_table[index.reshape(-1)]
        return bias.reshape(N, N, -1).permute(2, 0, 1)

    def forward(self, x: Tensor, window: Size2,
                mask: Optional[Tensor] = None) -> Tensor:
        """Attention inside windows.

        Args:
            x: ``(B * nW, N, C)``, ``N = wh * ww``.
            window: ``(wh, ww)``.
            mask: optional additive ``(nW, N, N)`` (or ``(nW, 1, N)``) mask
                with 0 / -100 entries.

        Returns:
            ``(B * nW, N, C)``.
        """
        B_, N, C = x.shape
        h = self.num_heads
        qkv = self.qkv(x).reshape(B_, N, 3, h, C // h).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        if self.select_path(x).sdpa:
            return self._sdpa(q, k, v, window, mask)
        attn = (q * self.scale) @ k.transpose(-2, -1)
        attn = attn + self.relative_bias(window).unsqueeze(0)
        if mask is not None:
            nW = mask.shape[0]
            # (the mask in the logits' dtype: a float32 mask would promote
            # a bf16 / fp16 model's logits and break the product with v)
            attn = attn.view(B_ // nW, nW, h, N, N) + \
                mask.to(attn.dtype).unsqueeze(1).unsqueeze(0)
            attn = attn.view(-1, h, N, N)
        attn = self.attn_drop(attn.softmax(dim=-1))
        x = (attn @ v).transpose(1, 2).reshape(B_, N, C)
        return self.proj_drop(self.proj(x))

    def _sdpa(self, q: Tensor, k: Tensor, v: Tensor, window: Size2,
              mask: Optional[Tensor]) -> Tensor:
        B_, h, N, d = q.shape
        # a 4-D mask: with 3-D or 5-D operands torch 2.14's CPU kernel falls
        # back to a path slower than the explicit one
        bias = self.relative_bias(window).to(q.dtype).unsqueeze(0)
        if mask is not None:
            nW = mask.shape[0]
            bias = bias + mask.unsqueeze(1).to(q.dtype)  # (nW, h, N, N)
            if B_ != nW:  # the same masks for every image
                bias = bias.repeat(B_ // nW, 1, 1, 1)
        x = F.scaled_dot_product_attention(
            q, k, v, attn_mask=bias,
            dropout_p=self.attn_drop.p if self.training else 0.,
            scale=self.scale)
        x = x.transpose(1, 2).reshape(B_, N, h * d)
        return self.proj_drop(self.proj(x))
