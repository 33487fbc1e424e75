"""Swin's shifted-window multi-head self-attention with relative position
bias, on a whole stage map."""
from typing import Any, Optional, Tuple

import torch
import torch.nn as nn
from mmengine.model import BaseModule
from mmengine.model.weight_init import trunc_normal_
from torch import Tensor

from ...ops import check_window_export, softmax_attention
from ...type_aliases import Size2
from .window import (crop_map, cyclic_shift, either, exceeds, grid_padding,
                     pad_map, window_masks, window_partition, window_reverse)


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


class WindowMSA(BaseModule):
    """Softmax attention in (shifted) windows of a stage map (Swin), the
    authors' names ``qkv``, ``proj``, ``relative_position_bias_table``.

    A map that fits in one window (``H <= wh`` and ``W <= ww``, e.g. stage
    4 at 224) is one window of its own size without shift, as the authors'
    classifier. Any larger map is computed as mmdet's ``SwinTransformer``
    (and the downstream code of the lineage) does: zero-padded
    bottom/right to a multiple of the window (the window is kept),
    cyclically shifted by half a window when ``shift`` with Swin's region
    mask over the padded map, and padded tokens attended to like any other
    (no key mask).

    :meth:`forward` computes every case on windows of the table's size
    with no branch on the map size (:meth:`shift_plan`): a map that fits in
    one window is padded to it, not shifted, and its padded keys masked
    (the same attention as a window of the map's own size, the relative
    offsets of its tokens being the same). The shift, the
    region and padding masks and the padding are computed from the map
    size, so a graph traced at one input size (ONNX with a dynamic
    height/width) computes the rule at every size. :meth:`window_plan`
    gives the same rule as the window of the map's own size (used by the
    attention maps of :mod:`pola_mm.analysis`).

    The relative position index is not a persistent buffer (the converter
    drops the authors' copy): it is cached as a non-persistent buffer for
    the table's own window and computed on the fly for smaller windows.

    Args:
        embed_dims: channels ``C``.
        num_heads: heads ``h``.
        window_size: the table's window ``(Th, Tw)`` (the largest window).
        shift: shift by half a window (Swin's odd blocks).
        qkv_bias: bias of ``qkv``.
        qk_scale: override of ``d^-0.5``.
        attn_drop: dropout on attention weights.
        proj_drop: dropout after ``proj``.
    """

    def __init__(self,
                 embed_dims: int,
                 num_heads: int,
                 window_size: Size2,
                 shift: bool = False,
                 qkv_bias: bool = True,
                 qk_scale: Optional[float] = None,
                 attn_drop: float = 0.,
                 proj_drop: float = 0.,
                 init_cfg: Optional[dict] = None) -> None:
        super().__init__(init_cfg=init_cfg)
        self.embed_dims = embed_dims
        self.num_heads = num_heads
        self.window_size = (int(window_size[0]), int(window_size[1]))
        self.shift_size = ((self.window_size[0] // 2,
                            self.window_size[1] // 2) if shift else (0, 0))
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

    def window_plan(self, hw: Size2) -> Tuple[Size2, Size2]:
        """The window and shift used on a map ``hw`` (see the class
        docstring): ``((wh, ww), (sh, sw))``."""
        if hw[0] <= self.window_size[0] and hw[1] <= self.window_size[1]:
            return (hw[0], hw[1]), (0, 0)  # one window: the map
        return self.window_size, self.shift_size  # mmdet's Swin

    def shift_plan(self, hw: Size2) -> Tuple[Size2, Any]:
        """On windows of the table's size: the shift used on a map ``hw``
        and whether its padded keys are attended to (see the class
        docstring). Branch-free in the map size: ints for ints, 0-d
        tensors for the traced sizes of an exported graph.

        Returns:
            ``((sh, sw), padded_keys_attended)``.
        """
        (wh, ww), (sh, sw) = self.window_size, self.shift_size
        if not isinstance(hw[0], int) or not isinstance(hw[1], int):
            # sizes of a captured graph: 0/1 flags, no comparison
            larger_h, larger_w = exceeds(hw[0], wh), exceeds(hw[1], ww)
            several = either(larger_h, larger_w)  # else one window: the map
            return (sh * several, sw * several), several
        larger_h, larger_w = hw[0] > wh, hw[1] > ww
        several = larger_h or larger_w
        return (sh * several, sw * several), several

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

    def reset_own_parameters(self) -> None:
        """Swin's init of the relative position table: trunc-normal, std
        .02 (the backbones' ``init_weights`` calls it)."""
        trunc_normal_(self.relative_position_bias_table, std=.02)

    def forward(self, x: Tensor, hw: Size2) -> Tensor:
        """Attention in the windows of a stage map.

        Args:
            x: ``(B, N, C)``, ``N = H * W`` row-major on the grid ``hw``.
            hw: ``(H, W)``.

        Returns:
            ``(B, N, C)``.
        """
        check_window_export('WindowMSA', hw)
        B, L, C = x.shape
        h = self.num_heads
        win = self.window_size
        # 1. windows: pad to a multiple of the window, shift, partition; the
        # masks of the shifted regions and of padded keys
        shift, padded_keys_attended = self.shift_plan(hw)
        pad = grid_padding(hw, win)
        padded = pad_map(x.view(B, hw[0], hw[1], C), pad)
        padded_hw = (padded.shape[1], padded.shape[2])
        windows = window_partition(cyclic_shift(padded, shift), win)
        Bw, n, _ = windows.shape  # (B * nW, n, C)
        bias = self.relative_bias(win).unsqueeze(0) + window_masks(
            hw, win, shift, padded_keys_attended, x.device).unsqueeze(1)

        # 2. softmax attention in each window, the same masks for every image
        # (q, k, v (B, nW, h, n, d); bias (nW or 1, h, n, n), broadcast)
        q, k, v = self.qkv(windows).reshape(B, -1, n, 3, h, C // h).permute(
            3, 0, 1, 4, 2, 5).unbind(0)
        y = softmax_attention(q, k, v, self.scale, bias,
                              self.attn_drop.p if self.training else 0.)
        # (B * nW, n, C), through one 4-D transpose: OpenVINO's channel
        # shuffle fusion fails on the 5-D one of a dynamic-size graph
        y = y.flatten(0, 1).transpose(1, 2).reshape(Bw, n, C)
        y = self.proj_drop(self.proj(y))

        # 3. windows back to the map: reverse, unshift, crop
        y = cyclic_shift(window_reverse(y, win, padded_hw), shift,
                         reverse=True)
        return crop_map(y, pad).reshape(B, L, C)
