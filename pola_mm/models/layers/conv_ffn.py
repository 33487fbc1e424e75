"""The feed-forward network of PolaFormer++ blocks: an MLP with a depth-wise
conv residual on its hidden map (the authors' ``FeedForwardNetwork``)."""
from typing import Optional

import torch.nn as nn
import torch.nn.functional as F
from mmengine.model import BaseModule
from torch import Tensor

from ...type_aliases import Size2
from .token_map import to_map, to_tokens

__all__ = ['ConvFFN']


class ConvFFN(BaseModule):
    """``fc1``, GELU, ``h + dwconv3x3(h)`` on the stage map, ``fc2``.

    Args:
        embed_dims: input/output channels ``C``.
        hidden_dims: hidden channels.
    """

    def __init__(self, embed_dims: int, hidden_dims: int,
                 init_cfg: Optional[dict] = None) -> None:
        super().__init__(init_cfg=init_cfg)
        self.fc1 = nn.Linear(embed_dims, hidden_dims)
        self.fc2 = nn.Linear(hidden_dims, embed_dims)
        self.dwconv = nn.Conv2d(hidden_dims, hidden_dims, 3, 1, 1,
                                groups=hidden_dims)

    def forward(self, x: Tensor, hw: Size2) -> Tensor:
        """``(B, N, C)`` tokens on the grid ``hw`` -> ``(B, N, C)``."""
        x = F.gelu(self.fc1(x))
        x = x + to_tokens(self.dwconv(to_map(x, hw)))
        return self.fc2(x)
