"""Convolutional patch embedding of PolaFormer++: the stride-4 stem and the
stride-2 downsampling between stages (the authors' ``PatchEmbed`` and
``PatchMerging``; the convolutional counterparts of :mod:`.embed`)."""
from typing import Optional

import torch.nn as nn
from mmengine.model import BaseModule
from torch import Tensor

__all__ = ['ConvStem', 'ConvDownsample']


class ConvStem(nn.Module):
    """Four 3x3 convs (strides 2, 1, 1, 2, padding 1) with BatchNorm, GELU
    between them; held as ``proj`` (the authors' ``patch_embed.proj.N``).

    ``(B, Cin, H, W)`` -> ``(B, C, ceil(ceil(H / 2) / 2), ...)``.

    Args:
        in_channels: ``Cin``.
        embed_dims: ``C`` (the first three convs have ``C / 2``).
    """

    def __init__(self, in_channels: int, embed_dims: int) -> None:
        super().__init__()
        c = embed_dims // 2
        self.proj = nn.Sequential(
            nn.Conv2d(in_channels, c, 3, 2, 1), nn.BatchNorm2d(c), nn.GELU(),
            nn.Conv2d(c, c, 3, 1, 1), nn.BatchNorm2d(c), nn.GELU(),
            nn.Conv2d(c, c, 3, 1, 1), nn.BatchNorm2d(c), nn.GELU(),
            nn.Conv2d(c, embed_dims, 3, 2, 1), nn.BatchNorm2d(embed_dims))

    def forward(self, x: Tensor) -> Tensor:
        """``(B, Cin, H, W)`` -> ``(B, C, H', W')``, stride 4."""
        return self.proj(x)


class ConvDownsample(BaseModule):
    """conv3x3 stride 2 (padding 1) then BatchNorm:
    ``(B, C, H, W)`` -> ``(B, C', ceil(H / 2), ceil(W / 2))``.

    Args:
        in_dims: ``C``.
        out_dims: ``C'``.
    """

    def __init__(self, in_dims: int, out_dims: int,
                 init_cfg: Optional[dict] = None) -> None:
        super().__init__(init_cfg=init_cfg)
        self.reduction = nn.Conv2d(in_dims, out_dims, 3, 2, 1)
        self.norm = nn.BatchNorm2d(out_dims)

    def forward(self, x: Tensor) -> Tensor:
        """``(B, C, H, W)`` -> ``(B, C', ceil(H / 2), ceil(W / 2))``."""
        return self.norm(self.reduction(x))
