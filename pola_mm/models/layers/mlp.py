"""Transformer MLP with the authors' parameter names (``fc1``, ``fc2``)."""
from typing import Optional

import torch
import torch.nn as nn
from mmcv.cnn import build_activation_layer
from mmengine.model import BaseModule
from torch import Tensor

from .token_runs import linear_out, mlp_in_runs, train_in_runs


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
        runs on runs of tokens (see
        :func:`~pola_mm.models.layers.token_runs.train_in_runs` and
        :func:`~pola_mm.models.layers.token_runs.mlp_in_runs`: the hidden
        layer is never allocated whole); the result is the same.
        """
        if (type(self.act) is nn.GELU
                and (self.drop.p == 0 or not self.training)
                and train_in_runs(x, self.fc1.out_features, self)):
            return mlp_in_runs(x, self.fc1, self.fc2, self.act.approximate)
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))

    def forward_into(self, x: Tensor, out: Tensor, hidden: Tensor) -> None:
        """Inference only (no autograd): ``fc2(act(fc1(x)))`` written into
        ``out``.

        ``hidden`` (at least ``(len(x), hidden_features)``) holds the hidden
        layer, so that a caller walking runs of tokens reuses one buffer
        instead of allocating (and page-faulting) a fresh one per run.
        Dropout is skipped (eval mode).

        Args:
            x: ``(T, C)``.
            out: ``(T, C)``.
            hidden: scratch of ``(>= T, hidden_features)``.
        """
        h = hidden[:x.shape[0]]
        linear_out(x, self.fc1.weight.t(), self.fc1.bias, h)
        if type(self.act) is nn.GELU:
            torch.ops.aten.gelu_(h, approximate=self.act.approximate)
        else:
            h = self.act(h)
        linear_out(h, self.fc2.weight.t(), self.fc2.bias, out)
