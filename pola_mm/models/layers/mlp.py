"""Transformer MLP with the authors' parameter names (``fc1``, ``fc2``)."""
from typing import Optional

import torch.nn as nn
from mmengine.model import BaseModule
from torch import Tensor

from ...ops import gelu_mlp
from .bricks import build_activation_layer


class Mlp(BaseModule):
    """``fc2(drop(act(fc1(x))))`` followed by dropout.

    With GELU and no dropout (every published model), the whole MLP is the
    op :func:`~pola_mm.ops.gelu_mlp` (in training it keeps only ``fc1(x)``
    for backward; in CPU inference it runs on runs of tokens).

    Args:
        in_features: input/output channels ``C``.
        hidden_features: hidden channels.
        act_cfg: activation config (default GELU).
        drop: dropout rate.
    """

    def __init__(self,
                 in_features: int,
                 hidden_features: int,
                 act_cfg: Optional[dict] = None,
                 drop: float = 0.,
                 init_cfg: Optional[dict] = None) -> None:
        act_cfg = dict(type='GELU') if act_cfg is None else act_cfg
        super().__init__(init_cfg=init_cfg)
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = build_activation_layer(act_cfg)
        self.fc2 = nn.Linear(hidden_features, in_features)
        self.drop = nn.Dropout(drop)
        self.gelu_fc2 = type(self.act) is nn.GELU and drop == 0

    def forward(self, x: Tensor) -> Tensor:
        """``(..., C)`` -> ``(..., C)``."""
        if self.gelu_fc2:
            return gelu_mlp(x, self.fc1, self.fc2, self.act.approximate)
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))
