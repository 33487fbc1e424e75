"""Patch embedding and Swin patch merging that accept any input size."""
from types import MappingProxyType
from typing import Mapping, Optional, Tuple

import torch.nn as nn
import torch.nn.functional as F
from mmengine.model import BaseModule
from torch import Tensor

from ...type_aliases import Size2
from .bricks import build_norm_layer
from .token_map import to_tokens
from .window import known_zeros, pad_map


def pad_for_stride(x: Tensor, stride: int, pad_input: bool) -> Tensor:
    """Bottom/right zero padding of a map before a conv with kernel = stride.

    Args:
        x: ``(B, C, H, W)``.
        stride: the conv's kernel and stride ``p``.
        pad_input: True: pad to a multiple of ``p`` (the conv's output is
            ``ceil(H / p)``); False: only a side shorter than ``p`` is padded
            to ``p`` (the output is ``max(1, floor(H / p))``, a plain strided
            conv everywhere it has an output).

    Returns:
        ``x``, padded where needed: in eager mode ``x`` itself when nothing
        needs padding; a captured graph (traced sizes) always keeps its pad,
        branch-free, so it pads as the size it is run at needs.
    """
    H, W = x.shape[-2:]
    if pad_input:
        pad_h, pad_w = (-H) % stride, (-W) % stride
    else:  # max(0, stride - H), written without a comparison in Python
        pad_h, pad_w = (stride - H) * (H < stride), (stride - W) * (W < stride)
    if known_zeros((pad_h, pad_w)):  # eager, nothing to pad: no copy
        return x
    return F.pad(x, (0, pad_w, 0, pad_h))


class PatchEmbed(BaseModule):
    """Non-overlapping patch embedding: conv (kernel = stride = patch) + norm.

    With ``pad_input=True`` (Swin, as mmdet's ``AdaptivePadding``) the input
    is zero-padded at the bottom/right to a multiple of the patch size: the
    output grid is ``ceil(H / p) x ceil(W / p)``. With ``pad_input=False``
    (the authors' PVT) the conv drops the bottom/right remainder, as a plain
    strided conv does: ``floor(H / p) x floor(W / p)``; only a side shorter
    than one patch, where that conv has no output, is padded to one patch.
    At multiples of the patch size (e.g. 224) the two agree.

    Args:
        in_channels: input channels.
        embed_dims: output channels.
        patch_size: patch size (int).
        norm_cfg: config of the norm after the conv (``None`` for none).
        pad_input: pad to a multiple of the patch (see above).
    """

    def __init__(self,
                 in_channels: int,
                 embed_dims: int,
                 patch_size: int,
                 norm_cfg: Optional[Mapping] = MappingProxyType(
                     {'type': 'LN'}),
                 pad_input: bool = True,
                 init_cfg: Optional[dict] = None) -> None:
        super().__init__(init_cfg=init_cfg)
        self.patch_size = patch_size
        self.pad_input = pad_input
        self.proj = nn.Conv2d(in_channels, embed_dims, patch_size,
                              stride=patch_size)
        self.norm = (build_norm_layer(dict(norm_cfg), embed_dims)[1]
                     if norm_cfg is not None else None)

    def forward(self, x: Tensor) -> Tuple[Tensor, Size2]:
        """``(B, Cin, H, W)`` -> tokens ``(B, H' * W', C)`` and ``(H', W')``:
        ``ceil(H / patch)`` with ``pad_input``, else ``max(1, floor(H /
        patch))`` (likewise ``W'``)."""
        x = self.proj(pad_for_stride(x, self.patch_size, self.pad_input))
        hw = (x.shape[2], x.shape[3])
        x = to_tokens(x)
        if self.norm is not None:
            x = self.norm(x)
        return x, hw


class PatchMerging(BaseModule):
    """Swin's 2x2 patch merging (downsample by 2, channels x2).

    The map is zero-padded to even size; the 2x2 neighbours are concatenated
    in the order ``x[0::2, 0::2], x[1::2, 0::2], x[0::2, 1::2],
    x[1::2, 1::2]``, then ``norm`` (LayerNorm(4C)) and ``reduction``
    (Linear(4C, 2C, bias=False)).

    Args:
        in_channels: ``C``.
        out_channels: defaults to ``2C``.
        norm_cfg: config of the norm on ``4C`` channels.
    """

    def __init__(self,
                 in_channels: int,
                 out_channels: Optional[int] = None,
                 norm_cfg: Optional[dict] = None,
                 init_cfg: Optional[dict] = None) -> None:
        norm_cfg = dict(type='LN') if norm_cfg is None else norm_cfg
        super().__init__(init_cfg=init_cfg)
        out_channels = out_channels or 2 * in_channels
        self.norm = build_norm_layer(norm_cfg, 4 * in_channels)[1]
        self.reduction = nn.Linear(4 * in_channels, out_channels, bias=False)

    def forward(self, x: Tensor, hw: Size2) -> Tuple[Tensor, Size2]:
        """``(B, H * W, C)`` -> ``(B, ceil(H/2) * ceil(W/2), 2C)`` and the
        new ``(H, W)``."""
        B, L, C = x.shape
        H, W = hw
        # the padded size written once, as twice the output size (under
        # torch.export a second form, H + H % 2 against the strided slices'
        # sizes, left guards its solver cannot prove)
        h, w = (H + 1) // 2, (W + 1) // 2
        x = pad_map(x.view(B, H, W, C), (0, 2 * h - H, 0, 2 * w - W))
        # (B, h, 2, w, 2, C) -> the 2x2 neighbours in the order
        # x[0::2, 0::2], x[1::2, 0::2], x[0::2, 1::2], x[1::2, 1::2]
        x = x.view(B, h, 2, w, 2, C).permute(0, 1, 3, 4, 2, 5)
        x = x.reshape(B, h * w, 4 * C)
        return self.reduction(self.norm(x)), (h, w)
