"""Transformer MLP with the authors' parameter names (``fc1``, ``fc2``)."""
from typing import Optional

import torch.nn as nn
from mmengine.model import BaseModule
from torch import Tensor

from ...ops import dispatch
from ...ops.token_runs import mlp_in_runs
from .bricks import build_activation_layer


class Mlp(BaseModule):
    """``fc2(drop(act(fc1(x))))`` followed by dropout.

    Args:
        in_features: input/output channels ``C``.
        hidden_features: hidden channels.
        act_cfg: activation config (default GELU).
        drop: dropout rate.
    """

    def __init__(self,
                 in_features: int,
                 hidden_features: int,
                 act_cfg: dict = dict(type='GELU'),
                 drop: float = 0.,
                 init_cfg: Optional[dict] = None) -> None:
        super().__init__(init_cfg=init_cfg)
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = build_activation_layer(act_cfg)
        self.fc2 = nn.Linear(hidden_features, in_features)
        self.drop = nn.Dropout(drop)

    def forward(self, x: Tensor) -> Tensor:
        """``(..., C)`` -> ``(..., C)``.

        CPU training with GELU and no active dropout on large token maps
        runs on runs of tokens (:func:`~pola_mm.ops.token_runs.mlp_in_runs`,
        where :func:`~pola_mm.ops.dispatch.train_in_runs` holds: the hidden
        layer is never allocated whole); the result is the same.
        """
        if (type(self.act) is nn.GELU
                and (self.drop.p == 0 or not self.training)
                and dispatch.train_in_runs(x, self.fc1.out_features, self)):
            return mlp_in_runs(x, self.fc1, self.fc2, self.act.approximate)
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))
